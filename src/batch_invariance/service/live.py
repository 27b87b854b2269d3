"""The live-cell service: a typed :class:`LiveRequest` in, a written cert out.

``run-live``, ``demo``, the Action, the live tests and the live benchmark all build a
:class:`LiveRequest` (from argparse or from ``INPUT_*``) and call :func:`run_live_cell`.
:func:`prepare` validates the request once, in a fixed order (usage errors first, before
anything is launched) and resolves it into a :class:`LiveCell`: the files checked, the
work-set and scorer loaded, the server side checked (:mod:`batch_invariance.service.target`:
the engine, its binary and model or the attached URL, the GGUF header where there is one), the
out-dir created. ``source`` is ``live`` when this code path spawns the servers itself (any
engine) and ``attached`` for ``--base-url``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batch_invariance.core.evidence import (
    DEFAULT_LOGIT_EPS,
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    CellSpec,
    GatePolicy,
    policy_usage_problems,
)
from batch_invariance.core.plan import CellPlan, Endpoint, number_problems
from batch_invariance.core.scoring import Scorer
from batch_invariance.engines.base import KvLayout
from batch_invariance.engines.registry import DEFAULT_ENGINE
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.host import memory
from batch_invariance.run.cell import run_cell
from batch_invariance.run.finish import FinishedCell, finish_cell, prepare_out_dir
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import CellRun, ModelTemplate
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import (
    Workset,
    bundled_workset_path,
    expand_reps,
    load_workset,
)
from batch_invariance.servers import ports
from batch_invariance.service.profile import ProfileInputs, ProfileRequest, resolve_profile
from batch_invariance.service.provenance import provenance_for
from batch_invariance.service.target import (
    LiveServerLauncher,
    ServerTarget,
    identify,
    make_launcher,
    resolve_target,
)

__all__ = [
    "ACTION_DEFAULTS",
    "DEFAULT_LOGIT_EPS",
    "DEFAULT_MIN_HOT_TRIALS",
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_REQ_TIMEOUT",
    "DEFAULT_SEED",
    "RUN_LIVE_DEFAULTS",
    "SWEEP_DEFAULTS",
    "CellDefaults",
    "LiveCell",
    "LiveOutcome",
    "LiveRequest",
    "check_room_to_answer",
    "preflight_guard",
    "prepare",
    "run_live_cell",
]


@dataclass(frozen=True)
class CellDefaults:
    """Default cell options of one entry point (argparse and the Action read these)."""

    gate_passes: int
    reps: int
    n_predict: int
    endpoint: Endpoint = "chat"
    ctx: int | None = None
    parallel: int | None = None
    #: End the cell at the first C pass that proves RED (``--stop-on-red``).
    stop_on_red: bool = False


#: ``run-live`` (and the Action, which adds the cell size its users get without asking).
RUN_LIVE_DEFAULTS = CellDefaults(gate_passes=8, reps=3, n_predict=128)
ACTION_DEFAULTS = replace(RUN_LIVE_DEFAULTS, ctx=2048, parallel=4, stop_on_red=True)
#: ``sweep``: run-live's cell, ending each cell once RED is proven.
SWEEP_DEFAULTS = replace(RUN_LIVE_DEFAULTS, stop_on_red=True)
DEFAULT_SEED = 0
#: The gate policy's own default (core/evidence.py), not a second copy.
DEFAULT_MIN_HOT_TRIALS = GatePolicy().min_hot_trials
DEFAULT_READY_TIMEOUT = 300.0
DEFAULT_REQ_TIMEOUT = 120.0


@dataclass(frozen=True)
class LiveRequest:
    """What the user asked a live cell to be, typed but not yet checked (see :func:`prepare`).

    ``bundled_workset`` names the work-set shipped in the package that runs when neither
    ``workset`` nor a profile is given (``demo`` and the Action); ``model_name`` fixes the
    cert's model name (default: the profile's alias, else the model file name). ``engine``
    names the server (``engines.registry``); ``base_url`` attaches to a running one instead
    of launching it.
    """

    out_dir: Path | None
    server_bin: Path | None = None
    model: Path | None = None
    workset: Path | None = None
    ctx: int | None = None
    parallel: int | None = None
    gate_passes: int = RUN_LIVE_DEFAULTS.gate_passes
    reps: int = RUN_LIVE_DEFAULTS.reps
    n_predict: int = RUN_LIVE_DEFAULTS.n_predict
    seed: int = DEFAULT_SEED
    endpoint: Endpoint = "chat"
    n_probs: int | None = None
    logit_eps: float = DEFAULT_LOGIT_EPS
    min_hot_trials: int = DEFAULT_MIN_HOT_TRIALS
    min_answer_tokens: int = DEFAULT_MIN_ANSWER_TOKENS
    max_bound: float = DEFAULT_MAX_BOUND
    serial_repeat: bool = True
    stop_on_red: bool = False
    req_timeout: float = DEFAULT_REQ_TIMEOUT
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    max_footprint_gb: float | None = None
    server_flags: tuple[str, ...] = ()
    scorer: str | None = None
    port: int | None = None
    reserved_ports: tuple[int, ...] = ()
    profile: ProfileRequest | None = None
    bundled_workset: str | None = None
    model_name: str | None = None
    driver_name: str = "run-live"
    #: Test hook: launch every server with at most this many slots (cannot co-batch).
    cap_parallel: int | None = None
    #: KV layout of the B/C server: split (every slot owns ctx) or unified (one ctx*N pool).
    kv_layout: KvLayout = "split"
    #: Which server (``--engine``); checked against ``engines.registry`` by :func:`prepare`.
    engine: str = DEFAULT_ENGINE
    #: Attach mode: measure the server at this URL instead of launching one.
    base_url: str | None = None
    metrics_url: str | None = None
    #: Allow a non-loopback ``base_url`` (recorded in the cert).
    allow_remote: bool = False

    def number_problems(self) -> tuple[str, ...]:
        """What is wrong with the numbers (the one table in :mod:`batch_invariance.core.plan`)."""
        return number_problems(
            {
                "ctx": self.ctx,
                "parallel": self.parallel,
                "gate_passes": self.gate_passes,
                "reps": self.reps,
                "n_predict": self.n_predict,
                "min_hot_trials": self.min_hot_trials,
                "n_probs": self.n_probs,
                "req_timeout": self.req_timeout,
                "ready_timeout": self.ready_timeout,
                "max_footprint_gb": self.max_footprint_gb,
            }
        )

    def check_numbers(self) -> None:
        problems = self.number_problems() + policy_usage_problems(self.policy())
        if problems:
            raise UsageError(problems[0])

    def policy(self) -> GatePolicy:
        """The gate policy the request asks for (F4 always armed, at ``logit_eps``)."""
        return GatePolicy(
            min_hot_trials=self.min_hot_trials,
            logit_eps=self.logit_eps,
            min_answer_tokens=self.min_answer_tokens,
            max_bound=self.max_bound,
        )


@dataclass(frozen=True)
class LiveCell:
    """A checked request: everything a live cell needs, resolved."""

    request: LiveRequest
    target: ServerTarget
    model_name: str
    ctx: int
    parallel: int
    workset: Workset | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    scorer: Scorer
    policy: GatePolicy
    port_policy: ports.PortPolicy
    out_dir: Path
    profile: Mapping[str, Any] | None = None

    @property
    def server_flags(self) -> tuple[str, ...]:
        return self.target.server_flags

    def plan(self, workset: Workset) -> CellPlan:
        req = self.request
        return CellPlan(
            items=expand_reps(workset.items, req.reps),
            ctx=self.ctx,
            parallel=self.parallel,
            gate_passes=req.gate_passes,
            n_predict=req.n_predict,
            seed=req.seed,
            endpoint=req.endpoint,
            n_probs=req.n_probs,
            serial_repeat=req.serial_repeat,
            stop_on_red=req.stop_on_red,
            req_timeout=req.req_timeout,
        )

    @property
    def model_template(self) -> ModelTemplate | None:
        """The model file's own chat template, where its header was read (a launched GGUF)."""
        gguf = self.target.gguf
        if gguf is None or self.target.attach is not None:
            return None
        return ModelTemplate(gguf.chat_template)

    def launcher(self) -> LiveServerLauncher:
        return make_launcher(self.target, self.request, self.out_dir, self.port_policy)

    def spec(self, parallel: int, kv_label: str) -> CellSpec:
        """The cell's identity for the cert (a sweep asks once per N)."""
        gguf = self.target.gguf
        return CellSpec(
            model=self.model_name,
            ctx=self.ctx,
            dispatch_n=parallel,
            kv_label=kv_label,
            reps=self.request.reps,
            is_moe=gguf.is_moe if gguf is not None else False,
        )


