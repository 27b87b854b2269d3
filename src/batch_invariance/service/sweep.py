"""The sweep: one live cell per ``--parallel`` N, sharing one ground truth.

Arm A (and A', once some N's B differed from A) runs once on its own ``--parallel 1`` server
and every N compares against it; each N gets its own ``--parallel N`` server for arm B and its
C passes, so K values make 1 + K launches (one more if A' runs). Every cell is finished
exactly as ``run-live`` finishes it (:func:`~batch_invariance.service.finish.finish_cell`) and its
cert re-derives on its own; ``sweep.json`` (:mod:`batch_invariance.service.sweep_summary`) lists
them with ``max_safe_parallel``. N values the memory guard refuses are named there as not run,
before anything launches (where a guard applies: a GGUF model). Any launched engine can be
swept (``--engine``); an attached server cannot, since its N is not the tool's to change.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batch_invariance.cert.store import atomic_write_text
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host import memory
from batch_invariance.run.cell import run_cells
from batch_invariance.run.progress import NullProgress, ProgressSink
from batch_invariance.run.records import CellRun
from batch_invariance.servers.launch import LaunchRecord
from batch_invariance.service.finish import finish_cell
from batch_invariance.service.live import LiveCell, open_runner, prepare, provenance_for
from batch_invariance.service.request import LiveRequest
from batch_invariance.service.sweep_summary import SweepCell, sweep_summary
from batch_invariance.service.target import LiveServerLauncher, identify

__all__ = [
    "SWEEP_FILE",
    "SweepJob",
    "SweepOutcome",
    "SweepRequest",
    "cell_launches",
    "check_sweepable",
    "guard_refusal",
    "parse_parallels",
    "prepare_sweep",
    "run_sweep",
]

SWEEP_FILE = "sweep.json"


@dataclass(frozen=True)
class SweepRequest:
    """A live cell's options (its ``parallel`` is ignored) and the N values to sweep."""

    cell: LiveRequest
    parallels: tuple[int, ...]


@dataclass(frozen=True)
class SweepJob:
    """A sweep checked once by :func:`prepare_sweep`: the job of its first N and every N."""

    cell: LiveCell
    parallels: tuple[int, ...]


@dataclass(frozen=True)
class SweepOutcome:
    cells: tuple[SweepCell, ...]
    summary: dict[str, Any]
    path: Path
    launches: int
    #: The checked job every N was measured from (its ``parallel`` is the first N).
    job: LiveCell

    @property
    def model_name(self) -> str:
        return self.job.model_name


