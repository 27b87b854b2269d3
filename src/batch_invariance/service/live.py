"""The live-cell service: a checked job (:class:`~batch_invariance.service.live.LiveCell`) in,
a written cert out.

The caller checks its request once (:func:`~batch_invariance.service.live.prepare`) and hands
the job here: :func:`run_live_cell` guards memory for both servers, runs the cell over the
job's launcher and finishes it; it never sees the raw request. ``source`` is ``live`` when
this code path spawns the servers itself (any engine) and ``attached`` for ``--base-url``.

The job: a :class:`~batch_invariance.service.request.LiveRequest` checked once into a
:class:`LiveCell` that carries only checked values.

:func:`prepare` validates the request in a fixed order (usage errors first, before anything is
launched) and resolves it: the files checked, the work-set and scorer loaded, the server side
checked (:mod:`batch_invariance.service.target`: the engine, its binary and model or the
attached URL, the GGUF header where there is one), the out-dir created. It is the one reader
of the raw request; the launcher, the plan, the spec, the provenance, the dry run and the sweep
read the job.

The provenance block a live cell adds to its cert (:func:`provenance_for`): tool, engine,
binary, model, work-set, host, memory guard, attach record and profile (merged over the
driver's own block in :func:`~batch_invariance.service.finish.finish_cell`). One builder for
every engine, launched or attached; it reads the job, so it lives beside it (``finish`` knows
no job type, and imports nothing of this module).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from batch_invariance import __version__
from batch_invariance.cert.provenance import (
    ModelFileRecord,
    ProfileRecord,
    Provenance,
)
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.core.gpu_placement import GpuPlacement, unread_placement
from batch_invariance.core.plan import CellPlan, Measurement
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host import facts as hostinfo
from batch_invariance.host import memory
from batch_invariance.host.gpus import placement_here
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import CellRun, ModelTemplate, ServerLauncher
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, expand_reps
from batch_invariance.servers import ports
from batch_invariance.servers.launch import LaunchRecord
from batch_invariance.service.endpoint import ChosenEndpoint, choose_endpoint, header_of
from batch_invariance.service.finish import FinishedCell, finish_cell, prepare_out_dir
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.profile import resolve_profile, resolve_workset
from batch_invariance.service.request import LiveRequest
from batch_invariance.service.target import (
    LauncherFactory,
    LiveServerLauncher,
    ServerTarget,
    TargetIdentity,
    identify,
    make_launcher,
    resolve_target,
)

__all__ = [
    "CellRunner",
    "LiveCell",
    "LiveOutcome",
    "Measurement",
    "check_room_to_answer",
    "open_runner",
    "preflight_guard",
    "prepare",
    "provenance_for",
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
    """Refuse (UsageError) when a fitted prompt (``meta["calibrated_tokens"]``, as profile
    work-sets record it) plus ``n_predict`` is beyond ``ctx``: every arm would cut its answer
    short, so the cell would measure truncation, not batching."""
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
    (GuardRefused). The launcher guards again right before each launch (memory may have
    changed); this only spares a run whose B/C or prompt-cache server could never fit from
    spending arm A first. No guard applies to an attached server or an unprojected model."""
    host = memory.read_host_memory()
    for arm, n in cell.servers:
        ctx = cell.serial_ctx if arm == ServerRole.A else cell.ctx
        decision = launcher.guard_decision(n, ctx, host, arm)
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
    pre = stack.enter_context(PrelaunchedLauncher(launcher, ctx=cell.serial_ctx))
    workset = cell.build_workset(cell.ctx, server_token_counter(pre.handle.base_url))
    check_room_to_answer(workset, cell.serial_ctx, cell.measurement.n_predict)
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