def prepare(request: LiveRequest, *, create_out_dir: bool = True) -> LiveCell:
    """Check ``request`` and resolve it (UsageError naming the first problem)."""
    prof: ProfileInputs | None = resolve_profile(request.profile, request)
    target = resolve_target(request, prof)
    if request.ctx is None or request.parallel is None:
        raise UsageError("--ctx and --parallel are required (tokens per slot, and N)")
    request.check_numbers()
    builder = None
    workset: Workset | None = None
    if request.workset is not None:
        workset = load_workset(request.workset)
    elif prof is not None and prof.build_workset is not None:
        builder = prof.build_workset
    elif request.bundled_workset is not None:
        workset = load_workset(bundled_workset_path(request.bundled_workset))
    else:
        raise UsageError("--workset FILE is required (or --profile NAME --model-alias ALIAS)")
    scorer = prof.scorer if prof is not None else load_scorer(request.scorer)
    port_policy = ports.make_policy(request.port, list(request.reserved_ports))
    if request.out_dir is None:
        raise UsageError("--out-dir DIR is required (where the cert and server logs go)")
    out_dir = prepare_out_dir(request.out_dir) if create_out_dir else request.out_dir
    model = target.model
    name = (
        request.model_name
        or (prof.model_name if prof and prof.model_name else None)
        or (model.name.removesuffix(".gguf") if model is not None else "attached")
    )
    return LiveCell(
        request=request,
        target=target,
        model_name=name,
        ctx=request.ctx,
        parallel=request.parallel,
        workset=workset,
        build_workset=builder,
        scorer=scorer,
        policy=request.policy(),
        port_policy=port_policy,
        out_dir=out_dir,
        profile=None if prof is None else dict(prof.provenance),
    )


