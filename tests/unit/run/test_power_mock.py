"""The power model (core/power.py) against cells with a known share of changed answers, run
end to end: the loopback mock changes a co-batched answer as the model states (a share
``cobatch_susceptible`` of prompts can change, each co-batched run of one with probability
``cobatch_flip``), the driver runs the cell, and the verdict decides. The share of cells that
come out RED must agree with the power the model gives each cell's own co-batched prompts and
runs (the mock's count: the last requests of a pass run alone), within three binomial standard
deviations; and it must disagree with the model that counts every run as an independent draw
where the runs of a prompt change together (the error a schedule of repetitions would be sold
on). The seeds are fixed, so the test is deterministic; the band says how far chance alone
would put the two apart."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

import pytest

from batch_invariance.core.power import PER_PROMPT, PER_RUN, Model, sample_power
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.verdict import decide
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.run.cell import run_cell
from batch_invariance.run.records import ServerHandle
from batch_invariance.scorer_api import ExactMatchScorer
from tests.unit.run.test_cell import ITEMS, POLICY, plan

#: Cells per model: the seeds 0..CELLS-1, each a cell of the 8 prompts x 2 passes.
CELLS = 50
PASSES = 2


@dataclass
class _Mock:
    """The mock, its ``--parallel 1`` reference without the per-token wait: one slot never
    co-batches, so its pace changes no answer, and half of each cell's time was that wait.
    The B/C server keeps the mock's pace, which decides what co-batches."""

    bc: MockLauncher
    a: MockLauncher
    source: Literal["mock"] = "mock"

    def launch(
        self, role: ServerRole, parallel: int, ctx: int
    ) -> AbstractContextManager[ServerHandle]:
        mock = self.a if role is ServerRole.A else self.bc
        return mock.launch(role, parallel, ctx)


@cache
def _measure(model: Model, rate: float) -> tuple[float, tuple[float, ...]]:
    """The share of cells that came out RED, and the power each cell's own sample had."""
    s, f = model.draw(rate)
    red = 0
    expected: list[float] = []
    for seed in range(CELLS):
        knobs = MockKnobs(cobatch_susceptible=s, cobatch_flip=f, seed=seed)
        quick = replace(knobs, token_delay_s=0.0, prompt_token_delay_s=0.0)
        launcher = _Mock(MockLauncher(knobs), MockLauncher(quick))
        run = run_cell(plan(gate_passes=PASSES), launcher, ExactMatchScorer())
        red += decide(run.evidence, POLICY).status == "failed"
        (bc,) = launcher.bc.servers
        truth = bc.stats  # the B/C server; B is serial
        prompts, runs = len(truth.cobatched_prompts), truth.cobatched
        expected.append(sample_power(prompts, runs, rate, model) if runs else 0.0)
    return red / CELLS, tuple(expected)


def _band(expected: tuple[float, ...]) -> float:
    return 3 * math.sqrt(sum(e * (1 - e) for e in expected)) / len(expected) + 1 / len(expected)


@pytest.mark.parametrize(("model", "rate"), [(PER_PROMPT, 0.1), (PER_RUN, 0.06)], ids=str)
def test_the_red_rate_of_mock_cells_is_the_models_power(model: Model, rate: float) -> None:
    measured, expected = _measure(model, rate)
    mean = sum(expected) / len(expected)
    assert 0.2 < mean < 0.9, "the cells are too sure either way to test anything"
    assert abs(measured - mean) <= _band(expected), (measured, mean)


def test_repetitions_of_a_prompt_are_not_independent_draws() -> None:
    # Prompts that change together: counting each co-batched run as its own draw overstates
    # the power, and the mock cells show it.
    measured, expected = _measure(PER_PROMPT, 0.1)
    overstated = sample_power(len(ITEMS), len(ITEMS) * PASSES, 0.1, PER_RUN)
    assert overstated - measured > _band(expected), (measured, overstated)
