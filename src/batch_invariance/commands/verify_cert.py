"""`batch-invariance verify-cert PATH`: is this cert intact, self-consistent and promotable?

Checks, in order (one verification path, :func:`~batch_invariance.cert.verify.verify`):
the JSON schema, the integrity digest, the version that wrote it, the verdict re-derived from
the embedded evidence, the cell's identity against its own provenance and, with ``--bundle``,
the sigstore signature and its identity policy and, with ``--attestation``, the in-toto Test
Result attestation (signer, subject digests, result). Prints model/ctx/N, status, source,
promotable and the reasons. Without ``--bundle`` it says that authenticity was not checked:
the digest catches accidents, not forgery.

Exit: 0 promotable, 1 RED, 3 valid but not promotable, 5 invalid or tampered (raised as
:class:`~batch_invariance.errors.CertInvalid`; ``cli.main`` maps it), 2 when PATH is not a
file. ``--json`` prints the answer as one object (an invalid cert's too, with its problems).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from batch_invariance import exitcodes
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.commands.cert_paths import cert_file
from batch_invariance.commands.replies import Signature, VerifyReply, verify_reply
from batch_invariance.commands.reply import add_json_option, error_line, json_requested
from batch_invariance.errors import CertInvalid, UsageError
from batch_invariance.report.render import NO_BUNDLE, verify_report_text

#: The signature of an invalid cert is not looked at.
_NOT_CHECKED_INVALID = Signature("not_checked", "the cert is invalid: signature not checked")


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
        "--attestation",
        type=Path,
        default=None,
        help=(
            "in-toto Test Result attestation (DSSE bundle, e.g. CERT.intoto.sigstore.json): "
            "checks signer, subject digests and result"
        ),
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--cert-identity",
        default=None,
        help="expected signer identity (certificate SAN); with --bundle or --attestation",
    )
    who.add_argument(
        "--cert-identity-regexp",
        default=None,
        metavar="REGEX",
        help="expected signer identity as a regular expression the whole SAN must match",
    )
    p.add_argument(
        "--cert-oidc-issuer",
        default=None,
        help="expected OIDC issuer URL; with --bundle or --attestation",
    )
    p.add_argument(
        "--repository",
        default=None,
        metavar="OWNER/REPO",
        help="expected GitHub repository of the signing workflow",
    )
    p.add_argument(
        "--staging",
        action="store_true",
        help="verify against the Sigstore staging instance (bundles from `sign --staging`)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="verify the signature with the embedded trust root, no network",
    )
    add_json_option(p, "the cert, its verdict, promotability, signature and problems")
    p.set_defaults(func=handle)


def _check_signature(args: argparse.Namespace) -> str | None:
    bundle: Path | None = args.bundle
    attestation: Path | None = args.attestation
    identity = args.cert_identity or args.cert_identity_regexp
    if bundle is None and attestation is None:
        if identity or args.cert_oidc_issuer or args.repository or args.staging:
            raise UsageError(
                "--cert-identity/--cert-identity-regexp/--cert-oidc-issuer/--repository/"
                "--staging need --bundle CERT.sigstore.json or --attestation"
            )
        return None
    if not identity or not args.cert_oidc_issuer:
        raise UsageError(
            "--bundle/--attestation need --cert-identity (or --cert-identity-regexp) and "
            "--cert-oidc-issuer"
        )
    # Imported here so that sigstore is only loaded when a signature is asked for.
    from batch_invariance.cert.attestation import verify_attestation
    from batch_invariance.cert.signature import (
        SignerPolicy,
        TrustRoot,
        verify_bundle,
    )

    signer = SignerPolicy(
        identity=identity,
        issuer=args.cert_oidc_issuer,
        repository=args.repository,
        identity_is_regexp=args.cert_identity_regexp is not None,
    )
    trust = TrustRoot(staging=bool(args.staging), offline=bool(args.offline))
    checked: list[str] = []
    if bundle is not None:
        if not bundle.is_file():
            raise CertInvalid(
                f"signature bundle not found: {bundle}; sign the cert with "
                "`batch-invariance sign CERT` or pass the right --bundle"
            )
        verify_bundle(Path(args.path), bundle, signer, trust)
        checked.append("bundle")
    if attestation is not None:
        verify_attestation(Path(args.path), attestation, signer, trust)
        checked.append("in-toto attestation")
    instance = "staging" if trust.staging else "production"
    return f"verified {' + '.join(checked)} ({identity}, {signer.issuer}, {instance})"


def handle(args: argparse.Namespace) -> int | VerifyReply:
    path = cert_file(Path(args.path))
    verification = verify(path, Depth.FULL)
    try:
        verification.raise_if_invalid()
        assert verification.cert is not None  # a valid verification always carries its cert
        signature = _check_signature(args)
    except CertInvalid as exc:
        if not json_requested(args):
            raise
        # The cert (or its signature) is invalid: that is verify-cert's answer, so --json
        # prints it as its own object (with the one line an error gets on stderr).
        print(error_line(exc), file=sys.stderr)
        state = Signature("failed", str(exc)) if verification.valid else _NOT_CHECKED_INVALID
        return verify_reply(verification, path, state, exitcodes.for_error(exc))
    print(verify_report_text(verification, signature), end="")
    code = exitcodes.for_status(verification.cert.status, verification.promotable)
    if not json_requested(args):
        return code
    if signature is None:
        return verify_reply(verification, path, Signature("not_checked", NO_BUNDLE), code)
    return verify_reply(verification, path, Signature("verified", signature), code)
