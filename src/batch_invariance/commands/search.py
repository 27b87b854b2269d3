"""`batch-invariance search`: the fastest server configuration that keeps the answers.

request (argparse -> :class:`~batch_invariance.service.search.SearchRequest`) -> job (every
configuration's cell checked once, :func:`~batch_invariance.service.search.prepare_search`) ->
service (:func:`~batch_invariance.service.search.run_search`) -> the table
(:func:`~batch_invariance.report.search_text.search_text`) -> exit code.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.commands.cell_options import (
    add_cell_options,
    add_engine_options,
    add_target_options,
    refuse_unreachable,
    request_from_args,
)
from batch_invariance.commands.reply import add_json_option, refuse_json_dry_run
from batch_invariance.deploy.serve_required import serve_suggestion
from batch_invariance.errors import UsageError
from batch_invariance.gate.identity import own_launchers
from batch_invariance.report.search_text import search_text
from batch_invariance.run.progress import Progress
from batch_invariance.service.request import SWEEP_DEFAULTS
from batch_invariance.service.search import (
    SearchJob,
    SearchRequest,
    plan_lines,
    prepare_search,
    run_search,
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "search",
        help="walk the engine's output-changing options for one cell: which keeps the answers, "
        "and what N buys there",
        description=(
            "For one (model, ctx, N) cell, walks the engine's declared options (llama-server: "
            "-ub, -fa, K/V cache types, split or unified KV, threads; vLLM: its batch-invariant "
            "mode). Each is probed first with a few prompts that cross where drift is known to "
            "start and reach the slot's end; a probe can only reject. Those it does not reject, "
            "and the defaults (the positive control), get a full cert as run-live makes it. "
            "Prints one row per configuration and the deploy line of the fastest promotable "
            "GREEN, each promotable GREEN set against the defaults in interleaved rounds (one "
            "server at a time); writes D/<config>/ certs and D/search.json. Exit: 0 a "
            "promotable GREEN was found, 3 none, 2 usage, 4 infrastructure, 130/143 signals."
        ),
    )
    p.add_argument("--parallel", type=int, required=True, help="N of the concurrent server")
    p.add_argument(
        "--configs",
        default=None,
        help="comma-separated configuration names to walk (default: the engine's whole space; "
        "the defaults always run)",
    )
    p.add_argument(
        "--budget",
        default=None,
        help="wall-time limit (seconds, or 90m, 2h): no step starts that would not fit; a "
        "second run with the same --out-dir reuses every cert already measured",
    )
    p.add_argument(
        "--interleave-rounds",
        type=int,
        default=SearchRequest.interleave_rounds,
        help="rounds of each promotable GREEN against the defaults, one server at a time, the "
        "order turned each round; the table shows their median ratio (0: none, the two certs' "
        "figures only; default: %(default)s)",
    )
    add_target_options(p)
    add_cell_options(p, defaults=SWEEP_DEFAULTS)
    add_engine_options(p)
    add_json_option(p, "the search record (search.json) and the exit code")
    p.set_defaults(func=handle)


def parse_budget(text: str | None) -> float | None:
    """``"600"``, ``"90m"`` or ``"2h"`` -> seconds; UsageError on anything else."""
    if text is None:
        return None
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower())
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise UsageError(f"--budget {text!r}: give seconds, or minutes/hours as 90m, 2h") from None
    if value <= 0:
        raise UsageError(f"--budget {text}: give a positive time")
    return value


@dataclass(frozen=True)
class SearchReply:
    record: dict[str, Any]
    exit_code: int

    def to_json(self) -> dict[str, Any]:
        return {"command": "search", **self.record, "exit_code": self.exit_code}


def deploy_line(record: dict[str, Any]) -> str | None:
    """The serve line of the fastest promotable GREEN (its certs' folder, unsigned: a signed
    cert's gate adds its own identity options, as check-deploy --suggest prints them)."""
    fastest = record.get("fastest_green")
    row = next((r for r in record["rows"] if r["config"] == fastest), None)
    if row is None or not row.get("deploy") or not row.get("certs"):
        return None
    # The search runs where serve will: the line names this tool's launcher by its path, as
    # check-deploy requires of a line whose file sets no PATH (a bare name is the caller's).
    launchers = own_launchers()
    program = str(launchers[0]) if launchers else "batch-invariance"
    return serve_suggestion(tuple(row["deploy"]), Path(row["certs"]), None, program)


def handle(args: argparse.Namespace) -> int | SearchReply:
    refuse_json_dry_run(args)
    if args.kv_layout != "split":
        raise UsageError(
            "search walks the KV layout itself (a configuration each): drop --kv-layout"
        )
    only = None if args.configs is None else tuple(c for c in args.configs.split(",") if c)
    request = SearchRequest(request_from_args(args), only, parse_budget(args.budget),
                            args.interleave_rounds)  # fmt: skip
    job = prepare_search(request, create_out_dir=not args.dry_run)
    if args.dry_run:
        sys.stdout.write("\n".join(plan_lines(job)) + "\n")
    # As run-live and sweep: a plan whose full certs cannot reach GREEN whatever the server
    # does is refused before any server starts (every configuration shares the plan).
    refuse_unreachable(job.points[0].full)
    return exitcodes.PROMOTABLE if args.dry_run else _finish(job)


def _finish(job: SearchJob) -> SearchReply:
    outcome = run_search(job, progress=Progress, say=lambda line: print(line, file=sys.stderr))
    record = outcome.record
    line = deploy_line(record)
    sys.stdout.write(search_text(record, str(outcome.path), line))
    code = exitcodes.PROMOTABLE if record.get("fastest_green") else exitcodes.NOT_PROMOTABLE
    return SearchReply({**record, "deploy_line": line}, code)
