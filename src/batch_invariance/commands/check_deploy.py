"""`batch-invariance check-deploy CONFIG --certs DIR`: the deploy gate.

Passes (exit 0) only when every cell of the deploy config with ``parallel > 1`` has a cert in
DIR that verifies, is promotable and, with ``--bundle-identity``, is correctly signed. Names
every missing or failing cell; exit 3 when any is missing or not promotable, 5 when a cert or
its signature is invalid.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cert.signing import GITHUB_ACTIONS_ISSUER
from batch_invariance.errors import UsageError


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "check-deploy",
        help="pass only when every batched cell of a deploy config has a promotable cert",
        description=(
            "Read a deploy config (a file with llama-server command line(s), or a "
            "models.toml-style file), list the (model, ctx, N) cells it runs, and pass only "
            "when each cell with parallel > 1 has a promotable cert in --certs (and, with "
            "--bundle-identity, a valid sigstore bundle). ctx is the context per slot."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG", help="deploy config file")
    parser.add_argument(
        "--certs",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder of certs (searched recursively)",
    )
    parser.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="fills {MODELS_DIR} in a models.toml (default: $MODELS_DIR)",
    )
    parser.add_argument(
        "--bundle-identity",
        default=None,
        metavar="ID",
        help="require CERT.sigstore.json signed by this identity (certificate SAN)",
    )
    parser.add_argument(
        "--bundle-issuer",
        default=GITHUB_ACTIONS_ISSUER,
        metavar="URL",
        help=f"OIDC issuer of --bundle-identity (default: {GITHUB_ACTIONS_ISSUER})",
    )
    parser.add_argument(
        "--repository",
        default=None,
        metavar="OWNER/REPO",
        help="also require the signing workflow to run in this GitHub repository",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="verify bundles with the trust root embedded in sigstore (no network)",
    )
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.deploy.gate import BundlePolicy, check_cells, load_deploy_config

    if args.repository and not args.bundle_identity:
        raise UsageError("--repository needs --bundle-identity (it checks the signature)")
    policy = (
        BundlePolicy(
            identity=args.bundle_identity,
            issuer=args.bundle_issuer,
            repository=args.repository,
            offline=args.offline,
        )
        if args.bundle_identity
        else None
    )
    models_dir = args.models_dir or os.environ.get("MODELS_DIR")
    cells = load_deploy_config(args.config, models_dir)
    report = check_cells(args.config, cells, args.certs, policy)

    for cell in report.serial:
        print(f"skip  {cell.label}  [{cell.origin}]  parallel 1: no batching, no cert needed")
    for check in report.checks:
        mark = "pass" if check.ok else "FAIL"
        print(f"{mark}  {check.cell.label}  [{check.cell.origin}]  {check.reason}")
    if not report.checks:
        print(f"check-deploy: PASS: {args.config} runs no batched cell (parallel > 1)")
        return exitcodes.PROMOTABLE
    if report.passed:
        print(f"check-deploy: PASS: {len(report.checks)} batched cell(s) certified")
        return exitcodes.PROMOTABLE
    failing = report.failing
    print(
        f"check-deploy: FAIL: {len(failing)} of {len(report.checks)} batched cell(s) not "
        f"certified: {', '.join(c.cell.label for c in failing)}"
    )
    if any(check.kind == "invalid" for check in failing):
        return exitcodes.CERT_INVALID
    return exitcodes.NOT_PROMOTABLE
