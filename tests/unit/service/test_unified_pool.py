"""A unified KV pool measured end to end over the loopback mock: the ladder's long rungs reach
past 3/4 of the pool, the one-slot A server holds the whole pool, every pass keeps the KV in
flight within the pool, and the long rows are co-batched (hot) with the witness at 2 or more."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.evidence import CellSpec, GatePolicy, Trial
from batch_invariance.core.kv_budget import kv_costs
from batch_invariance.core.plan import CellPlan, Measurement
from batch_invariance.core.sample import hot_trials
from batch_invariance.core.scope import required_length
from batch_invariance.errors import UsageError
from batch_invariance.mock import MockKnobs, MockLauncher
from batch_invariance.profiles.ladder import POOL_RUNGS, build_ladder, pool_ladder_problem
from batch_invariance.run.cell import run_cell
from batch_invariance.scorer_api import ExactMatchScorer
from batch_invariance.service.finish import finish_cell
from batch_invariance.service.mock_cell import mock_token_count
from tests.support.held import peak_held

CTX, N, N_PREDICT = 512, 2, 16
POOL = CTX * N
#: The driver's own records are under test, not the answer-length and bound floors.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0)


def _peak_cells(trials: Mapping[str, Trial], costs: dict[str, int]) -> int:
    """The most cells the pass's requests held at once, from their client intervals."""
    return peak_held((t.dispatch_ts, t.complete_ts, costs[k]) for k, t in trials.items())


def test_the_pool_ladder_adds_long_rungs_past_three_quarters_of_the_pool() -> None:
    items = build_ladder(CTX, N_PREDICT, 0, mock_token_count, POOL)
    rungs = [i for i in items if i.family == "pool"]
    assert len(items) == 32 + POOL_RUNGS and len(rungs) == POOL_RUNGS
    targets = [int(i.meta["sequence_target"]) for i in rungs]
    assert all(required_length(POOL) < t < POOL for t in targets)
    assert targets == sorted(targets, reverse=True)
    # The split ladder's prompts are the same without them (byte for byte).
    assert [(i.test_id, i.prompt) for i in build_ladder(CTX, N_PREDICT, 0, mock_token_count)] == [
        (i.test_id, i.prompt) for i in items if i.family != "pool"
    ]
    # Every rung fits beside a short prompt of the ladder: the pool can co-batch it.
    costs = kv_costs(items, N_PREDICT, POOL, N)
    shortest = min(costs[i.test_id] for i in items if i.family != "pool")
    assert all(costs[i.test_id] + shortest <= POOL for i in rungs)


def test_a_pool_that_cannot_hold_three_quarters_and_a_companion_is_named() -> None:
    problem = pool_ladder_problem(512, 2, 128)
    assert problem is not None and "cannot hold sequences of 3/4 of it (768 tokens)" in problem
    assert pool_ladder_problem(512, 2, 32) is None
    with pytest.raises(UsageError, match="lower --n-predict or raise --ctx"):
        build_ladder(256, 128, 0, mock_token_count, 512)


def test_a_unified_cell_measures_co_batched_sequences_to_three_quarters_of_the_pool(
    tmp_path: Path,
) -> None:
    items = tuple(build_ladder(CTX, N_PREDICT, 0, mock_token_count, POOL))
    m = Measurement(n_predict=N_PREDICT, gate_passes=2, seed=0, req_timeout=30.0)
    plan = CellPlan(items=items, ctx=CTX, parallel=N, measurement=m, kv_pool=POOL)
    assert plan.serial_ctx == POOL
    launcher = MockLauncher(MockKnobs(token_delay_s=0.002, prompt_token_delay_s=1e-4))
    run = run_cell(plan, launcher, ExactMatchScorer(), policy=POLICY)
    # A ran on one slot of the whole pool; B/C on N slots of the pool's share each.
    a, bc = launcher.servers[0], launcher.servers[1]
    assert (a.parallel, a.ctx) == (1, POOL) and (bc.parallel, bc.ctx) == (N, CTX)
    costs = kv_costs(items, N_PREDICT, POOL, N)
    evidence = run.evidence
    for p in evidence.c_passes:
        assert _peak_cells(p.trials, costs) <= POOL
        assert (p.server_busy_max or 0) >= 2
    # Every long row of every pass was co-batched (hot): its interval overlapped another's.
    hot = set(hot_trials(evidence.a, evidence.c_passes, POLICY.overlap_margin_s))
    long_rows = {(p.index, i.test_id) for p in evidence.c_passes for i in items
                 if i.family == "pool"}  # fmt: skip
    assert long_rows <= hot, long_rows - hot
    spec = CellSpec(model="mock", ctx=CTX, dispatch_n=N, kv_label=run.kv_label, reps=1)
    finished = finish_cell(run, spec, POLICY, Provenance(driver="test"), tmp_path)
    scope = finished.cert.sequence_scope
    assert scope is not None and scope.slot_ctx == CTX
    # The cert's reached length is past 3/4 of the pool, not just of the slot.
    assert scope.longest is not None and scope.longest >= required_length(POOL)


def test_a_sweep_refuses_a_unified_pool_in_one_line(tmp_path: Path) -> None:
    """A sweep shares arm A and the work-set across its Ns; a unified pool's are its own."""
    from batch_invariance.service.options import LaunchOptions
    from batch_invariance.service.request import LiveRequest
    from batch_invariance.service.sweep import SweepRequest, prepare_sweep
    from tests.support.fakes_live import dense_meta, fake_server, write_gguf

    cell = LiveRequest(
        out_dir=tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta()),
        ctx=512,
        launch=LaunchOptions(kv_layout="unified"),
    )
    with pytest.raises(UsageError, match="run run-live --kv-layout unified once per N"):
        prepare_sweep(SweepRequest(cell, (2, 4)), create_out_dir=False)
    split = replace(cell, launch=LaunchOptions())
    assert prepare_sweep(SweepRequest(split, (2, 4)), create_out_dir=False).parallels == (2, 4)


def test_a_search_names_the_unified_configuration_whose_pool_cannot_be_filled(
    tmp_path: Path,
) -> None:
    """search walks unified configurations too; each measures its pool, and one whose pool
    cannot hold 3/4 of it beside a companion is named (the split ones alone still run)."""
    from batch_invariance.service.request import LiveRequest
    from batch_invariance.service.search import SearchRequest, prepare_search
    from tests.support.fakes_live import dense_meta, fake_server, write_gguf

    cell = LiveRequest(
        out_dir=tmp_path / "out",
        server_bin=fake_server(tmp_path / "bin"),
        model=write_gguf(tmp_path / "tiny.gguf", dense_meta()),
        ctx=512,
        parallel=2,
        driver_name="search",
    )
    with pytest.raises(UsageError, match=r"^configuration unified: --kv-layout unified: the pool"):
        prepare_search(SearchRequest(cell), create_out_dir=False)
    job = prepare_search(SearchRequest(cell, only=("ub1",)), create_out_dir=False)
    assert [p.config.name for p in job.points] == ["defaults", "ub1"]
    pooled = replace(cell, parallel=4)  # a pool of 2048 holds 3/4 of it beside a companion
    unified = prepare_search(SearchRequest(pooled, only=("unified",)), create_out_dir=False)
    (point,) = [p for p in unified.points if p.config.name == "unified"]
    assert point.full.kv_pool() == 2048 and point.full.serial_ctx == 2048
