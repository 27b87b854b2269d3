"""`batch-invariance run-live`: one real cell against the user's own ``llama-server``.

The command validates its inputs (usage errors exit 2 with one line), then runs the cell
through :func:`~batch_invariance.run.cell.run_cell` with a
:class:`~batch_invariance.engines.llama_server.LiveLauncher` (which guards memory and
re-checks the port before every launch) and writes the cert with
:func:`~batch_invariance.run.cell.finish_cell`.
``source`` is ``live`` because this code path spawned the servers; ``--cert-source`` only
accepts ``live`` and decides nothing. ``--dry-run`` prints the plan and launches nothing.

:func:`execute` (run + write, no printing) is shared by the Action; :func:`run_live_cell`
by ``demo``, the live tests and the live benchmark.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.certificate import display_verdict, is_promotable
from batch_invariance.core.evidence import (
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    DEFAULT_MIN_HOT_TRIALS,
    CellSpec,
    GatePolicy,
)
from batch_invariance.core.scoring import Scorer
from batch_invariance.engines import host as hostinfo
from batch_invariance.engines import memory, ports
from batch_invariance.engines.gguf import GgufInfo, cached_sha256, parse_info
from batch_invariance.engines.llama_server import (
    BinaryIdentity,
    KvLayout,
    LiveLauncher,
    build_argv,
    identify_binary,
    kv_label,
    owned_flag_conflicts,
)
from batch_invariance.engines.provision import cache_root
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.run.cell import CellPlan, CellRun, FinishedCell, finish_cell, run_cell
from batch_invariance.run.progress import Progress, ProgressSink
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, expand_reps, load_workset

DEFAULT_GATE_PASSES = 8
DEFAULT_REPS = 3
DEFAULT_N_PREDICT = 128
DEFAULT_READY_TIMEOUT = 300.0
DEFAULT_REQ_TIMEOUT = 120.0
DEFAULT_LOGIT_EPS = 0.01

#: Rough CPU generation cost for the dry-run ETA, measured on the embedded default
#: (Gemma 3 270M Q4_K_M, 2 cores): ~13 ms per token per 0.24 GiB of weights; concurrent
#: passes ran ~2x faster than serial at N=4.
_ETA_MS_PER_TOKEN_PER_GIB = 13.0 / 0.236
_ETA_CONCURRENT_SPEEDUP = 2.0


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class ProfileInputs:
    """What a measurement profile (``--profile``) contributes to a live run.

    ``build_workset`` is called with ``(ctx, token_counter)`` once a calibration server is up;
    ``None`` means the run uses ``--workset``.
    """

    server_bin: Path | None
    model: Path | None
    server_flags: tuple[str, ...]
    scorer: Scorer
    model_name: str | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    provenance: Mapping[str, Any]


def resolve_profile(args: argparse.Namespace) -> ProfileInputs | None:
    """The profile's contribution for ``--profile`` runs; ``None`` without ``--profile``.

    Explicit command-line values beat the profile (the profile layer merges them).
    """
    profile = getattr(args, "profile", None)
    if not profile:
        for opt in ("model_alias", "models_dir", "models_file", "corner"):
            if getattr(args, opt, None):
                flag = "--" + opt.replace("_", "-")
                raise UsageError(f"{flag} needs --profile; add --profile NAME or drop {flag}")
        return None
    from batch_invariance.profiles import resolve_profile_run

    overrides: dict[str, Any] = {
        "server_bin": None if args.server_bin is None else str(args.server_bin),
        "model": None if args.model is None else str(args.model),
        "server_flags": tuple(args.server_flag or ()),
        "scorer": args.scorer,
        "models_file": getattr(args, "models_file", None),
        "corner": getattr(args, "corner", None),
        "seed": args.profile_seed,
    }
    run = resolve_profile_run(str(profile), args.model_alias, args.models_dir, overrides)

    def build(ctx: int, counter: Callable[[str], int]) -> Workset:
        return run.build_workset(ctx, counter)

    return ProfileInputs(
        server_bin=None if run.server_bin is None else Path(run.server_bin),
        model=None if run.model is None else Path(run.model),
        server_flags=tuple(run.server_flags),
        scorer=run.scorer,
        model_name=run.model_alias,
        build_workset=None if args.workset is not None else build,
        provenance={
            "name": run.profile.name,
            "corner": run.corner,
            "seed": run.seed,
            "model_alias": run.model_alias,
            "models_toml": run.models_toml,
            "kv": run.kv,
        },
    )


@dataclass(frozen=True)
class LiveConfig:
    """Everything a live cell needs, validated."""

    server_bin: Path
    model: Path
    gguf: GgufInfo
    model_name: str
    workset: Workset | None
    build_workset: Callable[[int, Callable[[str], int]], Workset] | None
    scorer: Scorer
    ctx: int
    parallel: int
    gate_passes: int
    reps: int
    n_predict: int
    seed: int
    endpoint: Literal["chat", "completions"]
    n_probs: int | None
    serial_repeat: bool
    req_timeout: float
    ready_timeout: float
    policy: GatePolicy
    server_flags: tuple[str, ...]
    port_policy: ports.PortPolicy
    max_footprint_gb: float | None
    out_dir: Path
    driver_name: str = "run-live"
    #: Test hook: launch every server with at most this many slots (cannot co-batch).
    cap_parallel: int | None = None
    profile: Mapping[str, Any] | None = None
    #: KV layout of the B/C server: split (every slot owns ctx) or unified (one ctx*N pool).
    kv_layout: KvLayout = "split"

    def plan(self, workset: Workset) -> CellPlan:
        return CellPlan(
            items=expand_reps(workset.items, self.reps),
            ctx=self.ctx,
            parallel=self.parallel,
            gate_passes=self.gate_passes,
            n_predict=self.n_predict,
            seed=self.seed,
            endpoint=self.endpoint,
            n_probs=self.n_probs,
            serial_repeat=self.serial_repeat,
            req_timeout=self.req_timeout,
        )

    def launcher(self) -> LiveLauncher:
        return LiveLauncher(
            self.server_bin,
            self.model,
            self.gguf,
            self.out_dir,
            port_policy=self.port_policy,
            server_flags=self.server_flags,
            max_footprint_gb=self.max_footprint_gb,
            ready_timeout=self.ready_timeout,
            cap_parallel=self.cap_parallel,
            kv_layout=self.kv_layout,
        )


def _check_file(path: Path | None, flag: str, what: str, executable: bool = False) -> Path:
    if path is None:
        raise UsageError(f"{flag} is required ({what})")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    if executable and not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {path}: not executable (chmod +x it)")
    return path


def _prepare_out_dir(out_dir: Path) -> Path:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out-dir {out_dir}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(out_dir, os.W_OK):
        raise UsageError(f"--out-dir {out_dir}: not writable")
    return out_dir


def check_numbers(args: argparse.Namespace) -> None:
    """Validate the numeric options shared by run-live and demo (UsageError on the first)."""
    if args.ctx < 1:
        raise UsageError(f"--ctx must be positive (got {args.ctx})")
    if args.parallel < 2:
        raise UsageError("--parallel must be at least 2 for the C arm to co-batch anything")
    for name, value in (
        ("--gate-passes", args.gate_passes),
        ("--reps", args.reps),
        ("--n-predict", args.n_predict),
    ):
        if value < 1:
            raise UsageError(f"{name} must be at least 1 (got {value})")
    if args.n_probs is not None and args.n_probs < 2:
        raise UsageError("--n-probs must be at least 2 (the top-1 vs top-2 margin needs two)")
    for name, fvalue in (
        ("--req-timeout", args.req_timeout),
        ("--ready-timeout", args.ready_timeout),
    ):
        if fvalue <= 0:
            raise UsageError(f"{name} must be positive (got {fvalue})")
    if args.max_footprint_gb is not None and args.max_footprint_gb <= 0:
        raise UsageError("--max-footprint-gb must be positive")
    policy_from_args(args)  # the policy options too, before anything is provisioned


def cell_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`LiveConfig` fields that come straight from the shared cell options
    (``add_cell_options``), so run-live and demo read them the same way."""
    return {
        "ctx": args.ctx,
        "parallel": args.parallel,
        "gate_passes": args.gate_passes,
        "reps": args.reps,
        "n_predict": args.n_predict,
        "seed": args.seed,
        "endpoint": args.endpoint,
        "n_probs": args.n_probs,
        "serial_repeat": not args.no_serial_repeat,
        "req_timeout": args.req_timeout,
        "ready_timeout": args.ready_timeout,
        "max_footprint_gb": args.max_footprint_gb,
    }


