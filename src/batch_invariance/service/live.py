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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from batch_invariance.cert.provenance import ProfileRecord
from batch_invariance.core.evidence import CellSpec, GatePolicy
from batch_invariance.core.plan import CellPlan, Measurement
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.scoring import Scorer
from batch_invariance.engines.base import Engine
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host import memory
from batch_invariance.profiles.ladder import LADDER, ladder_builder
from batch_invariance.profiles.overrides import ProfileRun
from batch_invariance.profiles.tokens import TokenCounter, approx_token_count
from batch_invariance.run.cell import run_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import CellRun, ModelTemplate, ServerLauncher
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import (
    Workset,
    bundled_workset_path,
    expand_reps,
    load_workset,
    shaped_for_cache,
)
from batch_invariance.servers import ports
from batch_invariance.service.finish import (
    FinishedCell,
    finish_cell,
    prepare_out_dir,
    provenance_for,
)
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.profile import resolve_profile
from batch_invariance.service.request import CheckedRequest, LiveRequest
from batch_invariance.service.target import (
    LauncherFactory,
    LiveServerLauncher,
    ServerTarget,
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

    @property
    def server_flags(self) -> tuple[str, ...]:
        return self.target.server_flags

    @property
    def servers(self) -> tuple[tuple[ServerRole, int], ...]:
        """``(arm, parallel)`` of every server the cell starts: the serial A server, the
        B/C server and, when the cache is measured, the prompt-cache arm's server."""
        cache = ((ServerRole.CACHE, self.parallel),) if self.measurement.cache_passes else ()
        return ((ServerRole.A, 1), (ServerRole.BC, self.parallel), *cache)

    def plan(self, workset: Workset, parallel: int | None = None) -> CellPlan:
        """The plan of this cell over ``workset`` (a sweep asks once per ``parallel`` N)."""
        m = self.measurement
        return CellPlan(
            items=expand_reps(workset.items, m.reps),
            ctx=self.ctx,
            parallel=self.parallel if parallel is None else parallel,
            measurement=m,
            # What pays for the prompt-cache arm (core.schedule).
            b_sample=m.cache_passes > 0,
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


#: The bundled rows ``--cache-shape`` shapes when no ``--workset`` is given.
CACHE_SHAPE_SOURCE = "demo_completions"


def _ladder(
    request: LiveRequest, engine: Engine, ctx: int
) -> tuple[Callable[[int, TokenCounter], Workset] | None, Workset | None]:
    """The length ladder for the cell: built on the A server's own ``/tokenize`` where the
    tool launches a llama-server (as a profile's work-set is), else now, with the offline
    estimate. Either way it is first planned offline, so a slot too small for it is refused
    here, before anything launches."""
    m = request.measurement
    offline = ladder_builder(m.n_predict, m.seed, "the offline estimate")
    preview = offline(ctx, approx_token_count)
    if engine.takes_profiles and request.attach.base_url is None:
        return ladder_builder(m.n_predict, m.seed, "the A server's /tokenize"), None
    return None, preview


def _workset(
    request: LiveRequest, checked: CheckedRequest, prof: ProfileRun | None
) -> tuple[Callable[[int, TokenCounter], Workset] | None, Workset | None]:
    """The cell's work-set, or how to build it once the A server can count tokens: the
    ``--workset`` file, a profile's, the length ladder or a bundled one (the prompt-cache
    shape applied where asked)."""
    builder: Callable[[int, TokenCounter], Workset] | None = None
    workset: Workset | None = None
    bundled = request.bundled_workset
    if request.workset is not None:
        workset = load_workset(request.workset)
    elif prof is not None:
        builder = prof.build_workset
    elif bundled == LADDER and request.cache_shape is None:
        builder, workset = _ladder(request, checked.engine, checked.ctx)
    elif bundled is not None:
        # The prompt-cache shape turns rows into growing conversations: it starts from the
        # short completion openings, not from prompts that already fill the slot.
        source = CACHE_SHAPE_SOURCE if bundled == LADDER else bundled
        workset = load_workset(bundled_workset_path(source))
    if request.cache_shape is not None and workset is not None:  # a profile's is not shaped
        workset = shaped_for_cache(workset, request.cache_shape)
    return builder, workset


def prepare(request: LiveRequest, *, create_out_dir: bool = True) -> LiveCell:
    """Check ``request`` and resolve it (UsageError naming the first problem): the one place
    the raw request is read. The cheap checks come first (``LiveRequest.check``), then the
    profile (user code), the server side, the work-set and scorer, the out-dir."""
    checked = request.check()
    prof = resolve_profile(request, checked.engine)
    target = resolve_target(request, checked.engine, prof)
    port_policy = ports.make_policy(request.port, list(request.reserved_ports))
    builder, workset = _workset(request, checked, prof)
    scorer = prof.scorer if prof is not None else load_scorer(request.scorer)
    out_dir = prepare_out_dir(checked.out_dir) if create_out_dir else checked.out_dir
    model = target.model
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
        measurement=request.measurement,
        workset=workset,
        build_workset=builder,
        scorer=scorer,
        policy=request.policy,
        port_policy=port_policy,
        out_dir=out_dir,
        profile=None if prof is None else prof.provenance,
    )
