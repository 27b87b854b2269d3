"""``run-live --engine E`` (a work-alike engine) and ``run-live --base-url URL`` (attach mode).

The default path, llama-server launched by the tool, stays in :mod:`.run_live`. This module
runs the same cell (:func:`~batch_invariance.run.cell.run_cell` and
:func:`~batch_invariance.run.cell.finish_cell`) over the engine layer's launchers:

- ``--engine llama-cpp-python|vllm|sglang``: ``engines.launch.EngineLauncher`` starts the
  engine's own server (``--server-bin`` is its executable or Python interpreter);
  ``source: live``.
- ``--base-url``: :class:`~batch_invariance.engines.attach.AttachLauncher` measures a server the
  tool did not start (``--engine`` picks which busy witness to read); ``source: attached``,
  never promotable. Loopback only unless ``--allow-remote``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.certificate import is_promotable
from batch_invariance.cert.render import live_banner
from batch_invariance.core.evidence import CellSpec
from batch_invariance.core.plan import CellPlan
from batch_invariance.engines import ports
from batch_invariance.engines.attach import AttachLauncher, attach_target
from batch_invariance.engines.base import flag_conflicts
from batch_invariance.engines.gguf import cached_sha256, sha256_file
from batch_invariance.engines.launch import EngineLauncher
from batch_invariance.engines.provision import cache_root
from batch_invariance.engines.registry import DEFAULT_ENGINE, ENGINES, engine_for
from batch_invariance.errors import UsageError
from batch_invariance.run.cell import ServerLauncher, run_cell
from batch_invariance.run.finish import FinishedCell, finish_cell
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import expand_reps, load_workset


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine``, and the attach-mode options, on ``run-live``."""
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


def uses_engine_layer(args: argparse.Namespace) -> bool:
    """Whether this run-live goes through the engine layer rather than the llama-server path."""
    return args.base_url is not None or getattr(args, "engine", DEFAULT_ENGINE) != DEFAULT_ENGINE


def _file_sha(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None


def _out_dir(path: Path | None) -> Path:
    if path is None:
        raise UsageError("--out-dir DIR is required (where the cert and server logs go)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out-dir {path}: cannot create it ({exc.strerror or exc})") from None
    return path


def run_engine_cell(args: argparse.Namespace, progress: ProgressSink | None = None) -> FinishedCell:
    """Validate, run and write the cert of an engine-layer cell (UsageError on bad input)."""
    from batch_invariance.commands.cell_options import request_from_args

    if args.dry_run:
        raise UsageError("--dry-run is not available with --engine or --base-url")
    if getattr(args, "profile", None) is not None:
        raise UsageError("--profile works only with the default engine (llama-server, launched)")
    req = request_from_args(args)
    if req.ctx is None or req.parallel is None or req.workset is None:
        raise UsageError("--ctx, --parallel and --workset are required")
    if args.metrics_url is not None and args.base_url is None:
        raise UsageError("--metrics-url goes with --base-url (attach mode)")
    req.check_numbers()
    engine = engine_for(args.engine)
    flags = tuple(req.server_flags)
    if flags and args.base_url is not None:
        raise UsageError("--server-flag has no effect on an attached server; drop it")
    problems = flag_conflicts(engine, flags)
    if problems:
        raise UsageError(f"--server-flag {problems[0]}")
    workset = load_workset(req.workset)
    scorer = load_scorer(req.scorer)
    plan = CellPlan(
        items=expand_reps(workset.items, req.reps), ctx=req.ctx, parallel=req.parallel,
        gate_passes=req.gate_passes, n_predict=req.n_predict, seed=req.seed,
        endpoint=req.endpoint, n_probs=req.n_probs, serial_repeat=req.serial_repeat,
        req_timeout=req.req_timeout,
    )  # fmt: skip
    out_dir = _out_dir(req.out_dir)
    launcher: ServerLauncher
    provenance: dict[str, Any] = {"tool_version": __version__, "driver": "run-live"}
    if args.base_url is not None:
        target = attach_target(args.base_url, args.metrics_url, args.allow_remote)
        launcher = AttachLauncher(target, engine)
        model_name = req.model.name if req.model is not None else "attached"
        provenance["attach"] = target.to_record()
    else:
        if req.server_bin is None or req.model is None:
            raise UsageError(f"--server-bin and --model are required for --engine {engine.name}")
        if not req.server_bin.exists():
            raise UsageError(f"--server-bin {req.server_bin}: not found")
        launcher = EngineLauncher(
            engine, req.server_bin, req.model, out_dir,
            port_policy=ports.make_policy(req.port, req.reserved_ports), server_flags=flags,
            env=dict(os.environ), ready_timeout=req.ready_timeout,
        )  # fmt: skip
        model_name = req.model.name.removesuffix(".gguf")
        model_sha = (
            cached_sha256(req.model, cache_root() / "hashes.json") if req.model.is_file() else None
        )
        provenance["server_binary"] = {
            "path": str(req.server_bin),
            "sha256": _file_sha(req.server_bin),
        }
        provenance["model_file"] = {
            "path": str(req.model), "name": req.model.name, "sha256": model_sha,
        }  # fmt: skip
    run = run_cell(plan, launcher, scorer, progress=progress)
    provenance.update(
        engine=engine.name,
        server_flags=list(flags),
        workset={"source": workset.source, "sha256": workset.sha256,
                 "n_rows": len(workset.items), "n_items": len(plan.items)},
    )  # fmt: skip
    spec = CellSpec(
        model=model_name, ctx=req.ctx, dispatch_n=req.parallel, kv_label=run.kv_label,
        reps=req.reps,
    )  # fmt: skip
    return finish_cell(run, spec, req.policy(), provenance, out_dir)


def report_engine_cell(finished: FinishedCell, label: str) -> int:
    """Print the verdict banner of an engine-layer cell; return its exit code."""
    sys.stdout.write(live_banner(finished.cert, finished.path, finished.superseded, label))
    return exitcodes.for_status(finished.cert.status, is_promotable(finished.cert))
