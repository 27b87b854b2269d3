"""`batch-invariance run-live`: one real cell against the user's own ``llama-server`` (or
another engine, ``--engine``, or a server already running, ``--base-url``).

request (argparse -> :class:`~batch_invariance.service.request.LiveRequest`) -> job (checked
once, :func:`~batch_invariance.service.live.prepare`) -> service
(:func:`~batch_invariance.service.live.run_live_cell`) -> render (the banner) -> exit code.
``--dry-run`` prints the plan and launches nothing; a plan it refuses as one that cannot reach
GREEN is refused by a real run too, with the same lines, before any server starts (exit 2;
``sweep`` and ``demo`` do the same). ``--baseline CERT`` verifies that cert
(and its signature, under the identity policy check-deploy takes) before anything launches,
then compares the new cert's arm A with it and writes ``{cert stem}.compare.json`` beside the
cert (docs/compare.md); the exit code stays the new cert's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batch_invariance.commands.cell_options import (
    add_cell_options,
    add_engine_options,
    add_target_options,
    cell_label,
    print_dry_run,
    refuse_unreachable,
    report,
    request_from_args,
)
from batch_invariance.commands.option_args import add_policy_arguments
from batch_invariance.commands.replies import RunReply, run_cell, run_reply
from batch_invariance.commands.reply import add_json_option, refuse_json_dry_run
from batch_invariance.core.compare import FAIL_ON
from batch_invariance.errors import UsageError
from batch_invariance.run.progress import Progress
from batch_invariance.service.live import LiveOutcome, prepare, run_live_cell
from batch_invariance.service.request import RUN_LIVE_DEFAULTS

#: The policy flags, which only mean something with ``--baseline``.
_POLICY_FLAGS = ("cert_identity", "cert_identity_regexp", "cert_oidc_issuer", "repository",
                 "any_repository", "signing_policy", "allow_unsigned", "offline")  # fmt: skip


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
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="CERT",
        help=(
            "a cert (or folder) of an earlier build or another engine: verified before the "
            "run, then compared with the new cert (docs/compare.md); the identity policy "
            "flags below, or --allow-unsigned, say how its signature is checked"
        ),
    )
    p.add_argument(
        "--baseline-fail-on",
        choices=FAIL_ON,
        default="scored",
        help="the class recorded as failing in the comparison JSON (default: scored)",
    )
    add_policy_arguments(p)
    add_json_option(p, "the cert written, its verdict, status and promotability")
    p.set_defaults(func=handle)


def _baseline(args: argparse.Namespace) -> Any:
    """The verified baseline sides, or ``None`` without ``--baseline``."""
    if args.baseline is None:
        given = [f for f in _POLICY_FLAGS if getattr(args, f)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} checks the --baseline cert's signature; give --baseline")
        return None
    from batch_invariance.cert.signing_policy import signing_policy
    from batch_invariance.report.compare_load import load_side, signature_words

    signing = signing_policy(args, "run-live --baseline")
    return load_side(args.baseline, signing, baseline=True), signature_words(signing)


def _compare(args: argparse.Namespace, baseline: Any, outcome: LiveOutcome) -> Path:
    """Compare with the baseline and write the comparison beside the cert; its path."""
    from batch_invariance.cert.compare_view import comparison_json
    from batch_invariance.cert.store import atomic_write_text
    from batch_invariance.report.compare_load import compare_with_run, comparison_path
    from batch_invariance.report.compare_render import comparison_text

    sides, words = baseline
    finished = outcome.finished
    comparison = compare_with_run(sides, args.baseline, finished.cert, finished.path, words)
    target = comparison_path(finished.path)
    data = comparison_json(comparison, args.baseline_fail_on)
    atomic_write_text(target, json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(comparison_text(comparison, args.baseline_fail_on), end="")
    print(f"comparison: {target}")
    return target


def handle(args: argparse.Namespace) -> int | RunReply:
    refuse_json_dry_run(args)
    request = request_from_args(args)
    baseline = _baseline(args)
    job = prepare(request, create_out_dir=not args.dry_run)
    if args.dry_run:
        return print_dry_run(job)
    refuse_unreachable(job)  # what the dry run refuses, before any server starts
    outcome = run_live_cell(job, progress=Progress())
    code = report(outcome, cell_label(outcome.job))
    compared = None if baseline is None else _compare(args, baseline, outcome)
    f = outcome.finished
    cell = run_cell(f.cert.dispatch_n, f.cert, f.path, f.superseded, f.promotable)
    return run_reply("run-live", [cell], code, comparison=compared)
