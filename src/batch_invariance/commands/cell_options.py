"""The cell options ``run-live`` and ``demo`` share, and the one reader that turns them into
a :class:`~batch_invariance.service.live.LiveRequest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.commands.reply import error_line
from batch_invariance.core.evidence import (
    DEFAULT_LOGIT_EPS,
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    GatePolicy,
)
from batch_invariance.core.plan import Measurement
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES
from batch_invariance.errors import PlanUnreachable
from batch_invariance.host import memory
from batch_invariance.report.render import live_banner
from batch_invariance.service.dry_run import dry_run, usable_cpus
from batch_invariance.service.endpoint import ENDPOINT_CHOICES
from batch_invariance.service.live import LiveCell, LiveOutcome
from batch_invariance.service.options import LaunchOptions
from batch_invariance.service.reach import cannot_be_green
from batch_invariance.service.request import (
    DEFAULT_MIN_HOT_TRIALS,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_REQ_TIMEOUT,
    DEFAULT_SEED,
    AttachRequest,
    CellDefaults,
    LiveRequest,
    ProfileRequest,
)


def add_target_options(p: argparse.ArgumentParser) -> None:
    """What a live run measures and where it writes (``run-live`` and ``sweep``; each adds
    its own ``--parallel``)."""
    p.add_argument("--server-bin", type=Path, default=None, help="path to llama-server")
    p.add_argument("--model", type=Path, default=None, help="GGUF model file")
    p.add_argument(
        "--workset",
        type=Path,
        default=None,
        help="work-set JSON (default: the length ladder, 32 prompts filling the slot)",
    )
    p.add_argument("--ctx", type=int, default=None, help="context tokens per slot (C)")
    p.add_argument("--out-dir", type=Path, default=None, help="folder for the certs and logs")
    p.add_argument(
        "--kv-layout",
        choices=("split", "unified"),
        default="split",
        help="B/C server KV cache: split (each slot owns ctx) or unified (-kvu, one ctx*N pool)",
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


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine`` and the attach-mode options (``run-live`` and ``sweep``; a sweep refuses
    ``--base-url`` with a usage error saying why)."""
    g = p.add_argument_group("engines and attach mode (see docs/engines.md)")
    g.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default=DEFAULT_ENGINE,
        help="which server to launch (or, with --base-url, whose busy witness to read)",
    )
    g.add_argument(
        "--base-url",
        default=None,
        help="attach to a running server the tool did not start (e.g. http://127.0.0.1:8080); "
        "arm A is not available and the cert (source: attached) is never promotable",
    )
    g.add_argument("--metrics-url", default=None, help="its Prometheus /metrics, if elsewhere")
    g.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --base-url (recorded)"
    )


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
    p.add_argument(
        "--min-slot-fill",
        type=float,
        default=None,
        help="GREEN needs the longest co-batched sequence (prompt + answer) at this share of "
        "the slot or more (default 0.75; lower is never promotable)",
    )


