"""The power model (core/power.py): checked against simulated cells with a known share of
changed runs, drawn exactly as the model states; its properties; and docs/power.md, whose
tables must be what the module computes for the defaults of the CLI, the demo and the Action."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_invariance.commands.demo import DEMO_DEFAULTS
from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.findings import Sensitivity
from batch_invariance.core.power import (
    PER_PROMPT,
    PER_RUN,
    Model,
    Schedule,
    drift_power,
    latent,
    min_detectable,
    miss_probability,
    power,
    power_table,
    power_text,
    power_words,
    sample_miss,
)
from batch_invariance.profiles.ladder import LADDER_PROMPTS
from batch_invariance.report.numerics_view import power_lines
from batch_invariance.service.request import ACTION_DEFAULTS, RUN_LIVE_DEFAULTS, SWEEP_DEFAULTS

DOC = Path(__file__).resolve().parents[3] / "docs" / "power.md"
FAST = settings(max_examples=80, deadline=None)

# --------------------------------------------------------------------------- simulation

SIMULATIONS = 2000
SIM_SCHEDULES = (Schedule(8, 1, 2), Schedule(12, 2, 2))
SIM_RATES = (0.01, 0.03, 0.1)


def _observes(schedule: Schedule, rate: float, model: Model, rng: random.Random) -> bool:
    """One simulated cell measured by ``schedule``: A's answers are the reference, each C pass
    answers every repetition of every prompt, changed as the model states; whether any C
    answer differs from A's."""
    a = {(i, r): "a" for i in range(schedule.prompts) for r in range(schedule.reps)}
    if model.flip is None:  # per run: every run changes on its own at the rate
        susceptible = dict.fromkeys(range(schedule.prompts), True)
        flip = rate
    else:  # a share rate / flip of prompts can change, each run of one with the flip
        susceptible = {i: rng.random() < rate / model.flip for i in range(schedule.prompts)}
        flip = model.flip
    for _ in range(schedule.passes):
        c = {key: "b" if susceptible[key[0]] and rng.random() < flip else "a" for key in a}
        if any(c[key] != a[key] for key in a):
            return True
    return False


@pytest.mark.parametrize("model", [PER_PROMPT, PER_RUN, latent(0.5)], ids=lambda m: m.name)
@pytest.mark.parametrize("schedule", SIM_SCHEDULES, ids=str)
def test_the_detection_rate_of_simulated_cells_matches_the_model(
    schedule: Schedule, model: Model
) -> None:
    rng = random.Random(f"{schedule}:{model.name}")
    for rate in SIM_RATES:
        expected = power(schedule, rate, model)
        caught = sum(_observes(schedule, rate, model, rng) for _ in range(SIMULATIONS))
        band = 3 * math.sqrt(expected * (1 - expected) / SIMULATIONS) + 1 / SIMULATIONS
        assert abs(caught / SIMULATIONS - expected) <= band, (schedule, model, rate, caught)


# --------------------------------------------------------------------------- closed forms


def test_the_named_models_have_their_closed_forms() -> None:
    s = Schedule(32, 3, 8)
    assert power(s, 0.01, PER_PROMPT) == pytest.approx(1 - 0.99**32)
    assert power(s, 0.01, PER_RUN) == pytest.approx(1 - 0.99**768)
    assert min_detectable(s, PER_PROMPT) == pytest.approx(1 - 0.05 ** (1 / 32), abs=1e-9)
    assert min_detectable(s, PER_RUN) == pytest.approx(1 - 0.05 ** (1 / 768), abs=1e-9)
    # The GREEN's rule-of-three bound sits just above the per-prompt model's 95% share.
    share = min_detectable(s)
    assert share is not None and share == pytest.approx(0.0894, abs=1e-4) and share < 3 / 32


def test_drift_is_the_same_count_over_rows() -> None:
    s = Schedule(16, 2, 3)
    for model in (PER_PROMPT, PER_RUN, latent(0.7)):
        assert drift_power(s, 0.04, model) == power(s, 0.04, model)