def add_policy_options(p: argparse.ArgumentParser) -> None:
    """The gate-policy options of run-live, demo and run-mock. Stricter than the defaults is
    always allowed; looser is accepted but the cert is never promotable."""
    p.add_argument(
        "--min-hot-trials",
        type=int,
        default=DEFAULT_MIN_HOT_TRIALS,
        help=f"GREEN needs this many co-batched comparisons (default {DEFAULT_MIN_HOT_TRIALS}; "
        "lower is never promotable)",
    )
    p.add_argument(
        "--min-answer-tokens",
        type=int,
        default=DEFAULT_MIN_ANSWER_TOKENS,
        help="GREEN needs a median generated length of at least this many tokens (default "
        f"{DEFAULT_MIN_ANSWER_TOKENS}; lower is never promotable)",
    )
    p.add_argument(
        "--max-bound",
        type=float,
        default=DEFAULT_MAX_BOUND,
        help="GREEN needs the 95%% upper bound on the per-prompt divergence rate at or below "
        f"this (default {DEFAULT_MAX_BOUND:g}, i.e. >= 30 distinct prompts; higher is never "
        "promotable)",
    )


def policy_from_args(args: argparse.Namespace) -> GatePolicy:
    """The gate policy the options ask for (F4 armed only with ``--n-probs``)."""
    if args.min_hot_trials < 1:
        raise UsageError(f"--min-hot-trials must be at least 1 (got {args.min_hot_trials})")
    if args.min_answer_tokens < 1:
        raise UsageError(f"--min-answer-tokens must be at least 1 (got {args.min_answer_tokens})")
    if not 0.0 < args.max_bound <= 1.0:
        raise UsageError(f"--max-bound must be a rate in (0, 1] (got {args.max_bound:g})")
    n_probs = getattr(args, "n_probs", None)
    return GatePolicy(
        min_hot_trials=args.min_hot_trials,
        logit_eps=args.logit_eps if n_probs is not None else None,
        min_answer_tokens=args.min_answer_tokens,
        max_bound=args.max_bound,
    )