@dataclass(frozen=True)
class LiveCell:
    """The job: a live request checked once by :func:`prepare`, holding only checked values.

    Everything after :func:`prepare` (the launcher, the plan, the spec, the provenance, the
    dry run, the sweep) reads this, never the :class:`LiveRequest`.
    """

    #: The entry point that ran the cell (``run-live``, ``demo``, ``sweep``, ...).
    driver: str
    target: ServerTarget
    launch: LaunchOptions
    model_name: str
    ctx: int
    parallel: int
    measurement: Measurement
    workset: Workset | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    scorer: Scorer
    policy: GatePolicy
    port_policy: ports.PortPolicy
    out_dir: Path
    profile: ProfileRecord | None = None
    #: The endpoint ``measurement`` uses, and why where ``--endpoint auto`` chose it.
    endpoint: ChosenEndpoint | None = None

    @property
    def server_flags(self) -> tuple[str, ...]:
        return self.target.server_flags

    @property
    def servers(self) -> tuple[tuple[ServerRole, int], ...]:
        """``(arm, parallel)`` of every server the cell starts: the serial A server, the
        B/C server and, when the cache is measured, the prompt-cache arm's server."""
        cache = ((ServerRole.CACHE, self.parallel),) if self.measurement.cache_passes else ()
        return ((ServerRole.A, 1), (ServerRole.BC, self.parallel), *cache)

    def kv_pool(self, parallel: int | None = None) -> int | None:
        """The B/C server's unified KV pool at ``parallel`` (default: the cell's N); ``None``
        when split (one slot runs split)."""
        n = self.parallel if parallel is None else parallel
        return self.ctx * n if self.launch.kv_layout == "unified" and n > 1 else None

    @property
    def serial_ctx(self) -> int:
        """The A server's context: the pool where it is unified (any slot may fill it)."""
        return self.kv_pool() or self.ctx

    def plan(self, workset: Workset, parallel: int | None = None) -> CellPlan:
        """The plan of this cell over ``workset`` (a sweep asks once per ``parallel`` N)."""
        m = self.measurement
        n = self.parallel if parallel is None else parallel
        return CellPlan(
            items=expand_reps(workset.items, m.reps),
            ctx=self.ctx,
            parallel=n,
            measurement=m,
            # What pays for the prompt-cache arm (core.schedule).
            b_sample=m.cache_passes > 0,
            kv_pool=self.kv_pool(n),
        )

    @property
    def model_template(self) -> ModelTemplate | None:
        """The model file's own chat template, where its header was read (a launched GGUF)."""
        gguf = self.target.gguf
        if gguf is None or self.target.attach is not None:
            return None
        return ModelTemplate(gguf.chat_template)

    def launcher(self) -> LiveServerLauncher:
        return make_launcher(self.target, self.launch, self.out_dir, self.port_policy)

    def spec(self, parallel: int, kv_label: str) -> CellSpec:
        """The cell's identity for the cert (a sweep asks once per N)."""
        gguf = self.target.gguf
        return CellSpec(
            model=self.model_name,
            ctx=self.ctx,
            dispatch_n=parallel,
            kv_label=kv_label,
            reps=self.measurement.reps,
            is_moe=gguf.is_moe if gguf is not None else False,
        )


def prepare(request: LiveRequest, *, create_out_dir: bool = True) -> LiveCell:
    """Check ``request`` and resolve it (UsageError naming the first problem): the one place
    the raw request is read. The cheap checks come first (``LiveRequest.check``), then the
    profile (user code), the server side, the work-set and scorer, the out-dir."""
    checked = request.check()
    prof = resolve_profile(request, checked.engine)
    target = resolve_target(request, checked.engine, prof)
    port_policy = ports.make_policy(request.port, list(request.reserved_ports))
    builder, workset = resolve_workset(request, checked, prof)
    scorer = prof.scorer if prof is not None else load_scorer(request.scorer)
    out_dir = prepare_out_dir(checked.out_dir) if create_out_dir else checked.out_dir
    model = target.model
    endpoint = _endpoint(request, target)
    name = (
        request.model_name
        or (prof.model_alias if prof and prof.model_alias else None)
        or (model.name.removesuffix(".gguf") if model is not None else "attached")
    )
    return LiveCell(
        driver=request.driver_name,
        target=target,
        launch=request.launch,
        model_name=name,
        ctx=checked.ctx,
        parallel=checked.parallel,
        measurement=replace(request.measurement, endpoint=endpoint.endpoint),
        workset=workset,
        build_workset=builder,
        scorer=scorer,
        policy=request.policy,
        port_policy=port_policy,
        out_dir=out_dir,
        profile=None if prof is None else prof.provenance,
        endpoint=endpoint,
    )


