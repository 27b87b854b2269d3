"""`batch-invariance compare BASELINE NEW`: did the new build or engine change the answers?

Both sides (a cert or a folder of certs) are verified first, signatures included (the identity
policy check-deploy takes, or ``--allow-unsigned``); a baseline written under other decision
rules is read through its schema and digest, its verdict not re-derived, and the output says
so (:mod:`~batch_invariance.cert.baseline`). Cells pair by model sha256, ctx and N; for
each pair whose model bytes, work-set, sampling settings, answer budget and scorer are the same,
arm A (the serial ground truth) is compared prompt by prompt, bitwise. docs/compare.md.

Exit by the worst class: 0 identical everywhere, 1 a scored field changed, 3 anything short of
that (drift, tokens changed, a prompt not compared), 2 not comparable (nothing compared),
5 a cert or its signature invalid. With ``--fail-on CLASS``: 1 when CLASS or worse is present
(or a prompt could not be compared), 2 not comparable, else 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.commands.option_args import add_policy_arguments
from batch_invariance.core.compare import FAIL_ON


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "compare",
        help="did a new server build or engine change the answers? compare two certs",
        description=(
            "Compare the serial ground truth (arm A) of two certs, or two folders of certs, "
            "prompt by prompt and bitwise: identical, logprobs drifted, tokens changed, or a "
            "scored field changed; and their verdicts side by side. Cells with another model "
            "file, work-set, sampling settings, answer budget or scorer are not comparable and "
            "nothing is compared. Both sides are verified first. See docs/compare.md."
        ),
    )
    parser.add_argument("baseline", type=Path, metavar="BASELINE", help="cert or folder")
    parser.add_argument("new", type=Path, metavar="NEW", help="cert or folder")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="also write the JSON to FILE"
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=None,
        help=(
            "exit 1 when this class (or a worse one) is present, else 0; default: exit by the "
            "worst class (see docs/compare.md)"
        ),
    )
    add_policy_arguments(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.cert.compare_view import comparison_json
    from batch_invariance.cert.signing_policy import signing_policy
    from batch_invariance.cert.store import atomic_write_text
    from batch_invariance.report.compare_load import compare_inputs
    from batch_invariance.report.compare_render import comparison_text

    signing = signing_policy(args, "compare")
    comparison = compare_inputs(args.baseline, args.new, signing)
    data = comparison_json(comparison, args.fail_on)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if args.out is not None:
        atomic_write_text(args.out, text)
    print(text if args.json else comparison_text(comparison, args.fail_on), end="")
    if args.fail_on is not None:
        return exitcodes.for_policy(
            comparison.comparable, bool(comparison.policy_failures(args.fail_on))
        )
    return exitcodes.for_comparison(comparison.comparable, comparison.worst())