def test_a_flip_gives_at_most_its_own_share_and_may_never_reach_the_target() -> None:
    with pytest.raises(ValueError, match="at most"):
        power(Schedule(4), 0.5, latent(0.2))
    # Every prompt susceptible, 2 runs of a flip of 0.01 each: far below 0.95.
    assert min_detectable(Schedule(1, 1, 2), latent(0.01)) is None


@pytest.mark.parametrize(
    "bad", [dict(prompts=0), dict(reps=0), dict(passes=0), dict(parallel=1)], ids=str
)
def test_a_schedule_needs_a_prompt_a_run_and_two_slots(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="not a schedule"):
        replace(Schedule(4), **bad)


def test_bad_rates_and_flips_are_refused() -> None:
    with pytest.raises(ValueError):
        miss_probability(4, 2, 1.5, 0.5)
    with pytest.raises(ValueError):
        Model("none", 0.0)
    with pytest.raises(ValueError):
        min_detectable(Schedule(4), target=1.0)


def test_the_power_never_reads_as_a_certainty_it_is_not() -> None:
    assert power_text(1 - 0.2750) == "0.28"
    assert power_text(1e-35) == ">0.99"
    assert power_text(0.0) == "1.00"
    assert power_text(1.0) == "0.00"
    assert power_text(0.999) == "<0.01"


# --------------------------------------------------------------------------- properties

rates = st.floats(0.0, 1.0, allow_nan=False)
counts = st.integers(1, 40)
flips = st.floats(0.05, 1.0, allow_nan=False)


def _models(flip: float) -> tuple[Model, ...]:
    return (PER_PROMPT, PER_RUN, latent(flip))


@FAST
@given(counts, counts, counts, rates, rates, flips)
def test_power_grows_with_the_share(
    prompts: int, reps: int, passes: int, a: float, b: float, flip: float
) -> None:
    s = Schedule(prompts, reps, passes)
    low, high = sorted((a * flip, b * flip))  # shares every model here can give
    for model in _models(flip):
        assert power(s, low, model) <= power(s, high, model) + 1e-12


@FAST
@given(counts, counts, counts, st.integers(0, 40), st.floats(0.0, 0.05), flips)
def test_power_grows_with_prompts_and_passes_and_reps(
    prompts: int, reps: int, passes: int, more: int, rate: float, flip: float
) -> None:
    s = Schedule(prompts, reps, passes)
    for model in _models(flip):
        base = power(s, rate, model)
        for bigger in (
            replace(s, prompts=prompts + more),
            replace(s, passes=passes + more),
            replace(s, reps=reps + more),
        ):
            assert base <= power(bigger, rate, model) + 1e-12


@FAST
@given(counts, counts, counts, rates)
def test_repetitions_and_passes_of_one_prompt_are_one_draw_per_prompt(
    prompts: int, reps: int, passes: int, rate: float
) -> None:
    one = power(Schedule(prompts), rate, PER_PROMPT)
    assert power(Schedule(prompts, reps, passes), rate, PER_PROMPT) == one
    assert power(Schedule(1, reps, passes), rate, PER_PROMPT) == power(Schedule(1), rate)


@FAST
@given(counts, counts, counts, st.floats(0.0, 1.0), flips)
def test_every_latent_model_lies_between_per_run_and_per_prompt(
    prompts: int, reps: int, passes: int, share: float, flip: float
) -> None:
    s = Schedule(prompts, reps, passes)
    rate = share * flip
    best, worst = (power(s, rate, m) for m in (PER_RUN, PER_PROMPT))
    assert worst - 1e-12 <= power(s, rate, latent(flip)) <= best + 1e-12


@FAST
@given(counts, counts, counts, flips)
def test_the_smallest_share_caught_is_caught_and_no_smaller_one_is(
    prompts: int, reps: int, passes: int, flip: float
) -> None:
    s = Schedule(prompts, reps, passes)
    for model in _models(flip):
        share = min_detectable(s, model)
        if share is None:
            assert power(s, model.max_rate, model) < 0.95
            continue
        assert power(s, share, model) >= 0.95
        assert power(s, max(share - 1e-9, 0.0), model) < 0.95