def _endpoint(request: LiveRequest, target: ServerTarget) -> ChosenEndpoint:
    """The endpoint the request's ``--endpoint`` means for ``target``: a launched model's
    header as read, or the ``--model`` file named beside an attached server."""
    attached = target.attach is not None
    header = header_of(target.model) if attached else target.gguf
    choice = request.endpoint or request.measurement.endpoint
    return choose_endpoint(
        choice, header=header, attached=attached, server_flags=target.server_flags
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _model_file(target: ServerTarget, sha256: str | None) -> ModelFileRecord | None:
    model = target.model
    if model is None or target.attach is not None:
        return None  # attached: the tool cannot say which file the server loaded
    gguf = target.gguf
    if gguf is None:
        return ModelFileRecord(path=str(model), name=model.name, sha256=sha256, size=None,
                               gguf=None, gguf_skipped=target.gguf_skipped)  # fmt: skip
    return ModelFileRecord(path=str(model), name=model.name, sha256=sha256,
                           size=gguf.file_size, gguf=gguf.summary())  # fmt: skip


def _gpus(cell: LiveCell) -> GpuPlacement:
    """The GPUs the launched servers see: they inherit this process's selection variables."""
    if cell.target.attach is not None:
        return unread_placement("an attached server: the tool cannot see its GPUs")
    return placement_here(os.environ)


def _memory_guard(cell: LiveCell, launches: Sequence[LaunchRecord]) -> dict[str, Any]:
    target = cell.target
    if target.gguf is None and target.hf_model is None:
        return {"max_footprint_gb": cell.launch.max_footprint_gb, "applied": False,
                "reason": target.gguf_skipped}  # fmt: skip
    return {
        "max_footprint_gb": cell.launch.max_footprint_gb,
        "launches": [
            {
                "arm": r.arm,
                "parallel": r.parallel,
                "ctx_per_slot": r.ctx,
                "projected_bytes": r.projected_bytes,
                # The share of its memory node the server reserved (vLLM), where it did.
                **({} if r.memory_fraction is None else {"memory_fraction": r.memory_fraction}),
                "rss_peak_bytes": r.rss_peak_bytes,
                "ready_s": _round(r.ready_s),
                "alive_s": _round(r.alive_s),
            }
            for r in launches
        ],
    }


def provenance_for(
    cell: LiveCell,
    workset: Workset,
    launches: Sequence[LaunchRecord],
    n_items: int,
    identity: TargetIdentity,
) -> Provenance:
    """The caller's provenance block of a live cell (``launches``: the servers this cell
    used; a sweep's launcher also started others)."""
    target = cell.target
    gguf = target.gguf
    # The work-set's record first: what the cell ran, before what it ran on.
    workset_record = {**workset.record(), "n_items": n_items}
    block = Provenance(
        tool_version=__version__,
        driver=cell.driver,
        engine=target.engine.name,
        server_binary=None if identity.binary is None else identity.binary.record(),
        model_file=_model_file(target, identity.model_sha256),
        is_moe=gguf.is_moe if gguf is not None else None,
        workset=workset_record,
        server_flags=tuple(cell.server_flags),
        host=hostinfo.summary(),
        gpus=_gpus(cell).record(),
        memory_guard=_memory_guard(cell, launches),
        profile=cell.profile,
    )
    if target.attach is None:
        return block
    return block.model_copy(update={"attach": target.attach.to_record()})
