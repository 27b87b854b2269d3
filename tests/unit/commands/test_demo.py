"""The demo's bundled work-set and defaults: a base model on the raw completions endpoint,
enough distinct prompts for a GREEN to be possible, answers long enough for the floor."""

from __future__ import annotations

import math

from batch_invariance.commands.demo import DEMO_DEFAULTS, DEMO_WORKSET
from batch_invariance.core.evidence import DEFAULT_MAX_BOUND, DEFAULT_MIN_ANSWER_TOKENS
from batch_invariance.core.plan import DEFAULT_GATE_PASSES, DEFAULT_REPS, duplicate_prompts
from batch_invariance.core.scope import required_length
from batch_invariance.profiles.ladder import LADDER, build_ladder
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.service.request import RUN_LIVE_DEFAULTS

#: The distinct prompts a GREEN needs: the rule-of-three bound 3/n must reach the max bound.
MIN_DISTINCT_PROMPTS = math.ceil(3 / DEFAULT_MAX_BOUND)
MIN_ANSWER_TOKENS = DEFAULT_MIN_ANSWER_TOKENS


def test_demo_measures_the_length_ladder_of_its_slot_on_the_completions_endpoint() -> None:
    assert DEMO_DEFAULTS.measurement.endpoint == "completions" and DEMO_WORKSET == LADDER
    assert DEMO_DEFAULTS.ctx is not None
    ctx, n_predict = DEMO_DEFAULTS.ctx, DEMO_DEFAULTS.measurement.n_predict
    items = build_ladder(ctx, n_predict, 0, approx_token_count)
    # A messages row would be sent to the chat endpoint, i.e. through a fallback template.
    assert all(i.messages is None and i.system is None and i.prompt for i in items)
    assert len({i.test_id for i in items}) == len(items) >= MIN_DISTINCT_PROMPTS
    assert not duplicate_prompts(items)
    # Sequences (prompt + answer budget) reach every quarter of the slot, the top past 3/4,
    # and none overflows it.
    sequences = [int(i.meta["calibrated_tokens"]) + n_predict for i in items]
    assert {min(4 * s // (ctx + 1), 3) for s in sequences} == {0, 1, 2, 3}
    assert max(sequences) >= required_length(ctx) and max(sequences) < ctx


def test_demo_answers_are_long_enough_for_the_floor() -> None:
    # 1.5x the floor: a median under it would make the cell unpromotable for length alone.
    assert DEMO_DEFAULTS.measurement.n_predict >= 96 >= 1.5 * MIN_ANSWER_TOKENS
    assert DEMO_DEFAULTS.parallel is not None and DEMO_DEFAULTS.parallel >= 2


def test_the_demo_runs_the_default_schedule() -> None:
    # One schedule for every entry point (docs/power.md): the demo differs in its cell (ctx,
    # endpoint, answer length), not in how many times it asks.
    m, live = DEMO_DEFAULTS.measurement, RUN_LIVE_DEFAULTS.measurement
    assert (m.reps, m.gate_passes, m.stop_on_red) == (live.reps, live.gate_passes, True)
    assert (m.reps, m.gate_passes) == (DEFAULT_REPS, DEFAULT_GATE_PASSES)