@FAST
@given(st.integers(1, 30), st.integers(1, 8), rates)
def test_the_same_requests_over_more_prompts_catch_at_least_as_much(
    prompts: int, split: int, share: float
) -> None:
    """``split`` distinct prompts in place of ``split`` repetitions of one, at equal cost."""
    flip = 0.6
    rate = share * flip
    reps = Schedule(prompts, split, 2)
    distinct = Schedule(prompts * split, 1, 2)
    for model in _models(flip):
        assert power(reps, rate, model) <= power(distinct, rate, model) + 1e-12


# --------------------------------------------------------------------------- words, views


def test_the_words_of_a_sample() -> None:
    assert power_words(32, 64) == (
        "32 distinct prompts and 64 co-batched runs catch a cell that changes 1 answer (or "
        "drifts 1 row) in 100 with probability 0.28 (3 in 100: 0.62; 10 in 100: 0.97) if a "
        "prompt's runs change together, 0.47 (0.86; >0.99) if each run changes on its own"
    )
    # A cert's co-batched runs need not be a multiple of its prompts.
    assert sample_miss(30, 61, 0.02, PER_RUN) == pytest.approx(0.98**61)


def _sensitivity(divergent: int, distinct: int = 32, hot: int = 64) -> Sensitivity:
    return Sensitivity(hot, hot, divergent, divergent, distinct, None, None, None, None, None)


def test_the_views_say_the_power_only_where_no_answer_changed() -> None:
    assert power_lines(_sensitivity(0)) == [f"power: {power_words(32, 64)}"]
    assert power_lines(_sensitivity(3)) == []
    assert power_lines(_sensitivity(0, distinct=0, hot=0)) == []


# --------------------------------------------------------------------------- the doc


#: The defaults before issue 42 (run-live, sweep and the Action): 32 ladder prompts x 3
#: repetitions x 8 passes. A fixed row of the doc, the figure the new defaults are read against.
BEFORE = Schedule(LADDER_PROMPTS, 3, 8)


def _defaults() -> list[tuple[str, Schedule]]:
    """The schedules docs/power.md states, named from the defaults themselves."""
    m = ACTION_DEFAULTS.measurement
    for other in (RUN_LIVE_DEFAULTS, SWEEP_DEFAULTS, DEMO_DEFAULTS):
        assert (other.measurement.reps, other.measurement.gate_passes) == (m.reps, m.gate_passes)
    n = ACTION_DEFAULTS.parallel
    assert n is not None and DEMO_DEFAULTS.parallel == n
    now = Schedule(LADDER_PROMPTS, m.reps, m.gate_passes, n)
    rows = [
        ("the defaults (`run-live`, `sweep`, `demo`, the Action)", now),
        ("before issue 42", replace(BEFORE, parallel=n)),
        ("", Schedule(now.runs, 1, 1, n)),
        ("", Schedule(BEFORE.runs // BEFORE.passes, 1, BEFORE.passes, n)),
    ]
    return [
        (
            f"{name}{': ' if name else ''}{s.prompts} prompts x {s.reps} "
            f"rep{'s' if s.reps > 1 else ''} x {s.passes} pass{'es' if s.passes > 1 else ''}, "
            f"N {s.parallel}",
            s,
        )
        for name, s in rows
    ]


def test_the_default_schedule_can_meet_the_green_sample_rules() -> None:
    """Cheaper defaults never loosen a GREEN: the ladder's distinct prompts still reach the
    rule-of-three bound, and the co-batched comparisons the sample gate counts leave room for
    prompts that were not co-batched (F3 asks 80 % of a pass)."""
    m, policy = RUN_LIVE_DEFAULTS.measurement, GatePolicy()
    assert policy.max_bound >= 3 / LADDER_PROMPTS
    least_hot = math.ceil(policy.coverage_fraction * LADDER_PROMPTS * m.reps) * m.gate_passes
    assert least_hot >= policy.min_hot_trials
    assert m.stop_on_red  # the passes end once the verdict cannot change


def test_the_doc_states_what_the_module_computes_for_the_defaults() -> None:
    doc = DOC.read_text(encoding="utf-8").splitlines()
    tables = (
        power_table(_defaults()),
        power_table(_defaults(), (latent(0.6), latent(0.8))),
    )
    for table in tables:
        start = doc.index(table[0])  # the header, then every row in order
        assert doc[start : start + len(table)] == table
    assert f"    power: {power_words(32, 64)}" in doc
