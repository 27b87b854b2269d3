"""`batch-invariance report CERT_OR_DIR... --out FILE`: many certs in one view.

HTML (one self-contained file), a Markdown job summary or a JSON summary over any set of
certs: a sweep folder, or every cert artifact of a matrix run. Invalid certs are named in the
report, not skipped and not a crash.

Exit: 0 when the report was written and every cert is valid (whatever its verdict: the
report is a view, ``check-deploy`` is the gate); 5 when any cert, or any bundle checked with
``--cert-identity``, is invalid; 4 when a bundle could not be checked at all; 2 for bad
arguments or when no cert is found.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cert.signature import (
    BundlePolicy,
    SignerPolicy,
    TrustRoot,
)
from batch_invariance.cert.store import atomic_write_text
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.report.html import render_html
from batch_invariance.report.load import load_all, load_searches
from batch_invariance.report.markdown import render_markdown
from batch_invariance.report.model import Report, build_report
from batch_invariance.report.summary import render_json

FORMATS = {"html": render_html, "md": render_markdown, "json": render_json}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "report",
        help="one HTML / Markdown / JSON report over many certs (a sweep, a matrix run)",
        description=(
            "Render a set of certs (files, or folders searched recursively) as one "
            "self-contained HTML file, a Markdown job summary or a JSON summary. Exit 0 when "
            "every cert is valid, 5 when any cert (or a checked bundle) is invalid."
        ),
    )
    p.add_argument("paths", metavar="CERT_OR_DIR", nargs="+", type=Path)
    p.add_argument("--out", required=True, help="file to write, or - for stdout")
    p.add_argument(
        "--format",
        choices=sorted(FORMATS),
        default=None,
        help="default: from the --out suffix (.md, .json), else html",
    )
    p.add_argument(
        "--cert-identity",
        default=None,
        help="verify each CERT.sigstore.json against this signer identity (certificate SAN)",
    )
    p.add_argument("--cert-oidc-issuer", default=None, help="expected OIDC issuer URL")
    p.add_argument(
        "--repository", default=None, metavar="OWNER/REPO", help="expected signing repository"
    )
    p.add_argument(
        "--offline", action="store_true", help="verify bundles with the embedded trust root"
    )
    p.set_defaults(func=handle)


def _policy(args: argparse.Namespace) -> BundlePolicy | None:
    if not args.cert_identity and not args.cert_oidc_issuer:
        if args.repository:
            raise UsageError("--repository needs --cert-identity and --cert-oidc-issuer")
        return None
    if not args.cert_identity or not args.cert_oidc_issuer:
        raise UsageError("--cert-identity and --cert-oidc-issuer go together")
    return BundlePolicy(
        SignerPolicy(args.cert_identity, args.cert_oidc_issuer, args.repository),
        TrustRoot(offline=bool(args.offline)),
    )


def _write(out: str, text: str) -> None:
    if out == "-":
        sys.stdout.write(text)
        return
    target = Path(out)
    try:
        atomic_write_text(target, text)
    except OSError as exc:
        raise InfraError(f"cannot write {target}: {exc.strerror or exc}") from None


def output_format(chosen: str | None, out: str) -> str:
    """``--format`` when given, else what the file name says (``.md``, ``.json``), else html."""
    if chosen is not None:
        return chosen
    suffix = Path(out).suffix.lower().lstrip(".")
    return suffix if suffix in FORMATS else "html"


def exit_code(report: Report) -> int:
    if report.invalid or any(c.signature.state == "failed" for c in report.cells):
        return exitcodes.CERT_INVALID
    if report.signature_problems:
        return exitcodes.INFRA
    return exitcodes.PROMOTABLE


def handle(args: argparse.Namespace) -> int:
    policy = _policy(args)
    report = build_report(load_all(args.paths, policy))
    report = replace(report, searches=load_searches(args.paths))
    _write(args.out, FORMATS[output_format(args.format, args.out)](report))
    tell = sys.stderr if args.out == "-" else sys.stdout
    for bad in report.invalid:
        print(f"invalid: {bad.origin}: {bad.problem}", file=tell)
    for cell in report.signature_problems:
        print(f"signature: {cell.origin}: {cell.signature.detail}", file=tell)
    where = "stdout" if args.out == "-" else args.out
    print(
        f"report: {len(report.cells)} valid cert(s), {len(report.invalid)} invalid -> {where}",
        file=tell,
    )
    return exit_code(report)
