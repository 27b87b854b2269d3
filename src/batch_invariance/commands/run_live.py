"""`batch-invariance run-live`: one real cell against the user's own ``llama-server`` (or
another engine, ``--engine``, or a server already running, ``--base-url``).

request (argparse -> :class:`~batch_invariance.service.request.LiveRequest`) -> job (checked
once, :func:`~batch_invariance.service.job.prepare`) -> service
(:func:`~batch_invariance.service.live.run_live_cell`) -> render (the banner) -> exit code.
``--dry-run`` prints the plan and launches nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from batch_invariance.commands.cell_options import (
    add_cell_options,
    add_engine_options,
    add_target_options,
    cell_label,
    print_dry_run,
    report,
    request_from_args,
)
from batch_invariance.run.progress import Progress
from batch_invariance.service.job import prepare
from batch_invariance.service.live import run_live_cell
from batch_invariance.service.request import RUN_LIVE_DEFAULTS


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
    p.add_argument("--parallel", type=int, default=None, help="slots N of the B/C server")
    add_target_options(p)
    add_cell_options(p, defaults=RUN_LIVE_DEFAULTS)
    add_engine_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    job = prepare(request_from_args(args), create_out_dir=not args.dry_run)
    if args.dry_run:
        return print_dry_run(job)
    outcome = run_live_cell(job, progress=Progress())
    return report(outcome, cell_label(outcome.job))
