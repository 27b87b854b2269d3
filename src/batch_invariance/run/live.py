"""The live-cell service: a typed :class:`LiveRequest` in, a written cert out.

``run-live``, ``demo``, the Action, the live tests and the live benchmark all build a
:class:`LiveRequest` (from argparse or from ``INPUT_*``) and call :func:`run_live_cell`.
:func:`prepare` validates the request once, in a fixed order (usage errors first, before
anything is launched) and resolves it into a :class:`LiveCell`: the files checked, the
work-set and scorer loaded, the GGUF header read, the out-dir created. ``source`` is
``live`` because this code path spawns the servers itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batch_invariance.core.evidence import (
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    CellSpec,
    GatePolicy,
    policy_usage_problems,
)
from batch_invariance.core.plan import CellPlan, Endpoint, number_problems
from batch_invariance.core.scoring import Scorer
from batch_invariance.engines import memory, ports
from batch_invariance.engines.gguf import GgufInfo, cached_sha256, parse_info
from batch_invariance.engines.live_launcher import LiveLauncher, identify_binary
from batch_invariance.engines.llama_server import KvLayout, owned_flag_conflicts
from batch_invariance.engines.provision import cache_root
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.run.cell import run_cell
from batch_invariance.run.finish import FinishedCell, finish_cell, prepare_out_dir
from batch_invariance.run.live_profile import ProfileInputs, ProfileRequest, resolve_profile
from batch_invariance.run.live_provenance import provenance_for
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import CellRun
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, bundled_workset_path, expand_reps, load_workset


@dataclass(frozen=True)
class CellDefaults:
    """Default cell options of one entry point (argparse and the Action read these)."""

    gate_passes: int
    reps: int
    n_predict: int
    endpoint: Endpoint = "chat"
    ctx: int | None = None
    parallel: int | None = None


#: ``run-live`` (and the Action, which adds the cell size its users get without asking).
RUN_LIVE_DEFAULTS = CellDefaults(gate_passes=8, reps=3, n_predict=128)
ACTION_DEFAULTS = replace(RUN_LIVE_DEFAULTS, ctx=2048, parallel=4)
DEFAULT_SEED = 0
DEFAULT_LOGIT_EPS = 0.01
#: The gate policy's own default (core/evidence.py), not a second copy.
DEFAULT_MIN_HOT_TRIALS = GatePolicy().min_hot_trials
DEFAULT_READY_TIMEOUT = 300.0
DEFAULT_REQ_TIMEOUT = 120.0


@dataclass(frozen=True)
class LiveRequest:
    """What the user asked a live cell to be, typed but not yet checked (see :func:`prepare`).

    ``bundled_workset`` names the work-set shipped in the package that runs when neither
    ``workset`` nor a profile is given (``demo`` and the Action); ``model_name`` fixes the
    cert's model name (default: the profile's alias, else the GGUF file name).
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
        """The gate policy the request asks for (F4 armed only with ``n_probs``)."""
        return GatePolicy(
            min_hot_trials=self.min_hot_trials,
            logit_eps=self.logit_eps if self.n_probs is not None else None,
            min_answer_tokens=self.min_answer_tokens,
            max_bound=self.max_bound,
        )


@dataclass(frozen=True)
class LiveCell:
    """A checked request: everything a live cell needs, resolved."""

    request: LiveRequest
    server_bin: Path
    model: Path
    gguf: GgufInfo
    model_name: str
    ctx: int
    parallel: int
    workset: Workset | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    scorer: Scorer
    policy: GatePolicy
    server_flags: tuple[str, ...]
    port_policy: ports.PortPolicy
    out_dir: Path
    profile: Mapping[str, Any] | None = None

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
            req_timeout=req.req_timeout,
        )

    def launcher(self) -> LiveLauncher:
        req = self.request
        return LiveLauncher(
            self.server_bin,
            self.model,
            self.gguf,
            self.out_dir,
            port_policy=self.port_policy,
            server_flags=self.server_flags,
            max_footprint_gb=req.max_footprint_gb,
            ready_timeout=req.ready_timeout,
            cap_parallel=req.cap_parallel,
            kv_layout=req.kv_layout,
        )