def config_from_args(args: argparse.Namespace, *, create_out_dir: bool = True) -> LiveConfig:
    """Validate the parsed options into a :class:`LiveConfig` (UsageError on any problem)."""
    if args.cert_source not in (None, "live"):
        raise UsageError("--cert-source accepts only 'live'")
    prof = resolve_profile(args)
    server_bin = args.server_bin or (prof.server_bin if prof else None)
    model = args.model or (prof.model if prof else None)
    server_bin = _check_file(server_bin, "--server-bin", "path to llama-server", executable=True)
    model = _check_file(model, "--model", "path to a GGUF model")
    if args.ctx is None or args.parallel is None:
        raise UsageError("--ctx and --parallel are required (tokens per slot, and N)")
    check_numbers(args)
    flags = tuple(prof.server_flags if prof else (args.server_flag or ()))
    clash = owned_flag_conflicts(flags)
    if clash:
        raise UsageError(
            f"--server-flag {clash[0]} conflicts with what run-live sets itself "
            "(model, host, port, parallel, ctx, KV layout); use the run-live option instead"
        )
    if args.workset is not None:
        workset: Workset | None = load_workset(args.workset)
        builder = None
    elif prof is not None and prof.build_workset is not None:
        workset, builder = None, prof.build_workset
    else:
        raise UsageError("--workset FILE is required (or --profile NAME --model-alias ALIAS)")
    scorer = prof.scorer if prof is not None else load_scorer(args.scorer)
    port_policy = ports.make_policy(args.port, args.reserved_port)
    gguf = parse_info(model)
    if args.out_dir is None:
        raise UsageError("--out-dir DIR is required (where the cert and server logs go)")
    out_dir = _prepare_out_dir(args.out_dir) if create_out_dir else args.out_dir
    policy = policy_from_args(args)
    name = (prof.model_name if prof and prof.model_name else None) or model.name.removesuffix(
        ".gguf"
    )
    return LiveConfig(
        server_bin=server_bin.resolve(),
        model=model.resolve(),
        gguf=gguf,
        model_name=name,
        workset=workset,
        build_workset=builder,
        scorer=scorer,
        policy=policy,
        server_flags=flags,
        port_policy=port_policy,
        out_dir=out_dir,
        profile=None if prof is None else dict(prof.provenance),
        kv_layout=getattr(args, "kv_layout", "split"),
        **cell_fields(args),
    )


