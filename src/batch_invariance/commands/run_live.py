"""`batch-invariance run-live`: one real cell against the user's own ``llama-server``.

request (argparse -> :class:`~batch_invariance.run.live.LiveRequest`) -> service
(:func:`~batch_invariance.run.live.run_live_cell`) -> render (the banner) -> exit code.
``--dry-run`` prints the plan and launches nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batch_invariance.commands.cell_options import (
    add_cell_options,
    print_dry_run,
    report,
    request_from_args,
)
from batch_invariance.commands.run_engine import (
    add_engine_options,
    report_engine_cell,
    run_engine_cell,
    uses_engine_layer,
)
from batch_invariance.run.live import RUN_LIVE_DEFAULTS, run_live_cell
from batch_invariance.run.progress import Progress


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
    p.add_argument("--out-dir", type=Path, default=None, help="folder for the cert and logs")
    p.add_argument(
        "--kv-layout",
        choices=("split", "unified"),
        default="split",
        help="B/C server KV cache: split (each slot owns ctx) or unified (-kvu, one ctx*N pool)",
    )
    add_cell_options(p, defaults=RUN_LIVE_DEFAULTS)
    add_engine_options(p)
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
    if uses_engine_layer(args):
        finished = run_engine_cell(args, progress=Progress())
        return report_engine_cell(finished, f"{args.engine} cell ({args.base_url or 'launched'})")
    request = request_from_args(args)
    if args.dry_run:
        return print_dry_run(request)
    outcome = run_live_cell(request, progress=Progress())
    return report(outcome, f"live cell {outcome.model_name}")