def parse_parallels(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> ``(2, 4, 8)``; UsageError on anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(
            f"--parallel {text!r}: give N values separated by commas, e.g. 2,4,8"
        ) from None
    if not values:
        raise UsageError("--parallel: give at least one N, e.g. 2,4,8")
    if len(set(values)) != len(values):
        raise UsageError(f"--parallel {text}: each N at most once")
    if min(values) < 2:
        raise UsageError(f"--parallel {text}: every N must be >= 2 (N=1 cannot co-batch)")
    return tuple(sorted(values))


def check_sweepable(cell: LiveRequest) -> None:
    """A sweep launches one server per N: an attached server (``--base-url``) cannot be one."""
    if cell.attach.base_url is not None:
        raise UsageError(
            "sweep cannot take --base-url: an attached server's N cannot be changed by the "
            "tool; run run-live --base-url once per server instead"
        )


def guard_refusal(
    launcher: LiveServerLauncher, ctx: int, parallel: int, host: memory.HostMemory
) -> str | None:
    """Why the memory guard would refuse the ``--parallel N`` server, as sweep.json says it
    (``None``: it fits, or no guard applies)."""
    decision = launcher.guard_decision(parallel, ctx, host)
    if decision is None or decision.refusal is None:
        return None
    proj = decision.projection
    fraction = decision.reservation
    if fraction is not None and fraction.refusal == decision.refusal:
        # The share of its memory node the server would reserve (vLLM), not a cap.
        return f"not run: {decision.refusal.removeprefix('memory guard: ')}"
    if decision.cap_bytes is not None and proj.total_bytes > decision.cap_bytes:
        cap = decision.cap_bytes
    elif host.vram_free_bytes is not None and decision.gpu_offload:
        cap = host.vram_free_bytes
    else:
        cap = host.mem_available_bytes or 0
    return f"not run: projected {proj.total_gib:.2f} GiB > cap {cap / memory.GIB:.2f} GiB"


def _write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    path = out_dir / SWEEP_FILE
    atomic_write_text(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def prepare_sweep(request: SweepRequest, *, create_out_dir: bool = True) -> SweepJob:
    """Check the sweep's request once (UsageError naming the first problem): sweepable, every
    N's cheap checks, then the job of the first N (:func:`prepare`)."""
    ns = request.parallels
    base = replace(request.cell, parallel=ns[0], driver_name="sweep")
    check_sweepable(base)
    for n in ns:
        replace(base, parallel=n).check()
    if base.launch.kv_layout == "unified":
        # A unified pool's A server and ladder rungs are sized to its own pool (ctx * N).
        raise UsageError(
            "sweep shares one arm A and one work-set across every N, but a unified pool's "
            "are sized to its N: run run-live --kv-layout unified once per N"
        )
    return SweepJob(prepare(base, create_out_dir=create_out_dir), ns)


def run_sweep(job: SweepJob, progress: ProgressSink | None = None) -> SweepOutcome:
    """Refuse every N that cannot fit, then measure every N that can."""
    ns = job.parallels
    cell = job.cell
    launcher = cell.launcher()
    host = memory.read_host_memory()
    # The shared A server must fit, or nothing can run.
    a_refusal = guard_refusal(launcher, cell.ctx, 1, host)
    if a_refusal is not None:
        raise GuardRefused(f"the --parallel 1 server (arm A) is refused: {a_refusal}")
    refused = {n: r for n in ns if (r := guard_refusal(launcher, cell.ctx, n, host)) is not None}
    runnable = [n for n in ns if n not in refused]
    identity = identify(cell.target)
    sink: ProgressSink = progress if progress is not None else NullProgress()
    cells: dict[int, SweepCell] = {n: SweepCell(n, None, None, refused[n]) for n in refused}
    if not runnable:
        summary = sweep_summary(cell.model_name, cell.ctx, [cells[n] for n in ns], launches=0)
        _write_summary(cell.out_dir, summary)
        raise GuardRefused(f"every N was refused by the memory guard; {refused[ns[0]]}")
    with contextlib.ExitStack() as stack:
        runner = open_runner(cell, launcher, stack)
        plans = [cell.plan(runner.workset, parallel=n) for n in runnable]

        def finish(run: CellRun) -> None:
            n = run.plan.parallel
            if launcher.aborted is not None:
                raise InfraError(launcher.aborted)
            launches = cell_launches(launcher.launches)
            prov = provenance_for(cell, runner.workset, launches, len(run.plan.items), identity)
            spec = cell.spec(n, run.kv_label)
            finished = finish_cell(
                run, spec, cell.policy, prov, cell.out_dir, model_template=cell.model_template
            )
            cells[n] = SweepCell(n, finished, verify(finished.path, Depth.FULL), None)

        try:
            run_cells(plans, runner.launcher, cell.scorer, cell.policy, sink, finish)
        finally:
            sink.end()
    ordered = [cells[n] for n in ns]
    summary = sweep_summary(cell.model_name, cell.ctx, ordered, launches=len(launcher.launches))
    path = _write_summary(cell.out_dir, summary)
    return SweepOutcome(tuple(ordered), summary, path, len(launcher.launches), cell)


def cell_launches(launches: Sequence[LaunchRecord]) -> list[LaunchRecord]:
    """The launches the cell just measured used: every ``--parallel 1`` server so far (the
    shared A, and A' once run) and the latest ``--parallel N`` one (its own)."""
    reference = [r for r in launches if r.arm == "A"]
    own = [r for r in launches if r.arm != "A"][-1:]
    return [*reference, *own]
