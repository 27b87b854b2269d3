"""`batch-invariance check-deploy CONFIG --certs DIR`: the deploy gate.

Passes (exit 0) only when every cell of the deploy config with ``parallel > 1`` is covered by
a cert in DIR that measured exactly that cell (model identity, ctx per slot, N, KV layout,
numerics flags, answer length), verifies, is promotable and carries a sigstore bundle that
verifies against the identity policy (``--allow-unsigned`` skips signatures, and says so).
Exit 3 when a cell is not covered, 5 when a covering cert or its signature is invalid.
The rules: docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.errors import UsageError


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "check-deploy",
        help="pass only when every batched cell of a deploy config has a promotable cert",
        description=(
            "Read a deploy config (shell script, systemd unit, compose file or models.toml), "
            "list the (model, ctx, N) cells its llama-server processes run, and pass only when "
            "each cell with parallel > 1 is covered by a promotable, signed cert in --certs "
            "that measured exactly that cell. ctx is the context per slot. See docs/deploy.md."
        ),
    )
    parser.add_argument("config", type=Path, metavar="CONFIG", help="deploy config file")
    parser.add_argument(
        "--certs", type=Path, required=True, metavar="DIR", help="certs (searched recursively)"
    )
    parser.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="fills {MODELS_DIR} in a models.toml (default: $MODELS_DIR)",
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument(
        "--cert-identity",
        default=None,
        metavar="ID",
        help="every covering cert's CERT.sigstore.json must be signed by this identity (SAN)",
    )
    who.add_argument(
        "--cert-identity-regexp",
        default=None,
        metavar="REGEX",
        help="the same, as a regular expression the whole SAN must match (tag or SHA pins)",
    )
    parser.add_argument(
        "--cert-oidc-issuer", default=None, metavar="URL", help="OIDC issuer of --cert-identity"
    )
    parser.add_argument(
        "--repository",
        default=None,
        metavar="OWNER/REPO",
        help="also require the signing workflow to run in this GitHub repository",
    )
    parser.add_argument(
        "--signing-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "TOML file with identity (or identity_regexp), issuer and optional repository "
            "(instead of the flags)"
        ),
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="verify bundles with the trust root embedded in sigstore (no network)",
    )
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="local use only: accept certs without a verified signature (the result says so)",
    )
    parser.set_defaults(func=handle)


def signing_policy(args: argparse.Namespace) -> Any:
    """The identity policy from the flags or ``--signing-policy``; ``None`` = --allow-unsigned."""
    from batch_invariance.cert.signing import BundlePolicy, SignerPolicy, TrustRoot, policy_for
    from batch_invariance.profiles.models import load_toml

    identity, issuer, repository = args.cert_identity, args.cert_oidc_issuer, args.repository
    pattern = args.cert_identity_regexp
    if args.signing_policy is not None:
        try:
            text = args.signing_policy.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --signing-policy {args.signing_policy}: {exc}") from None
        table = load_toml(text, str(args.signing_policy))
        if not (identity or pattern):
            identity, pattern = table.get("identity"), table.get("identity_regexp")
            if identity and pattern:
                raise UsageError(
                    f"--signing-policy {args.signing_policy}: give identity or identity_regexp, "
                    "not both"
                )
        issuer = issuer or table.get("issuer")
        repository = repository or table.get("repository")
    if pattern:
        identity = pattern
    given = identity or issuer or repository
    if args.allow_unsigned:
        if given:
            raise UsageError("--allow-unsigned skips signatures; drop it or the identity policy")
        return None
    if not (isinstance(identity, str) and identity and isinstance(issuer, str) and issuer):
        raise UsageError(
            "check-deploy verifies every covering cert's signature: pass --cert-identity (or "
            "--cert-identity-regexp) and --cert-oidc-issuer (or --signing-policy FILE), or "
            "--allow-unsigned for a local check"
        )
    signer = SignerPolicy(
        identity=identity,
        issuer=issuer,
        repository=repository if isinstance(repository, str) else None,
        identity_is_regexp=bool(pattern),
    )
    policy_for(signer)  # a bad regexp is a usage error before any cert is read
    return BundlePolicy(signer, TrustRoot(offline=args.offline))


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.deploy.cells import load_deploy_cells
    from batch_invariance.deploy.gate import check_cells

    signing = signing_policy(args)
    models_dir = args.models_dir or os.environ.get("MODELS_DIR")
    cells = load_deploy_cells(args.config, models_dir)
    report = check_cells(args.config, cells, args.certs, signing)

    for cell in report.serial:
        print(f"skip  {cell.label}  [{cell.origin}]  parallel 1: no batching, no cert needed")
    for check in report.checks:
        mark = "pass" if check.ok else "FAIL"
        print(f"{mark}  {check.cell.label}  [{check.cell.origin}]  {check.reason}")
    note = " (UNSIGNED: --allow-unsigned, signatures not checked)" if signing is None else ""
    if not report.checks:
        print(f"check-deploy: PASS: {args.config} runs no batched cell (parallel > 1){note}")
        return exitcodes.PROMOTABLE
    if report.passed:
        print(f"check-deploy: PASS: {len(report.checks)} batched cell(s) certified{note}")
        return exitcodes.PROMOTABLE
    failing = report.failing
    print(
        f"check-deploy: FAIL: {len(failing)} of {len(report.checks)} batched cell(s) not "
        f"certified: {', '.join(c.cell.label for c in failing)}{note}"
    )
    if any(check.kind == "invalid" for check in failing):
        return exitcodes.CERT_INVALID
    return exitcodes.NOT_PROMOTABLE
