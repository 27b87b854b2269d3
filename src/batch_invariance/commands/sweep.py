"""`batch-invariance sweep`: one live cell per ``--parallel`` N, sharing arm A.

request (argparse -> :class:`~batch_invariance.service.sweep.SweepRequest`) -> job (checked
once, :func:`~batch_invariance.service.sweep.prepare_sweep`) -> service
(:func:`~batch_invariance.service.sweep.run_sweep`) -> render (a banner per cell and the sweep
table) -> exit code.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.commands.cell_options import (
    add_cell_options,
    add_engine_options,
    add_target_options,
    cell_label,
    endpoint_line,
    print_dry_run,
    refuse_unreachable,
    request_from_args,
)
from batch_invariance.commands.replies import RunCell, RunReply, refused_cell, run_cell, run_reply
from batch_invariance.commands.reply import add_json_option, refuse_json_dry_run
from batch_invariance.report.render import live_banner, sweep_text
from batch_invariance.run.progress import Progress
from batch_invariance.service.request import SWEEP_DEFAULTS
from batch_invariance.service.sweep import (
    SweepOutcome,
    SweepRequest,
    parse_parallels,
    prepare_sweep,
    run_sweep,
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "sweep",
        help="one live cell per --parallel N (sharing arm A); certs plus sweep.json",
        description=(
            "Runs arm A once on a --parallel 1 server, then for each N a --parallel N server "
            "for arm B and the C passes (A' only when some B differs from A), and writes one "
            "cert per N plus D/sweep.json with max_safe_parallel. N values that do not fit in "
            "memory are refused before anything launches. Exit: 0 every N GREEN+promotable, "
            "1 any RED, 2 usage/guard, 3 otherwise, 4 infrastructure, 130/143 signals."
        ),
    )
    p.add_argument(
        "--parallel", required=True, help="N values of the B/C servers, comma-separated: 2,4,8"
    )
    add_target_options(p)
    add_cell_options(p, defaults=SWEEP_DEFAULTS)
    add_engine_options(p)
    add_json_option(p, "each cert written, its verdict, status and promotability")
    p.set_defaults(func=handle)


def exit_code(outcome: SweepOutcome) -> int:
    """1 when any N is RED, 0 when every N is GREEN and promotable, else 3."""
    cells = outcome.cells
    if any(c.finished is not None and c.finished.cert.status == "failed" for c in cells):
        return exitcodes.RED
    if all(c.finished is not None and c.finished.promotable for c in cells):
        return exitcodes.PROMOTABLE
    return exitcodes.NOT_PROMOTABLE


def handle(args: argparse.Namespace) -> int | RunReply:
    refuse_json_dry_run(args)
    parallels = parse_parallels(args.parallel)
    request = SweepRequest(request_from_args(args, parallel=None), parallels)
    job = prepare_sweep(request, create_out_dir=not args.dry_run)
    if args.dry_run:
        # The plan of every cell, as run-live --dry-run prints it (launches nothing); each N
        # was checked by prepare_sweep.
        return max(print_dry_run(replace(job.cell, parallel=n)) for n in job.parallels)
    refuse_unreachable(job.cell)  # the same for every N: before any server starts
    outcome = run_sweep(job, progress=Progress())
    cells: list[RunCell] = []
    for cell in outcome.cells:
        f = cell.finished
        if f is None:
            cells.append(refused_cell(cell.parallel, cell.not_run or "not run"))
            continue
        label = cell_label(outcome.job, kind="sweep")
        sys.stdout.write(endpoint_line(outcome.job))
        sys.stdout.write(live_banner(f.cert, f.path, f.superseded, label))
        cells.append(run_cell(cell.parallel, f.cert, f.path, f.superseded, f.promotable))
    sys.stdout.write(sweep_text(outcome.summary, outcome.path))
    safe = outcome.summary.get("max_safe_parallel")
    return run_reply("sweep", cells, exit_code(outcome), sweep=outcome.path,
                     max_safe_parallel=safe if isinstance(safe, int) else None)  # fmt: skip