# ---------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class LiveOutcome:
    """A finished live cell: the written cert and the run (timings, launches)."""

    finished: FinishedCell
    run: CellRun
    launcher: LiveLauncher
    workset: Workset


def _calibrated_workset(cfg: LiveConfig, base_url: str) -> Workset:
    """Freeze a profile's work-set against the real tokenizer of the running A server."""
    from batch_invariance.profiles.tokens import server_token_counter

    assert cfg.build_workset is not None
    workset = cfg.build_workset(cfg.ctx, server_token_counter(base_url))
    check_room_to_answer(workset, cfg.ctx, cfg.n_predict)
    return workset


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


def provenance_for(
    cfg: LiveConfig,
    workset: Workset,
    launcher: LiveLauncher,
    n_items: int,
    binary: BinaryIdentity,
    model_sha: str,
) -> dict[str, Any]:
    """The caller's provenance block (merged over the driver's own in ``finish_cell``)."""
    return {
        "tool_version": __version__,
        "driver": cfg.driver_name,
        "server_binary": {
            "path": binary.path,
            "sha256": binary.sha256,
            "version": binary.version,
            "version_rc": binary.version_rc,
        },
        "model_file": {
            "path": str(cfg.model),
            "name": cfg.model.name,
            "sha256": model_sha,
            "size": cfg.gguf.file_size,
            "gguf": cfg.gguf.summary(),
        },
        "is_moe": cfg.gguf.is_moe,
        "workset": {
            "source": workset.source,
            "sha256": workset.sha256,
            "n_rows": len(workset.items),
            "n_items": n_items,
        },
        "server_flags": list(cfg.server_flags),
        "host": hostinfo.summary(),
        "memory_guard": {
            "max_footprint_gb": cfg.max_footprint_gb,
            "launches": [
                {
                    "arm": r.arm,
                    "parallel": r.parallel,
                    "ctx_per_slot": r.ctx,
                    "projected_bytes": r.projected_bytes,
                    "rss_peak_bytes": r.rss_peak_bytes,
                    "ready_s": None if r.ready_s is None else round(r.ready_s, 3),
                    "alive_s": None if r.alive_s is None else round(r.alive_s, 3),
                }
                for r in launcher.launches
            ],
        },
        "profile": None if cfg.profile is None else dict(cfg.profile),
    }


def preflight_guard(cfg: LiveConfig, launcher: LiveLauncher) -> None:
    """Run the memory guard for BOTH servers before the first launch (GuardRefused).

    The launcher guards again right before each launch (memory may have changed); this only
    spares a run whose B/C server could never fit from spending arm A first.
    """
    for n in (1, cfg.parallel):
        slots = launcher.effective_parallel(n)
        proj = memory.project(cfg.gguf, cfg.ctx, slots, cfg.server_flags)
        memory.check(proj, cfg.max_footprint_gb, cfg.server_flags)


