"""The prompt-cache arm driven end to end over the loopback mock (its cache-drift knobs), the
request it sends, the servers it starts, and the work-set shape that makes reuse happen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.core.cache_arm import PREAMBLE, cache_shaped, conversation_chains
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.plan import CellPlan, Measurement, rep_id
from batch_invariance.core.schedule import sample_size
from batch_invariance.core.scoring import ExactMatchScorer
from batch_invariance.core.verdict import CLASS_CACHE, CLASS_CACHE_DRIFT, decide
from batch_invariance.engines.base import LaunchRequest, PromptCache
from batch_invariance.engines.llama_server.engine import build_argv
from batch_invariance.engines.vllm import VllmEngine
from batch_invariance.mock.knobs import MockKnobs
from batch_invariance.mock.launcher import MockLauncher
from batch_invariance.run.cell import run_cell
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.workset import bundled_workset_path, load_workset

MOCK_ITEMS = load_workset(bundled_workset_path("mock")).items
#: The mock's 40 rows in the prompt-cache shape: 14 conversations of up to 3 turns.
SHAPED = cache_shaped(MOCK_ITEMS, 3)
#: The slot these conversations fill: their longest turn (about 210 tokens with its
#: preamble) plus the mock's answer reaches 3/4 of it, as the sequence-scope rule asks.
SLOT = 320


def fast(**knobs: Any) -> MockKnobs:
    """The mock at a fifth of its default per-token times: these cells send 40 long,
    preamble-sharing prompts through four arms, and nothing here reads how long they took."""
    return MockKnobs(token_delay_s=0.0001, prompt_token_delay_s=0.0002, **knobs)


def run(knobs: MockKnobs, items: tuple = SHAPED, cache_passes: int = 1):  # type: ignore[type-arg]
    plan = CellPlan(
        items=items,
        ctx=SLOT,
        parallel=4,
        measurement=Measurement(
            gate_passes=2,
            n_predict=128,
            endpoint="chat",
            req_timeout=30.0,
            cache_passes=cache_passes,
        ),
    )
    launcher = MockLauncher(knobs)
    cell = run_cell(plan, launcher, ExactMatchScorer())
    return cell, decide(cell.evidence, GatePolicy()), launcher


def test_shape_shares_a_preamble_and_later_turns_extend_earlier_ones() -> None:
    shaped = cache_shaped(MOCK_ITEMS[:6], 3)
    assert [i.meta["turn"] for i in shaped] == [1, 1, 2, 2, 3, 3]  # turn-major
    # Row 3 on carries messages: that conversation is a chat one, the preamble its system.
    assert all((i.prompt or "").startswith(PREAMBLE) for i in shaped if i.meta["conversation"] == 0)
    chats = [i for i in shaped if i.meta["conversation"] == 1]
    assert all(i.messages and i.messages[0] == ("system", PREAMBLE) for i in chats)
    assert chats[1].messages[: len(chats[0].messages)] == chats[0].messages  # type: ignore[index]
    first, second = shaped[0], shaped[2]
    assert first.meta["conversation"] == second.meta["conversation"] == 0
    assert (second.prompt or "").startswith(first.prompt or "")
    assert {i.test_id for i in shaped} == {i.test_id for i in MOCK_ITEMS[:6]}
    assert [i.expected_answer for i in shaped if i.test_id == MOCK_ITEMS[1].test_id] == [
        MOCK_ITEMS[1].expected_answer
    ]


def test_chains_are_conversations_per_repetition_in_turn_order() -> None:
    shaped = cache_shaped(MOCK_ITEMS[:6], 3)  # turn-major: c0t1 c1t1 c0t2 c1t2 c0t3 c1t3
    ids = [i.test_id for i in shaped]
    assert conversation_chains(shaped) == ((ids[0], ids[2], ids[4]), (ids[1], ids[3], ids[5]))
    # Repetitions of a conversation are conversations of their own; plain rows chains of one.
    reps = tuple(i.with_id(rep_id(i.test_id, k)) for i in shaped[:4] for k in range(2))
    assert conversation_chains(reps) == (
        (rep_id(ids[0], 0), rep_id(ids[2], 0)), (rep_id(ids[0], 1), rep_id(ids[2], 1)),
        (rep_id(ids[1], 0), rep_id(ids[3], 0)), (rep_id(ids[1], 1), rep_id(ids[3], 1)),
    )  # fmt: skip
    assert conversation_chains(MOCK_ITEMS[:3]) == tuple((i.test_id,) for i in MOCK_ITEMS[:3])


def test_bundled_cache_workset_is_the_shape_of_the_demo_openings() -> None:
    bundled = json.loads(Path(bundled_workset_path("cache_conversations")).read_text())
    demo = load_workset(bundled_workset_path("demo_completions")).items[:16]
    assert [r["prompt"] for r in bundled] == [i.prompt for i in cache_shaped(demo, 4)]


def test_cache_arm_requests_leave_cache_prompt_out_and_every_other_arm_turns_it_off() -> None:
    template = RequestTemplate(endpoint="completions", n_predict=8, seed=0)
    assert template.body_for(SHAPED[0])["cache_prompt"] is False
    assert "cache_prompt" not in template.as_deployed().body_for(SHAPED[0])


def test_the_cache_arms_server_runs_the_cache_as_deployed() -> None:
    cold = build_argv(Path("s"), Path("m"), host="h", port=1, parallel=4, ctx=512)
    default = build_argv(Path("s"), Path("m"), host="h", port=1, parallel=4, ctx=512,
                         prompt_cache=PromptCache())  # fmt: skip
    sized = build_argv(Path("s"), Path("m"), host="h", port=1, parallel=4, ctx=512,
                       prompt_cache=PromptCache(512))  # fmt: skip
    assert "--cache-ram" in cold and cold[cold.index("--cache-ram") + 1] == "0"
    assert "--cache-ram" not in default
    assert sized[sized.index("--cache-ram") + 1] == "512"
    request = LaunchRequest(Path("py"), Path("m"), 4, 512, "h", 1, prompt_cache=PromptCache())
    argv = VllmEngine().launch_command(request).argv
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv


def test_clean_cache_on_the_mock_is_measured_with_proven_reuse() -> None:
    cell, verdict, launcher = run(fast())
    assert launcher.launches == 3  # A, B/C and the cache arm's own server
    assert launcher.servers[-1].prompt_cache and not launcher.servers[1].prompt_cache
    assert verdict.prompt_cache is not None
    assert verdict.prompt_cache.status == "clean", verdict.prompt_cache.reason
    assert verdict.prompt_cache.reuse.ok and verdict.prompt_cache.reuse.n_reused >= 20
    assert verdict.status == "green", verdict.decision_reasons
    # The cold arms stayed cold: the prompt_cache gate (cache_n == 0) holds for them.
    assert verdict.gates.prompt_cache.ok
    roles = [s.role for s in cell.servers]
    assert roles[-1] == "cache"


def test_cache_drift_knob_gives_amber_prompt_cache_drift() -> None:
    _, verdict, _ = run(fast(cache_numeric_drift=1e-3))
    assert verdict.status == "green_with_caveat"
    assert verdict.divergence_class == CLASS_CACHE_DRIFT


def test_cache_changing_an_answer_gives_red_prompt_cache() -> None:
    _, verdict, _ = run(fast(cache_divergence_if_contains=("17 + 25",)))
    assert verdict.status == "failed"
    assert verdict.divergence_class == CLASS_CACHE
    assert verdict.prompt_cache is not None
    # Conversation 0 carries "17 + 25" in every turn; only answers served from the cache move.
    changed = set(verdict.prompt_cache.cache_only_divergent_ids)
    assert changed and changed <= {"arith-add-1", "arith-mul-1", "arith-sub-1"}
    assert "arith-sub-1" in changed  # its third turn always reuses its own earlier turns


def test_a_work_set_without_shared_prompts_is_unverified_for_the_cache() -> None:
    _, verdict, _ = run(fast(), items=MOCK_ITEMS)
    assert verdict.prompt_cache is not None and verdict.prompt_cache.status == "unverified"
    assert verdict.status == "green_unverified"
    assert any("--cache-shape" in r for r in verdict.decision_reasons)


@pytest.mark.parametrize("passes", [0])
def test_without_the_arm_nothing_changes(passes: int) -> None:
    cell, verdict, launcher = run(fast(), cache_passes=passes)
    assert launcher.launches == 2 and cell.evidence.cache_passes is None
    assert verdict.prompt_cache is None


def test_b_on_a_seeded_sample_pays_for_the_cache_arm_when_c_equals_a_bitwise() -> None:
    plan = CellPlan(
        items=SHAPED,
        ctx=SLOT,
        parallel=4,
        b_sample=True,
        measurement=Measurement(
            gate_passes=2, n_predict=128, endpoint="chat", req_timeout=30.0, cache_passes=1
        ),
    )
    cell = run_cell(plan, MockLauncher(fast()), ExactMatchScorer())
    verdict = decide(cell.evidence, GatePolicy())
    assert cell.evidence.b_ids is not None and len(cell.evidence.b_ids) == sample_size(40) == 10
    assert len(cell.evidence.b) == 10
    assert verdict.gates.b_scope.ok and "sample of 10 of 40" in verdict.gates.b_scope.reason
    assert verdict.status == "green", verdict.decision_reasons
    assert cell.schedule is not None and "seeded sample" in (cell.schedule.b_reason or "")


def test_b_sample_is_never_taken_when_co_batching_moved_the_numerics() -> None:
    plan = CellPlan(
        items=SHAPED,
        ctx=SLOT,
        parallel=4,
        b_sample=True,
        measurement=Measurement(
            gate_passes=1, n_predict=128, endpoint="chat", req_timeout=30.0, cache_passes=1
        ),
    )
    cell = run_cell(plan, MockLauncher(fast(numeric_drift=1e-4)), ExactMatchScorer())
    assert cell.evidence.b_ids is None and len(cell.evidence.b) == 40