def _check_file(path: Path | None, flag: str, what: str, executable: bool = False) -> Path:
    if path is None:
        raise UsageError(f"{flag} is required ({what})")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    if executable and not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {path}: not executable (chmod +x it)")
    return path


def prepare(request: LiveRequest, *, create_out_dir: bool = True) -> LiveCell:
    """Check ``request`` and resolve it (UsageError naming the first problem)."""
    prof: ProfileInputs | None = resolve_profile(request.profile, request)
    server_bin = request.server_bin or (prof.server_bin if prof else None)
    model = request.model or (prof.model if prof else None)
    server_bin = _check_file(server_bin, "--server-bin", "path to llama-server", executable=True)
    model = _check_file(model, "--model", "path to a GGUF model")
    if request.ctx is None or request.parallel is None:
        raise UsageError("--ctx and --parallel are required (tokens per slot, and N)")
    request.check_numbers()
    flags = tuple(prof.server_flags if prof else request.server_flags)
    clash = owned_flag_conflicts(flags)
    if clash:
        raise UsageError(
            f"--server-flag {clash[0]} conflicts with what {request.driver_name} sets itself "
            f"(model, host, port, parallel, ctx, KV layout); use the {request.driver_name} "
            "option instead"
        )
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
    gguf = parse_info(model)
    if request.out_dir is None:
        raise UsageError("--out-dir DIR is required (where the cert and server logs go)")
    out_dir = prepare_out_dir(request.out_dir) if create_out_dir else request.out_dir
    name = (
        request.model_name
        or (prof.model_name if prof and prof.model_name else None)
        or model.name.removesuffix(".gguf")
    )
    return LiveCell(
        request=request,
        server_bin=server_bin.resolve(),
        model=model.resolve(),
        gguf=gguf,
        model_name=name,
        ctx=request.ctx,
        parallel=request.parallel,
        workset=workset,
        build_workset=builder,
        scorer=scorer,
        policy=request.policy(),
        server_flags=flags,
        port_policy=port_policy,
        out_dir=out_dir,
        profile=None if prof is None else dict(prof.provenance),
    )


@dataclass(frozen=True)
class LiveOutcome:
    """A finished live cell: the written cert and the run (timings, launches)."""

    finished: FinishedCell
    run: CellRun
    launcher: LiveLauncher
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


def preflight_guard(cell: LiveCell, launcher: LiveLauncher) -> None:
    """Run the memory guard for BOTH servers before the first launch (GuardRefused).

    The launcher guards again right before each launch (memory may have changed); this only
    spares a run whose B/C server could never fit from spending arm A first.
    """
    for n in (1, cell.parallel):
        slots = launcher.effective_parallel(n)
        proj = memory.project(cell.gguf, cell.ctx, slots, cell.server_flags)
        memory.check(proj, cell.request.max_footprint_gb, cell.server_flags)


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
    binary = identify_binary(cell.server_bin)
    model_sha = cached_sha256(cell.model, cache_root() / "hashes.json")
    if cell.workset is not None:
        workset = cell.workset
        plan = cell.plan(workset)
        run = run_cell(plan, launcher, cell.scorer, progress=progress)
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
            run = run_cell(plan, pre, cell.scorer, progress=progress)
    if launcher.aborted is not None:
        raise InfraError(launcher.aborted)
    spec = CellSpec(
        model=cell.model_name,
        ctx=cell.ctx,
        dispatch_n=cell.parallel,
        kv_label=run.kv_label,
        reps=request.reps,
        is_moe=cell.gguf.is_moe,
    )
    provenance = provenance_for(cell, workset, launcher, len(plan.items), binary, model_sha)
    finished = finish_cell(run, spec, cell.policy, provenance, cell.out_dir)
    return LiveOutcome(
        finished=finished, run=run, launcher=launcher, workset=workset, model_name=cell.model_name
    )