def run_live_cell(cfg: LiveConfig, progress: ProgressSink | None = None) -> LiveOutcome:
    """Run one live cell and write its cert. Raises on infrastructure failure or interrupt.

    Nothing is written unless the whole cell ran: an aborted server (memory cap), a failed
    launch or a signal raise before :func:`finish_cell`.
    """
    launcher = cfg.launcher()
    preflight_guard(cfg, launcher)
    # Identify binary and model before the cell: what ran is what gets recorded.
    binary = identify_binary(cfg.server_bin)
    model_sha = cached_sha256(cfg.model, cache_root() / "hashes.json")
    if cfg.workset is not None:
        workset = cfg.workset
        plan = cfg.plan(workset)
        run = run_cell(plan, launcher, cfg.scorer, progress=progress)
    else:
        from batch_invariance.profiles.calibration import PrelaunchedLauncher

        # A profile's work-set is calibrated on the A server itself (its /tokenize), which
        # the driver then gets as arm A's server: one launch, and the same frozen bodies
        # go to every arm.
        with PrelaunchedLauncher(launcher, ctx=cfg.ctx) as pre:
            workset = _calibrated_workset(cfg, pre.handle.base_url)
            plan = cfg.plan(workset)
            run = run_cell(plan, pre, cfg.scorer, progress=progress)
    if launcher.aborted is not None:
        raise InfraError(launcher.aborted)
    spec = CellSpec(
        model=cfg.model_name,
        ctx=cfg.ctx,
        dispatch_n=cfg.parallel,
        kv_label=run.kv_label,
        reps=cfg.reps,
        is_moe=cfg.gguf.is_moe,
    )
    provenance = provenance_for(cfg, workset, launcher, len(plan.items), binary, model_sha)
    finished = finish_cell(run, spec, cfg.policy, provenance, cfg.out_dir)
    return LiveOutcome(finished=finished, run=run, launcher=launcher, workset=workset)


def execute(args: argparse.Namespace) -> FinishedCell:
    """Validate, run and write the cert (no printing); used by the handler and the Action."""
    if getattr(args, "dry_run", False):
        raise UsageError("execute() does not do --dry-run; call the handler")
    cfg = config_from_args(args)
    return run_live_cell(cfg, progress=Progress()).finished


# ---------------------------------------------------------------------------- output


def _gib(n: int) -> str:
    return f"{n / memory.GIB:.2f} GiB"


def eta_seconds(cfg: LiveConfig, n_items: int) -> float:
    """A rough wall-time estimate from model size (see the constants above)."""
    per_token_s = _ETA_MS_PER_TOKEN_PER_GIB * (cfg.gguf.file_size / memory.GIB) / 1000.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_token_s *= 2.0 / max(cpus or 2, 1)
    per_request = per_token_s * cfg.n_predict
    serial = n_items * per_request * (3 if cfg.serial_repeat else 2)
    concurrent = cfg.gate_passes * n_items * per_request / _ETA_CONCURRENT_SPEEDUP
    return 2 * 5.0 + serial + concurrent