@dataclass(frozen=True)
class LiveOutcome:
    """A finished live cell: the written cert and the run (timings, launches)."""

    finished: FinishedCell
    run: CellRun
    launcher: LiveServerLauncher
    workset: Workset
    model_name: str


def check_room_to_answer(workset: Workset, ctx: int, n_predict: int) -> None:
    """Refuse (UsageError) when a fitted prompt leaves a slot too little room for the answer.

    Only items that record their fitted size (``meta["calibrated_tokens"]``, as profile
    work-sets do) are checked: a prompt plus ``n_predict`` beyond ``ctx`` would cut every
    answer short in every arm, so the cell would measure truncation, not batching.
    """
    over = [
        (item.test_id, int(item.meta["calibrated_tokens"]))
        for item in workset.items
        if isinstance(item.meta.get("calibrated_tokens"), int)
        and int(item.meta["calibrated_tokens"]) + n_predict > ctx
    ]
    if over:
        worst_id, worst = max(over, key=lambda pair: pair[1])
        raise UsageError(
            f"{len(over)} prompt(s) leave no room for --n-predict {n_predict} in ctx {ctx} "
            f"(largest: {worst_id}, {worst} tokens); raise --ctx, lower --n-predict or pick "
            "a corner with smaller fills"
        )


def preflight_guard(cell: LiveCell, launcher: LiveServerLauncher) -> None:
    """Run the memory guard for BOTH servers before the first launch (GuardRefused).

    The launcher guards again right before each launch (memory may have changed); this only
    spares a run whose B/C server could never fit from spending arm A first. No guard applies
    to an attached server or a model that is no GGUF file.
    """
    host = memory.read_host_memory()
    for n in (1, cell.parallel):
        decision = launcher.guard_decision(n, cell.ctx, host)
        if decision is not None and decision.refusal is not None:
            raise GuardRefused(decision.refusal)


def run_live_cell(request: LiveRequest, progress: ProgressSink | None = None) -> LiveOutcome:
    """Check the request, run one live cell and write its cert.

    Raises on bad input (before any launch), infrastructure failure or interrupt. Nothing is
    written unless the whole cell ran: an aborted server (memory cap), a failed launch or a
    signal raise before :func:`finish_cell`.
    """
    cell = prepare(request)
    launcher = cell.launcher()
    preflight_guard(cell, launcher)
    # Identify binary and model before the cell: what ran is what gets recorded.
    identity = identify(cell.target)
    if cell.workset is not None:
        workset = cell.workset
        plan = cell.plan(workset)
        run = run_cell(plan, launcher, cell.scorer, progress=progress, policy=cell.policy)
    else:
        from batch_invariance.profiles.calibration import PrelaunchedLauncher
        from batch_invariance.profiles.tokens import server_token_counter

        assert cell.build_workset is not None
        # A profile's work-set is calibrated on the A server itself (its /tokenize), which
        # the driver then gets as arm A's server: one launch, and the same frozen bodies
        # go to every arm.
        with PrelaunchedLauncher(launcher, ctx=cell.ctx) as pre:
            workset = cell.build_workset(cell.ctx, server_token_counter(pre.handle.base_url))
            check_room_to_answer(workset, cell.ctx, request.n_predict)
            plan = cell.plan(workset)
            run = run_cell(plan, pre, cell.scorer, progress=progress, policy=cell.policy)
    if launcher.aborted is not None:
        raise InfraError(launcher.aborted)
    provenance = provenance_for(cell, workset, launcher.launches, len(plan.items), identity)
    finished = finish_cell(run, cell.spec(cell.parallel, run.kv_label), cell.policy, provenance,
                           cell.out_dir, model_template=cell.model_template)  # fmt: skip
    return LiveOutcome(
        finished=finished, run=run, launcher=launcher, workset=workset, model_name=cell.model_name
    )
