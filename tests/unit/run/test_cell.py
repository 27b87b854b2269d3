"""run_cell / finish_cell end to end over the mock: each knob drives the verdict it should."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Literal

import pytest

from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.verify import verify
from batch_invariance.core.evidence import TRANSPORT_MODES, CellSpec, GatePolicy
from batch_invariance.core.plan import Measurement, WorkItem
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.verdict import Verdict, decide
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.cell import CellPlan, CellRun, run_cell
from batch_invariance.run.progress import Progress
from batch_invariance.run.records import ServerHandle
from batch_invariance.scorer_api import Completion, ExactMatchScorer, Score, Scorer
from batch_invariance.service.finish import finish_cell

QUESTIONS = (
    ("add", "What is 17 + 25?", "42"),
    ("mul", "What is 12 * 7?", "84"),
    ("sub", "What is 100 - 58?", "42"),
    ("fr", "What is the capital of France?", "Paris"),
    ("jp", "What is the capital of Japan?", "Tokyo"),
    ("code", "The secret code is ZX-9. What is the secret code?", "ZX-9"),
    ("rev", "Reverse the word planet.", "tenalp"),
    ("len", "How many letters in invariance?", "10"),
)
ITEMS = tuple(
    WorkItem(tid, prompt, None, expected, family=tid[:2]) if k % 2 else
    WorkItem(tid, None, (("user", prompt),), expected, family=tid[:2])
    for k, (tid, prompt, expected) in enumerate(QUESTIONS)
)  # fmt: skip
#: These cells test what the driver records, on 8 short answers: the per-prompt bound and the
#: answer-length floor (tested in test_verdict.py and test_run_mock.py) are opened wide here.
#: Such a policy is looser than the defaults, so a cert under it is never promotable.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0, min_slot_fill=0.0)


def plan(**kw: object) -> CellPlan:
    """A small plan; ``kw`` sets the plan's fields and its measurement's."""
    measured: dict[str, object] = {
        "gate_passes": 6,
        "n_predict": 16,
        "seed": 1,
        "req_timeout": 10.0,
    }
    base: dict[str, object] = {"items": ITEMS, "ctx": 512, "parallel": 4}
    names = {f.name for f in fields(Measurement)}
    measured.update((k, v) for k, v in kw.items() if k in names)
    base.update((k, v) for k, v in kw.items() if k not in names)
    return CellPlan(**base, measurement=Measurement(**measured))  # type: ignore[arg-type]


class CountingLauncher:
    """Wraps MockLauncher and records how many servers were up at once (a fake, not a patch)."""

    def __init__(self, knobs: MockKnobs) -> None:
        self.inner = MockLauncher(knobs)
        self.open = 0
        self.max_open = 0
        self.calls: list[tuple[str, int, int]] = []

    source: Literal["live", "mock"] = "mock"

    @contextmanager
    def launch(self, arm: ServerRole, parallel: int, ctx: int) -> Iterator[ServerHandle]:
        self.calls.append((arm, parallel, ctx))
        with self.inner.launch(arm, parallel, ctx) as handle:
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                yield handle
            finally:
                self.open -= 1


def cell(knobs: MockKnobs, scorer: Scorer | None = None, **kw: object) -> tuple[CellRun, Verdict]:
    run = run_cell(plan(**kw), MockLauncher(knobs), scorer or ExactMatchScorer())
    return run, decide(run.evidence, POLICY)


def test_green_on_a_batch_invariant_mock_and_what_the_run_records() -> None:
    launcher = CountingLauncher(MockKnobs())
    run = run_cell(plan(), launcher, ExactMatchScorer())
    verdict = decide(run.evidence, POLICY)
    assert verdict.status == "green", verdict.decision_reasons
    # One server at a time: A on --parallel 1, then B/C on --parallel N.
    assert launcher.calls == [("A", 1, 512), ("BC", 4, 512)]
    assert launcher.max_open == 1 and run.launches == 2
    ev = run.evidence
    ids = {i.test_id for i in ITEMS}
    assert set(ev.a) == set(ev.b) == ids
    # B reproduced A exactly on a second server instance, so A' decides nothing: skipped.
    assert ev.a_repeat is None
    assert run.schedule is not None and run.schedule.arms_run == ("A", "B", "C")
    assert str(run.schedule.serial_repeat).startswith("A' skipped: B")
    assert len(ev.c_passes) == 6 and all(set(p.trials) == ids for p in ev.c_passes)
    assert all(p.server_busy_max is not None and p.server_busy_max >= 2 for p in ev.c_passes)
    assert len({p.order for p in ev.c_passes}) > 1  # shuffled per pass
    t = ev.a["fr"]
    assert (t.score, t.passed, t.extracted_answer, t.failure_mode) == (1.0, True, "Paris", "ok")
    assert t.prompt_tokens_measured is not None and t.prompt_tokens_measured > 0
    assert t.content_sha256 is not None and len(t.content_sha256) == 64
    assert t.tokens == ("Paris",) and t.token_logprobs is not None and t.has_interval
    # Every arm records its token stream with pre-sampling logprobs and margins, bitwise
    # equal on this batch-invariant mock.
    assert t.top_margins is not None and all(m is not None for m in t.top_margins)
    for other in [ev.b["fr"], *(p.trials["fr"] for p in ev.c_passes)]:
        assert other.tokens == ("Paris",)
        assert other.token_logprobs == t.token_logprobs and other.top_margins == t.top_margins
    assert [s.role for s in run.servers] == ["A", "BC"]
    assert "--parallel" in run.servers[1].argv and run.kv_label.startswith("mock:")
    assert run.request_template["cache_prompt"] is False
    assert run.arm_wall_s("C") > 0 and run.server_ms().predicted_ms > 0
    prov = run.provenance()
    assert prov.server_launches == 2 and prov.timing is not None
    assert set(prov.timing["arm_wall_s"]) == {"A", "A_repeat", "B", "C"}


def test_red_on_cobatch_divergence() -> None:
    _, verdict = cell(MockKnobs(cobatch_divergence=True))
    assert verdict.status == "failed"
    assert verdict.divergence_class == "co_batching"  # B (serial on N slots) stayed clean
    assert verdict.reports.ac.n_divergent >= 1


def test_amber_on_token_only_divergence() -> None:
    run, verdict = cell(MockKnobs(token_divergence=True))
    assert verdict.status == "green_with_caveat", verdict.decision_reasons
    assert verdict.reports.ac.n_divergent == 0
    assert verdict.reports.ac.n_token_only >= 1
    assert run.evidence.a["fr"].invariant() == run.evidence.c_passes[0].trials["fr"].invariant()


def test_unverified_on_http_errors_under_load() -> None:
    run, verdict = cell(MockKnobs(http_error_min_busy=2))
    assert verdict.status == "green_unverified"
    modes = {t.failure_mode for p in run.evidence.c_passes for t in p.trials.values()}
    assert "http_error" in modes
    assert all(t.failure_mode == "ok" for t in run.evidence.a.values())


def test_unverified_on_hung_requests() -> None:
    knobs = MockKnobs(hang_if_contains=("secret code",), hang_s=0.6)
    run, verdict = cell(knobs, req_timeout=0.3, gate_passes=1)
    assert verdict.status == "green_unverified"
    assert run.evidence.a["code"].failure_mode == "timeout"
    assert run.evidence.a["code"].failure_mode in TRANSPORT_MODES
    assert any("transport" in r.lower() or "timeout" in r.lower() for r in verdict.decision_reasons)


def test_unverified_on_empty_completions() -> None:
    knobs = MockKnobs(empty_if_contains=("capital", "What is 1"))
    run, verdict = cell(knobs)
    assert verdict.status == "green_unverified"
    assert run.evidence.a["fr"].failure_mode == "empty"
    assert not verdict.gates.floor.ok


def test_parallel_one_behind_the_c_arm_is_unverified_never_green() -> None:
    run, verdict = cell(MockKnobs(bc_parallel_override=1))
    assert verdict.status == "green_unverified"
    assert not verdict.gates.overlap.ok
    assert all(p.server_busy_max == 1 for p in run.evidence.c_passes)


def test_stochastic_divergence_breaks_the_serial_repeat() -> None:
    launcher = CountingLauncher(MockKnobs(divergence_probability=0.3, seed=5))
    run = run_cell(plan(gate_passes=2), launcher, ExactMatchScorer())
    verdict = decide(run.evidence, POLICY)
    assert verdict.status != "green"
    assert not verdict.gates.serial_repeat.ok
    # B differed from A, so A' ran last, on a fresh --parallel 1 server, one at a time.
    assert launcher.calls == [("A", 1, 512), ("BC", 4, 512), ("A", 1, 512)]
    assert launcher.max_open == 1 and run.launches == 3
    assert [s.role for s in run.servers] == ["A", "BC", "A"]
    assert run.schedule is not None and run.schedule.arms_run == ("A", "A_repeat", "B", "C")
    assert str(run.schedule.serial_repeat).startswith("A' ran: B differed from A")
    assert run.evidence.a_repeat is not None
    # A' asks for pre-sampling top-2 like every arm.
    assert all(t.tokens is not None and t.token_logprobs is not None
               for t in run.evidence.a_repeat.values())  # fmt: skip


def test_a_server_that_dies_in_a_serial_arm_stops_the_run() -> None:
    launcher = CountingLauncher(MockKnobs(die_after_requests=3))
    with pytest.raises(InfraError, match=r"^run stopped in arm A, no cert written: mock server"):
        run_cell(plan(gate_passes=2), launcher, ExactMatchScorer())
    assert launcher.calls == [("A", 1, 512)]  # nothing else ran against the dead port
    assert launcher.inner.servers[0].stats.requests == 3


def test_a_server_that_dies_mid_pass_stops_the_run_at_once(tmp_path: Path) -> None:
    # A answers its 8, the B/C server its first pass (8) and 4 of the second, then dies.
    launcher = CountingLauncher(MockKnobs(die_after_requests=12))
    with pytest.raises(InfraError, match=r"^run stopped in arm C pass 2/6, no cert written"):
        run_cell(plan(gate_passes=6), launcher, ExactMatchScorer())
    assert launcher.calls == [("A", 1, 512), ("BC", 4, 512)]
    bc = launcher.inner.servers[1]
    assert bc.dead and bc.stats.requests <= 12 + 4  # no pass, no arm B after the death
    assert launcher.open == 0 and not list(tmp_path.iterdir())


def test_a_transient_failure_is_retried_once_in_a_serial_arm_never_in_a_pass() -> None:
    # Each server answers the France prompt HTTP 500 the first time it is asked.
    run, verdict = cell(MockKnobs(fail_once_if_contains=("France",)), gate_passes=2)
    ev = run.evidence
    first = ev.a["fr"]
    assert first.is_ok and first.extracted_answer == "Paris"
    assert first.first_attempt is not None and first.first_attempt.startswith(
        "http_error: HTTP 500"
    )
    assert all(t.first_attempt is None for k, t in ev.a.items() if k != "fr")
    # The B/C server met it first in the concurrent pass: recorded as it failed, not retried.
    assert ev.c_passes[0].trials["fr"].failure_mode == "http_error"
    assert ev.c_passes[0].trials["fr"].first_attempt is None
    assert ev.c_passes[1].trials["fr"].is_ok and ev.b["fr"].first_attempt is None
    assert verdict.status == "green_unverified"  # a transport failure in C: never GREEN
    assert any("fr: retried once after http_error" in n for n in run.notes)


def test_a_retried_trial_is_carried_by_the_cert_and_verifies(tmp_path: Path) -> None:
    run, _ = cell(MockKnobs(fail_once_if_contains=("Japan",)), gate_passes=2)
    spec = CellSpec(model="mock", ctx=512, dispatch_n=4, kv_label=run.kv_label, reps=1)
    done = finish_cell(run, spec, POLICY, Provenance(), tmp_path)
    evidence = json.loads(done.path.read_text())["evidence"]
    assert evidence["a"]["jp"]["first_attempt"].startswith("http_error: HTTP 500")
    assert "first_attempt" not in evidence["a"]["fr"]  # absent, not null, when not retried
    assert verify(done.path).valid


def test_no_serial_repeat_and_completions_endpoint() -> None:
    run, verdict = cell(MockKnobs(), serial_repeat=False, endpoint="completions")
    assert run.evidence.a_repeat is None
    assert verdict.status == "green"
    assert run.request_template["endpoint"] == "completions"


def test_every_arm_records_pre_sampling_logprobs_and_n_probs_sets_how_many() -> None:
    run, verdict = cell(MockKnobs(), n_probs=3)
    assert run.request_template["logprobs"] == {"logprobs": True, "top_logprobs": 3}
    assert set(run.request_template["logprobs_by_arm"].values()) == {"margins"}
    ev = run.evidence
    arms = [ev.a, ev.b, *(p.trials for p in ev.c_passes)]
    assert all(m["fr"].token_logprobs is not None and m["fr"].top_margins for m in arms)
    assert verdict.numerics.evidence.ok and verdict.status == "green"


def test_mock_numeric_drift_knob_gives_amber_latent_drift_with_equal_answers() -> None:
    _, verdict = cell(MockKnobs(numeric_drift=1e-4))
    assert verdict.status == "green_with_caveat" and verdict.anomaly == "latent_numeric_drift"
    assert verdict.reports.ac.n_token_only == 0 and verdict.reports.ac.clean
    assert verdict.numerics.ac.drift_ids and verdict.numerics.ab.drift_ids == ()
    assert any("no answer changed in this sample" in r for r in verdict.decision_reasons)


class RaisingScorer(Scorer):
    scorer_id = "raises"

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        if item.test_id == "fr":
            raise RuntimeError("cannot parse")
        return text.strip()

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        return "ok"

    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        return Score(1.0 if extracted == expected else 0.0, extracted == expected)


def test_scorer_that_raises_records_scorer_error_and_keeps_every_id() -> None:
    run, _ = cell(MockKnobs(), scorer=RaisingScorer(), gate_passes=1)
    ids = {i.test_id for i in ITEMS}
    for arm in (run.evidence.a, run.evidence.b, run.evidence.c_passes[0].trials):
        assert set(arm) == ids
        assert arm["fr"].failure_mode == "scorer_error"
        assert arm["jp"].failure_mode == "ok"
    assert any("scorer raised" in n and "cannot parse" in n for n in run.notes)
    assert run.scorer_id == "raises"


def test_bad_plans_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        run_cell(plan(items=()), MockLauncher(), ExactMatchScorer())
    with pytest.raises(UsageError):
        run_cell(plan(gate_passes=0), MockLauncher(), ExactMatchScorer())
    dup = (ITEMS[0], ITEMS[0])
    with pytest.raises(UsageError):
        run_cell(plan(items=dup), MockLauncher(), ExactMatchScorer())


def test_progress_is_a_line_per_arm_in_a_log_and_one_live_line_on_a_tty() -> None:
    log, loud = io.StringIO(), io.StringIO()
    run_cell(plan(gate_passes=1), MockLauncher(), ExactMatchScorer(), progress=Progress(log))
    lines = log.getvalue().splitlines()  # a StringIO is not a TTY: one line per arm and pass
    assert [line.split(":")[1] for line in lines] == [" arm A", " arm C pass 1/1", " arm B"]
    assert re.fullmatch(r"batch-invariance: arm B: 8 requests in \d+\.\d s, 0 of 8 differ from A",
                        lines[2])  # fmt: skip
    progress = Progress(loud, enabled=True, min_interval_s=0.0)
    run_cell(plan(gate_passes=2), MockLauncher(), ExactMatchScorer(), progress=progress)
    text = loud.getvalue()
    assert "arm A" in text and "arm B" in text and "arm C pass 2/2" in text
    assert f"{len(ITEMS) * 4}/{len(ITEMS) * 4}" in text and "ETA" in text


def test_finish_cell_writes_the_cert(tmp_path: Path) -> None:
    run = run_cell(plan(), MockLauncher(MockKnobs(cobatch_divergence=True)), ExactMatchScorer())
    spec = CellSpec(model="mock", ctx=512, dispatch_n=4, kv_label=run.kv_label, reps=1)
    done = finish_cell(run, spec, POLICY, Provenance(tool_version="test"), tmp_path)
    assert done.path == tmp_path / "mock__ctx512__N4.json"
    assert done.superseded is None
    data = json.loads(done.path.read_text())
    assert data["status"] == "failed" == done.verdict.status
    assert data["source"] == "mock"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["ts_utc"])
    assert data["provenance"]["request_template"]["cache_prompt"] is False
    assert data["provenance"]["tool_version"] == "test"
    again = finish_cell(run, spec, POLICY, Provenance(), tmp_path, ts_utc="2030-01-01T00:00:00Z")
    assert again.superseded is not None and again.superseded.exists()


def test_slot_notes_name_the_slots_that_answered_and_a_blind_sampler() -> None:
    from batch_invariance.run.cell import slot_notes
    from batch_invariance.run.dispatch import BusySample, ConcurrentPass
    from batch_invariance.run.trials import RawResponse

    def result(
        n_samples: int, slots: tuple[int | None, ...], answered: int | None = None
    ) -> ConcurrentPass:
        responses = {f"t{k}": RawResponse(f"t{k}", None, slot_id=s) for k, s in enumerate(slots)}
        n_answered = n_samples if answered is None else answered
        busy = BusySample(2, "slots", n_samples, n_answered, 2, None, ())
        return ConcurrentPass(3, responses, tuple(responses), 2, "slots", busy, 1.0)

    assert slot_notes(result(5, (1, 0, 1, None))) == ("C3: responses reported slots [0, 1]",)
    assert slot_notes(result(0, (None,))) == ("C3: the busy-slot sampler took no samples",)
    assert slot_notes(result(40, (None,), answered=3)) == (
        "C3: the server answered 3 of 40 busy reads (the rest failed or took over 10 s)",
    )