def print_dry_run(cfg: LiveConfig, out: Any = None) -> int:
    """Print the plan (argv of each server, requests, memory, ETA); launch nothing."""
    stream = out if out is not None else sys.stdout
    port = str(cfg.port_policy.fixed) if cfg.port_policy.fixed is not None else "<free>"
    n_items = len(cfg.workset.items) * cfg.reps if cfg.workset is not None else None
    host = memory.read_host_memory()
    gpu = memory.offloads_to_gpu(cfg.server_flags)
    refused: str | None = None
    print(
        f"dry run: cell {cfg.model_name} ctx={cfg.ctx} N={cfg.parallel} (nothing launched)",
        file=stream,
    )
    for arm, n in (("A", 1), ("BC", cfg.parallel)):
        argv = build_argv(
            cfg.server_bin,
            cfg.model,
            host=ports.LOOPBACK,
            port=0,
            parallel=n,
            ctx=cfg.ctx,
            extra_flags=cfg.server_flags,
            kv_layout=cfg.kv_layout if n > 1 else "split",
        )
        shown = [port if a == "0" and i > 0 and argv[i - 1] == "--port" else a
                 for i, a in enumerate(argv)]  # fmt: skip
        proj = memory.project(cfg.gguf, cfg.ctx, n, cfg.server_flags)
        decision = memory.evaluate(proj, host, cfg.max_footprint_gb, gpu)
        refused = refused or decision.refusal
        print(f"server {arm}: {' '.join(shown)}", file=stream)
        print(
            f"  kv: {kv_label(cfg.ctx, n, cfg.kv_layout if n > 1 else 'split')}; projected "
            f"{_gib(proj.total_bytes)} (weights "
            f"{_gib(proj.weights_bytes)} + KV {_gib(proj.kv_bytes)} + overhead "
            f"{_gib(proj.overhead_bytes)}); guard: {decision.refusal or 'ok'}",
            file=stream,
        )
    avail = host.mem_available_bytes
    cap = "none" if cfg.max_footprint_gb is None else f"{cfg.max_footprint_gb:g} GiB"
    print(
        f"memory: cap {cap}; available now {_gib(avail) if avail is not None else 'unknown'}"
        + (f"; VRAM free {_gib(host.vram_free_bytes)}" if host.vram_free_bytes else ""),
        file=stream,
    )
    if n_items is not None:
        arms = "A, A', B" if cfg.serial_repeat else "A, B"
        serial_arms = 3 if cfg.serial_repeat else 2
        total = n_items * (serial_arms + cfg.gate_passes)
        print(
            f"requests: {total} = {n_items} items x ({arms} + {cfg.gate_passes} C passes of "
            f"{cfg.parallel} workers); endpoint {cfg.endpoint}; n_predict {cfg.n_predict}",
            file=stream,
        )
        eta = eta_seconds(cfg, n_items)
        print(f"ETA: ~{eta / 60:.1f} min (rough: from model size and CPU count)", file=stream)
    else:
        print("requests: the profile's work-set is built on a calibration server", file=stream)
    cert_name = f"{cfg.model_name}__ctx{cfg.ctx}__N{cfg.parallel}.json"
    print(f"out-dir: {cfg.out_dir} (cert {cert_name})", file=stream)
    if refused is not None:
        print(f"batch-invariance: the memory guard would refuse: {refused}", file=sys.stderr)
        return exitcodes.USAGE
    return exitcodes.PROMOTABLE


def report(finished: FinishedCell, label: str, out: Any = None) -> int:
    """Print the verdict banner, gates and reasons; return the exit code for the cert."""
    stream = out if out is not None else sys.stdout
    cert = finished.cert
    shown = display_verdict(cert.status)
    bar = "=" * 72
    print(bar, file=stream)
    klass = f" / {cert.divergence_class}" if cert.divergence_class else ""
    print(f"  {shown}{klass}  {label} ctx={cert.ctx} N={cert.dispatch_n}", file=stream)
    print(bar, file=stream)
    gates = (
        f"overlap {'met' if cert.overlap.ok else 'NOT met'}, "
        f"floor {'met' if cert.completion_floor.ok else 'NOT met'}, "
        f"coverage {'met' if cert.cobatch_coverage.ok else 'NOT met'}, "
        f"transport {'clean' if cert.transport.ok else 'failures'}"
    )
    print(f"  gates: {gates}", file=stream)
    ac = cert.divergence_report.ac
    print(
        f"  AC divergent ids: {ac.n_divergent}/{ac.n_compared} over {cert.n_passes} passes",
        file=stream,
    )
    for reason in cert.decision_reasons:
        print(f"  - {reason}", file=stream)
    print(f"cert: {finished.path}", file=stream)
    if finished.superseded is not None:
        print(f"previous cert moved to: {finished.superseded}", file=stream)
    promotable = is_promotable(cert)
    return exitcodes.for_status(cert.status, promotable)


# ---------------------------------------------------------------------------- CLI


