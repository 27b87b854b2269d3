"""The live-cell service: a checked job (:class:`~batch_invariance.service.job.LiveCell`) in,
a written cert out.

The caller checks its request once (:func:`~batch_invariance.service.job.prepare`) and hands
the job here: :func:`run_live_cell` guards memory for both servers, runs the cell over the
job's launcher and finishes it; it never sees the raw request. ``source`` is ``live`` when
this code path spawns the servers itself (any engine) and ``attached`` for ``--base-url``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host import memory
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.protocols import ServerLauncher
from batch_invariance.run.records import CellRun
from batch_invariance.run.workset import Workset
from batch_invariance.service.finish import FinishedCell, finish_cell
from batch_invariance.service.job import LiveCell
from batch_invariance.service.provenance import provenance_for
from batch_invariance.service.target import (
    LauncherFactory,
    LiveServerLauncher,
    identify,
    make_launcher,
)

__all__ = [
    "CellRunner",
    "LiveOutcome",
    "check_room_to_answer",
    "open_runner",
    "preflight_guard",
    "run_live_cell",
]


@dataclass(frozen=True)
class LiveOutcome:
    """A finished live cell: the written cert and the run (timings, launches)."""

    finished: FinishedCell
    run: CellRun
    launcher: LiveServerLauncher
    workset: Workset
    job: LiveCell

    @property
    def model_name(self) -> str:
        return self.job.model_name


def check_room_to_answer(workset: Workset, ctx: int, n_predict: int) -> None:
    """Refuse (UsageError) when a fitted prompt leaves a slot too little room for the answer.

    Only items that record their fitted size (``meta["calibrated_tokens"]``, as profile
    work-sets do) are checked: a prompt plus ``n_predict`` beyond ``ctx`` would cut every
    answer short in every arm, so the cell would measure truncation, not batching.
    """
    over = {
        item.test_id: int(tokens)
        for item in workset.items
        if isinstance(tokens := item.meta.get("calibrated_tokens"), int)
        and int(tokens) + n_predict > ctx
    }
    if over:
        worst_id = max(over, key=over.__getitem__)
        worst = over[worst_id]
        raise UsageError(
            f"{len(over)} prompt(s) leave no room for --n-predict {n_predict} in ctx {ctx} "
            f"(largest: {worst_id}, {worst} tokens); raise --ctx, lower --n-predict or pick "
            "a corner with smaller fills"
        )


def preflight_guard(cell: LiveCell, launcher: LiveServerLauncher) -> None:
    """Run the memory guard for every server of the cell before the first launch
    (GuardRefused).

    The launcher guards again right before each launch (memory may have changed); this only
    spares a run whose B/C or prompt-cache server could never fit from spending arm A first.
    No guard applies to an attached server or a model the guard cannot project.
    """
    host = memory.read_host_memory()
    for arm, n in cell.servers:
        decision = launcher.guard_decision(n, cell.ctx, host, arm)
        if decision is not None and decision.refusal is not None:
            raise GuardRefused(decision.refusal)


class CellRunner(NamedTuple):
    """The work-set a cell measures and the launcher its arms run on."""

    workset: Workset
    launcher: ServerLauncher


def open_runner(
    cell: LiveCell, launcher: LiveServerLauncher, stack: contextlib.ExitStack[Any]
) -> CellRunner:
    """The cell's work-set and the launcher to run it on. A profile's work-set is calibrated
    on the A server itself (its /tokenize), which the driver then gets as arm A's server:
    one launch, and the same frozen bodies go to every arm (``stack`` closes that server)."""
    if cell.workset is not None:
        return CellRunner(cell.workset, launcher)
    from batch_invariance.profiles.calibration import PrelaunchedLauncher
    from batch_invariance.profiles.tokens import server_token_counter

    assert cell.build_workset is not None
    pre = stack.enter_context(PrelaunchedLauncher(launcher, ctx=cell.ctx))
    workset = cell.build_workset(cell.ctx, server_token_counter(pre.handle.base_url))
    check_room_to_answer(workset, cell.ctx, cell.measurement.n_predict)
    return CellRunner(workset, pre)


def run_live_cell(
    cell: LiveCell,
    progress: ProgressSink | None = None,
    *,
    launcher_for: LauncherFactory = make_launcher,
) -> LiveOutcome:
    """Run one checked live cell and write its cert.

    Raises on a guard refusal (before any launch), infrastructure failure or interrupt.
    Nothing is written unless the whole cell ran: an aborted server (memory cap), a failed
    launch or a signal raise before :func:`finish_cell`.
    """
    launcher = launcher_for(cell.target, cell.launch, cell.out_dir, cell.port_policy)
    preflight_guard(cell, launcher)
    # Identify binary and model before the cell: what ran is what gets recorded.
    identity = identify(cell.target)
    with contextlib.ExitStack() as stack:
        runner = open_runner(cell, launcher, stack)
        plan = cell.plan(runner.workset)
        run = run_cell(plan, runner.launcher, cell.scorer, progress=progress, policy=cell.policy)
    if launcher.aborted is not None:
        raise InfraError(launcher.aborted)
    provenance = provenance_for(cell, runner.workset, launcher.launches, len(plan.items), identity)
    finished = finish_cell(run, cell.spec(cell.parallel, run.kv_label), cell.policy, provenance,
                           cell.out_dir, model_template=cell.model_template)  # fmt: skip
    return LiveOutcome(
        finished=finished, run=run, launcher=launcher, workset=runner.workset, job=cell
    )