def add_cell_options(p: argparse.ArgumentParser, *, defaults: CellDefaults) -> None:
    """Options shared by ``run-live`` and ``demo`` (``defaults`` differ)."""
    m = defaults.measurement
    p.add_argument("--gate-passes", type=int, default=m.gate_passes, help="C passes T")
    p.add_argument("--reps", type=int, default=m.reps, help="repeat each row R times")
    p.add_argument("--n-predict", type=int, default=m.n_predict, help="token budget per request")
    p.add_argument(
        "--endpoint",
        choices=ENDPOINT_CHOICES,
        default=defaults.endpoint,
        help="chat: /v1/chat/completions; completions: raw prompts to /v1/completions; auto: "
        "completions for a GGUF without a chat template of its own (a base model), else chat "
        f"(default: {defaults.endpoint})",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="dispatch-order and request seed")
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
    p.add_argument(
        "--n-probs", type=int, default=None, help="top-K pre-sampling logprobs per token (2)"
    )
    p.add_argument(
        "--logit-eps",
        type=float,
        default=DEFAULT_LOGIT_EPS,
        help=f"F4 numeric drift threshold (default {DEFAULT_LOGIT_EPS:g}: bitwise equality; "
        "a positive eps is never promotable)",
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
    p.add_argument(
        "--stop-on-red",
        action=argparse.BooleanOptionalAction,
        default=m.stop_on_red,
        help="end the cell at the first C pass that proves RED "
        f"(default: {'on' if m.stop_on_red else 'off'})",
    )
    cache = p.add_argument_group("prompt cache (see docs/output-contract.md, prompt_cache)")
    cache.add_argument(
        "--cache-arm",
        action="store_true",
        help="also measure with the prompt cache on, as deployed clients use it: requests "
        "without cache_prompt, N at once, on a server with its default --cache-ram",
    )
    cache.add_argument(
        "--cache-ram",
        type=int,
        default=None,
        help="MiB: the --cache-ram under test (with --cache-arm)",
    )
    cache.add_argument(
        "--cache-shape",
        type=int,
        nargs="?",
        const=3,
        default=None,
        metavar="TURNS",
        help="turn the work-set into conversations of TURNS (3) behind one shared preamble, "
        "so the cache arm really reuses cached prompts",
    )
    p.add_argument("--scorer", default=None, help="pkg.mod:NAME or file.py:NAME")
    p.add_argument("--dry-run", action="store_true", help="print the plan; launch nothing")


def _path(value: Any) -> Path | None:
    return None if value is None else Path(value)


def _profile(args: argparse.Namespace) -> ProfileRequest | None:
    if not any(getattr(args, f, None) for f in ("profile", "model_alias", "models_dir",
                                               "models_file", "corner")):  # fmt: skip
        return None
    return ProfileRequest(
        name=getattr(args, "profile", None),
        model_alias=getattr(args, "model_alias", None),
        models_dir=getattr(args, "models_dir", None),
        models_file=getattr(args, "models_file", None),
        corner=getattr(args, "corner", None),
        seed=getattr(args, "profile_seed", None),
    )


def measurement_from_args(args: argparse.Namespace) -> Measurement:
    """How every arm and pass is measured, as the command line asks (its endpoint is the
    request's ``endpoint``, decided by ``prepare``)."""
    return Measurement(
        gate_passes=args.gate_passes,
        reps=args.reps,
        n_predict=args.n_predict,
        seed=args.seed,
        n_probs=args.n_probs,
        serial_repeat=not args.no_serial_repeat,
        stop_on_red=args.stop_on_red,
        req_timeout=args.req_timeout,
        cache_passes=1 if getattr(args, "cache_arm", False) else 0,
    )


def policy_from_args(args: argparse.Namespace) -> GatePolicy:
    """The gate policy the command line asks for (F4 always armed, at ``--logit-eps``)."""
    return GatePolicy(
        min_hot_trials=args.min_hot_trials,
        logit_eps=getattr(args, "logit_eps", DEFAULT_LOGIT_EPS),
        min_answer_tokens=args.min_answer_tokens,
        max_bound=args.max_bound,
        min_slot_fill=args.min_slot_fill,
    )


def request_from_args(args: argparse.Namespace, **fixed: Any) -> LiveRequest:
    """The one reader of the shared cell options (``fixed`` sets what the command decides)."""
    values: dict[str, Any] = {
        "out_dir": _path(args.out_dir),
        "server_bin": _path(getattr(args, "server_bin", None)),
        "model": _path(getattr(args, "model", None)),
        "workset": _path(args.workset),
        "ctx": args.ctx,
        "parallel": args.parallel,
        "measurement": measurement_from_args(args),
        "launch": LaunchOptions(
            ready_timeout=args.ready_timeout,
            max_footprint_gb=args.max_footprint_gb,
            kv_layout=getattr(args, "kv_layout", "split"),
            cache_ram=getattr(args, "cache_ram", None),
        ),
        "policy": policy_from_args(args),
        "attach": AttachRequest(
            base_url=getattr(args, "base_url", None),
            metrics_url=getattr(args, "metrics_url", None),
            allow_remote=bool(getattr(args, "allow_remote", False)),
        ),
        "profile": _profile(args),
        "cache_shape": getattr(args, "cache_shape", None),
        "server_flags": tuple(args.server_flag or ()),
        "scorer": args.scorer,
        "port": args.port,
        "reserved_ports": tuple(args.reserved_port or ()),
        "engine": getattr(args, "engine", DEFAULT_ENGINE),
        "endpoint": args.endpoint,
    }
    values.update(fixed)
    return LiveRequest(**values)


def print_dry_run(job: LiveCell) -> int:
    """Print the plan of ``job`` (launch nothing); exit 2 when the guard would refuse or the
    plan cannot reach GREEN whatever the server does (one line per cause, with its fix)."""
    plan = dry_run(job, memory.read_host_memory(), usable_cpus())
    sys.stdout.write(plan.text)
    code = exitcodes.PROMOTABLE
    if plan.refusal is not None:
        print(f"batch-invariance: the memory guard would refuse: {plan.refusal}", file=sys.stderr)
        code = exitcodes.USAGE
    causes = cannot_be_green(job)
    if causes:
        print(error_line(PlanUnreachable(causes)), file=sys.stderr)
        code = exitcodes.USAGE
    return code


def refuse_unreachable(job: LiveCell) -> None:
    """Before any server starts, refuse the plan its ``--dry-run`` refuses as one that cannot
    reach GREEN (:class:`PlanUnreachable`: the same lines, exit 2), so a real run never spends
    its time on a verdict that could only be UNVERIFIED. Looser gate flags (``--max-bound``,
    ``--min-answer-tokens``, ``--min-slot-fill``) change the plan's gates, never promotable."""
    causes = cannot_be_green(job)
    if causes:
        raise PlanUnreachable(causes)


def cell_label(job: LiveCell, kind: str = "live") -> str:
    """The banner's name for a cell: ``live cell M``, with the engine when it is not the
    default, and the URL when attached."""
    engine_name = job.target.engine.name
    attach = job.target.attach
    if attach is not None:
        return f"attached {engine_name} cell {job.model_name} ({attach.base_url})"
    engine = "" if engine_name == DEFAULT_ENGINE else f"{engine_name} "
    return f"{kind} {engine}cell {job.model_name}"


def endpoint_line(job: LiveCell) -> str:
    """The line above the banner naming the endpoint ``--endpoint auto`` chose, and why
    (empty: the endpoint was given outright)."""
    chosen = job.endpoint
    return "" if chosen is None or chosen.why is None else chosen.line() + "\n"


def report(outcome: LiveOutcome, label: str) -> int:
    """Print the verdict banner; return the exit code for the cert."""
    finished = outcome.finished
    sys.stdout.write(endpoint_line(outcome.job))
    sys.stdout.write(live_banner(finished.cert, finished.path, finished.superseded, label))
    return exitcodes.for_status(finished.verdict.status, finished.promotable)
