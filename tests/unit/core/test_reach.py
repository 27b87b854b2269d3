"""A plan that cannot reach GREEN whatever the server does, named per cause with its fix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.reach import PlanFacts, filled_ctx, min_distinct_prompts, unreachable
from batch_invariance.core.scope import required_length

#: A plan that can reach GREEN: the ladder's 32 prompts, long enough answers, completions,
#: sequences filling the slot.
OK = PlanFacts(
    ctx=2048, n_predict=128, endpoint="completions", policy=GatePolicy(), distinct_prompts=32,
    longest_prompt_estimate=1800, model_has_chat_template=False,
)  # fmt: skip


def test_a_plan_that_can_pass_has_no_cause() -> None:
    assert unreachable(OK) == ()
    unknown = PlanFacts(ctx=2048, n_predict=128, endpoint="chat", policy=GatePolicy())
    assert unreachable(unknown) == ()  # nothing known yet is no refusal (a profile's plan)


def test_the_fewest_prompts_follow_the_bound() -> None:
    assert min_distinct_prompts(GatePolicy()) == 30
    assert min_distinct_prompts(GatePolicy(max_bound=0.05)) == 60
    assert unreachable(replace(OK, distinct_prompts=30)) == ()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"distinct_prompts": 16}, "too few distinct prompts: 16 give a 95% bound of 3/16 = "
         "0.19 even if none diverges, above --max-bound 0.1; give at least 30"),
        ({"distinct_prompts": 0}, "too few distinct prompts: 0 give no bound"),
        ({"n_predict": 16}, "answer budget under the length gate: --n-predict 16 caps every "
         "answer below the 64-token median a GREEN needs; set --n-predict 64 or more"),
        ({"endpoint": "chat"}, "a base model on the chat endpoint: the model has no chat "
         "template"),
        ({"longest_prompt_estimate": 12}, "a slot the work-set cannot fill: its longest prompt "
         "(~12 tokens, estimated) plus --n-predict 128 reaches ~140 of the 1536 tokens (3/4 "
         "of --ctx 2048) a GREEN needs; leave out --workset to measure the length ladder, give "
         "longer prompts, or use --ctx 186 or less"),
    ],
)  # fmt: skip
def test_each_cause_is_one_line_with_its_fix(change: dict[str, object], words: str) -> None:
    (line,) = unreachable(replace(OK, **change))  # type: ignore[arg-type]
    assert line.startswith(words), line
    assert "\n" not in line


def test_a_chat_model_on_chat_and_an_estimate_a_little_short_pass() -> None:
    assert unreachable(replace(OK, endpoint="chat", model_has_chat_template=True)) == ()
    assert unreachable(replace(OK, endpoint="chat", model_has_chat_template=None)) == ()
    # 1536 needed; 1300 + 128 = 1428 is within the estimate's margin.
    assert unreachable(replace(OK, longest_prompt_estimate=1300)) == ()


def test_every_cause_at_once() -> None:
    worst = replace(OK, distinct_prompts=4, n_predict=8, endpoint="chat",
                    longest_prompt_estimate=3)  # fmt: skip
    assert len(unreachable(worst)) == 4


@pytest.mark.parametrize("step", [1, 256])
@pytest.mark.parametrize("ctx", [512, 1024, 2048, 8192])
def test_the_smaller_ctx_a_refusal_names_is_taken_and_filled(step: int, ctx: int) -> None:
    """Following the fix ends the refusal: the --ctx named is a multiple of what the engine
    takes, the work-set fills it, and it is the largest such; where no size the engine takes
    is filled the line names none (llama-server once got 174, then 174 again at 256)."""
    for longest in range(0, ctx, 7):
        facts = replace(OK, ctx=ctx, longest_prompt_estimate=longest, ctx_multiple=step)
        (line,) = unreachable(facts) or ("",)
        if not line:
            continue
        fits = filled_ctx(longest + OK.n_predict, None, step)
        if fits is None:
            assert "or less" not in line and f"the smallest, {step}, needs" in line
            assert required_length(step) > longest + OK.n_predict
            continue
        assert line.endswith(f"or use --ctx {fits} or less"), line
        assert fits % step == 0 and fits < ctx
        assert unreachable(replace(facts, ctx=fits)) == ()
        assert required_length(fits + step) > longest + OK.n_predict  # the largest


def test_the_filled_ctx_of_the_issue() -> None:
    """131 tokens fill a 174-token slot, but no slot llama-server takes (256 needs 192)."""
    assert filled_ctx(131) == 174 and filled_ctx(131, None, 256) is None
    assert filled_ctx(192, None, 256) == 256 and filled_ctx(405, 0.75, 256) == 512
    assert filled_ctx(100, 0.0) is None
