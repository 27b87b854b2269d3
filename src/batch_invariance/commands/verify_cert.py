"""`batch-invariance verify-cert PATH`: is this cert intact, self-consistent and promotable?

Checks, in order (one verification path, :func:`~batch_invariance.cert.verify.verify_path`):
the JSON schema, the integrity digest, the version that wrote it, the verdict re-derived from
the embedded evidence, the cell's identity against its own provenance and, with ``--bundle``,
the sigstore signature and its identity policy. Prints model/ctx/N, status, source,
promotable and the reasons. Without ``--bundle`` it says that authenticity was not checked:
the digest catches accidents, not forgery.

Exit: 0 promotable, 1 RED, 3 valid but not promotable, 5 invalid or tampered (raised as
:class:`~batch_invariance.errors.CertInvalid`; ``cli.main`` maps it).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cert.schema import Cert
from batch_invariance.cert.verify import DIGEST_SCOPE, Verification, verify_cert_file
from batch_invariance.errors import CertInvalid, UsageError


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "verify-cert",
        help="check a cert's schema, digest, re-derived verdict (and signature)",
        description=(
            "Validate a cert: schema, integrity digest, and the verdict re-derived from its "
            "embedded evidence. With --bundle, also verify its sigstore signature. Exit 0 "
            "promotable, 1 RED, 3 not promotable, 5 invalid or tampered."
        ),
    )
    p.add_argument("path", metavar="PATH", type=Path, help="the cert JSON file")
    p.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="sigstore bundle for the cert (e.g. CERT.sigstore.json)",
    )
    p.add_argument(
        "--cert-identity",
        default=None,
        help="expected signer identity (certificate SAN), required with --bundle",
    )
    p.add_argument(
        "--cert-oidc-issuer", default=None, help="expected OIDC issuer URL, required with --bundle"
    )
    p.add_argument(
        "--repository",
        default=None,
        metavar="OWNER/REPO",
        help="expected GitHub repository of the signing workflow",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="verify the signature with the embedded trust root, no network",
    )
    p.set_defaults(func=handle)


def _check_signature(args: argparse.Namespace) -> str | None:
    bundle: Path | None = args.bundle
    if bundle is None:
        if args.cert_identity or args.cert_oidc_issuer or args.repository:
            raise UsageError(
                "--cert-identity/--cert-oidc-issuer/--repository need --bundle CERT.sigstore.json"
            )
        return None
    if not args.cert_identity or not args.cert_oidc_issuer:
        raise UsageError("--bundle needs both --cert-identity and --cert-oidc-issuer")
    if not bundle.is_file():
        raise CertInvalid(
            f"signature bundle not found: {bundle}; sign the cert with "
            "`batch-invariance sign CERT` or pass the right --bundle"
        )
    # Imported here so that sigstore is only loaded when a signature is asked for.
    from batch_invariance.cert.signing import verify_bundle

    verify_bundle(
        Path(args.path),
        bundle,
        args.cert_identity,
        args.cert_oidc_issuer,
        args.repository,
        bool(args.offline),
    )
    return f"verified ({args.cert_identity}, {args.cert_oidc_issuer})"


NO_BUNDLE = f"not checked (no --bundle): authenticity was not checked; {DIGEST_SCOPE}"


def _print_report(report: Verification, cert: Cert, signature: str | None) -> None:
    print(f"cert:       {report.path}")
    print(f"cell:       model={cert.model} ctx={cert.ctx} N={cert.dispatch_n}")
    print(f"status:     {report.verdict} ({cert.status})")
    print(f"source:     {cert.source}   gate: {cert.gate}")
    print(f"promotable: {'yes' if report.promotable else 'no'}")
    for reason in report.promotable_reasons:
        print(f"  - {reason}")
    print(f"signature:  {signature or NO_BUNDLE}")
    print(
        "integrity:  schema ok, digest ok, verdict re-derived from evidence matches, "
        "identity matches its provenance"
    )
    print("reasons:")
    for reason in cert.decision_reasons:
        print(f"  - {reason}")


def handle(args: argparse.Namespace) -> int:
    report = verify_cert_file(Path(args.path))
    assert report.cert is not None  # a valid verification always carries its cert
    signature = _check_signature(args)
    _print_report(report, report.cert, signature)
    return exitcodes.for_status(report.cert.status, report.promotable)
