"""What ends the C passes early (docs/output-contract.md, ``provenance.schedule``; docs/power.md):
only a pass that proves RED. A clean pass never does, and neither does a pass whose logprobs
drift with no answer changed: the cell is no longer GREEN, but a later pass could still make it
RED. Run through the driver on the loopback mock, with stop-on-red on as every default has it."""

from __future__ import annotations

import io
import re

from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import Progress
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.service.request import RUN_LIVE_DEFAULTS
from tests.unit.run.test_cell import cell, plan

#: 8 prompts x 4 passes: 32 co-batched comparisons, enough for the sample gate.
PASSES = 4


def _schedule(knobs: MockKnobs) -> tuple[str, int, bool | None]:
    run, verdict = cell(knobs, gate_passes=PASSES, stop_on_red=True)
    assert run.schedule is not None and run.schedule.passes_planned == PASSES
    assert run.schedule.passes_run == len(run.evidence.c_passes)
    return verdict.status, len(run.evidence.c_passes), run.schedule.stopped_early


def test_every_default_ends_the_passes_at_red() -> None:
    assert RUN_LIVE_DEFAULTS.measurement.stop_on_red


def test_a_red_pass_ends_the_passes() -> None:
    assert _schedule(MockKnobs(cobatch_divergence=True)) == ("failed", 1, True)


def test_a_clean_pass_never_ends_them() -> None:
    assert _schedule(MockKnobs()) == ("green", PASSES, False)


def test_a_pass_that_drifts_without_a_changed_answer_does_not_end_them() -> None:
    # Not GREEN from the first pass on (F4), yet every pass runs: a later one could change an
    # answer, and the cell would be RED.
    status, passes, stopped = _schedule(MockKnobs(numeric_drift=1e-3))
    assert (status, passes, stopped) == ("green_with_caveat", PASSES, False)


def test_a_drifting_cell_whose_answers_change_later_is_red() -> None:
    # Every co-batched row drifts from pass 1 on; answers change at random, so in some seeds
    # no answer changes in the first pass and one does in a later pass: that cell must end
    # RED, not stop at its drifting first pass.
    late = 0
    for seed in range(10):
        knobs = MockKnobs(numeric_drift=1e-3, cobatch_flip=0.04, seed=seed)
        status, passes, stopped = _schedule(knobs)
        if status == "failed":
            late += passes > 1
        else:
            assert (passes, stopped) == (PASSES, False)
    assert late >= 1, "no seed changed its first answer after pass 1: the test proves nothing"


def test_the_progress_line_shows_drift_as_it_is_seen() -> None:
    # Drift is the early detector: the first pass already says the rows moved, though no
    # answer did.
    log = io.StringIO()
    run_cell(
        plan(gate_passes=2, stop_on_red=True),
        MockLauncher(MockKnobs(numeric_drift=1e-3)),
        ExactMatchScorer(),
        progress=Progress(log),
    )
    first = next(line for line in log.getvalue().splitlines() if "arm C pass 1/2" in line)
    # (The mock drifts the co-batched rows only; a pass's last request may run alone.)
    assert re.search(r"0 of 8 differ from A so far, [1-8] of 8 drift from A bitwise so far", first)
    clean = io.StringIO()
    run_cell(plan(gate_passes=1), MockLauncher(), ExactMatchScorer(), progress=Progress(clean))
    assert "drift" not in clean.getvalue()