def add_cell_options(p: argparse.ArgumentParser, *, defaults: Mapping[str, Any]) -> None:
    """Options shared by ``run-live`` and ``demo`` (``defaults`` differ)."""
    p.add_argument("--gate-passes", type=int, default=defaults["gate_passes"], help="C passes T")
    p.add_argument("--reps", type=int, default=defaults["reps"], help="repeat each row R times")
    p.add_argument(
        "--n-predict", type=int, default=defaults["n_predict"], help="token budget per request"
    )
    p.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default=defaults.get("endpoint", "chat"),
        help="chat: /v1/chat/completions (default); completions: raw prompts to /v1/completions",
    )
    p.add_argument("--seed", type=int, default=0, help="dispatch-order and request seed")
    p.add_argument("--port", type=int, default=None, help="fixed port (default: a free one)")
    p.add_argument(
        "--reserved-port",
        type=int,
        action="append",
        default=[],
        help="never bind or address this port (repeatable; 8080 is always reserved)",
    )
    p.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="extra llama-server argument (repeatable; values may start with '-')",
    )
    p.add_argument("--n-probs", type=int, default=None, help="arm F4: top-K logprobs per token")
    p.add_argument(
        "--logit-eps",
        type=float,
        default=DEFAULT_LOGIT_EPS,
        help=f"F4 drift threshold with --n-probs (default {DEFAULT_LOGIT_EPS})",
    )
    add_policy_options(p)
    p.add_argument("--max-footprint-gb", type=float, default=None, help="memory cap (GiB)")
    p.add_argument("--req-timeout", type=float, default=DEFAULT_REQ_TIMEOUT, help="seconds")
    p.add_argument(
        "--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT, help="server start, seconds"
    )
    p.add_argument(
        "--no-serial-repeat", action="store_true", help="skip the A' serial-repeat control"
    )
    p.add_argument("--scorer", default=None, help="pkg.mod:NAME or file.py:NAME")
    p.add_argument("--dry-run", action="store_true", help="print the plan; launch nothing")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "run-live",
        help="run one real cell against llama-server and write its cert",
        description=(
            "Runs arms A (--parallel 1, serial), A' (serial repeat), B (--parallel N, serial) "
            "and T concurrent C passes against real llama-server processes it starts on "
            "loopback, then writes one cert per cell in --out-dir. Exit: 0 GREEN+promotable, "
            "1 RED, 2 usage/guard, 3 AMBER/UNVERIFIED, 4 infrastructure, 130/143 signals."
        ),
    )
    p.add_argument("--server-bin", type=Path, default=None, help="path to llama-server")
    p.add_argument("--model", type=Path, default=None, help="GGUF model file")
    p.add_argument("--workset", type=Path, default=None, help="work-set JSON")
    p.add_argument("--ctx", type=int, default=None, help="context tokens per slot (C)")
    p.add_argument("--parallel", type=int, default=None, help="slots N of the B/C server")
    p.add_argument(
        "--cert-source",
        choices=("live",),
        default=None,
        help="accepted for compatibility; only 'live' (the driver sets the source itself)",
    )
    p.add_argument("--out-dir", type=Path, default=None, help="folder for the cert and logs")
    p.add_argument(
        "--kv-layout",
        choices=("split", "unified"),
        default="split",
        help="B/C server KV cache: split (each slot owns ctx) or unified (-kvu, one ctx*N pool)",
    )
    add_cell_options(
        p,
        defaults={
            "gate_passes": DEFAULT_GATE_PASSES,
            "reps": DEFAULT_REPS,
            "n_predict": DEFAULT_N_PREDICT,
        },
    )
    prof = p.add_argument_group("profile (the spark measurement profile; see docs)")
    prof.add_argument("--profile", default=None, help="bundled profile name or a folder")
    prof.add_argument("--model-alias", default=None, help="model alias in the profile registry")
    prof.add_argument("--models-dir", default=None, help="fills {MODELS_DIR} (or $MODELS_DIR)")
    prof.add_argument("--models-file", default=None, help="models.toml (default: searched)")
    prof.add_argument("--corner", default=None, help="profile work-set corner")
    prof.add_argument(
        "--profile-seed", type=int, default=None, help="profile work-set generator seed"
    )
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    if args.dry_run:
        return print_dry_run(config_from_args(args, create_out_dir=False))
    cfg = config_from_args(args)
    outcome = run_live_cell(cfg, progress=Progress())
    return report(outcome.finished, f"live cell {cfg.model_name}")
