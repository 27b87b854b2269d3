"""`batch-invariance sign CERT`: sign a cert keylessly with sigstore.

Writes ``CERT.sigstore.json`` (a bundle over the cert's bytes) and
``CERT.intoto.sigstore.json`` (the cert's in-toto Test Result Statement as a DSSE bundle) next
to the cert, atomically. The identity is the ambient OIDC one (GitHub Actions with
``permissions: id-token: write``) or ``--identity-token``. Only a cert that verifies (schema,
digest, re-derived verdict) is signed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batch_invariance.commands.cert_paths import cert_file


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "sign",
        help="sign a cert keylessly with sigstore (CERT.sigstore.json + in-toto attestation)",
        description=(
            "Sign a cert with sigstore (keyless). Uses the ambient OIDC identity in GitHub "
            "Actions (the job needs `permissions: id-token: write`) or --identity-token. "
            "Writes CERT.sigstore.json and the in-toto Test Result attestation "
            "CERT.intoto.sigstore.json next to the cert."
        ),
    )
    parser.add_argument("cert", type=Path, metavar="CERT", help="cert JSON file to sign")
    parser.add_argument(
        "--identity-token",
        metavar="TOKEN",
        default=None,
        help="OIDC identity token (audience 'sigstore') instead of the ambient identity",
    )
    parser.add_argument(
        "--staging",
        action="store_true",
        help=(
            "sign against the Sigstore staging instance (for trying things out; verify with "
            "verify-cert --staging)"
        ),
    )
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from batch_invariance.cert.attestation import attest_file
    from batch_invariance.cert.signing import (
        SigstoreSigner,
        detect_token,
        sign_file,
    )
    from batch_invariance.cert.verify import Depth, verify

    cert = cert_file(args.cert)
    token = detect_token(args.identity_token)
    # Never put a signature on a cert that does not verify on its own.
    verify(cert, Depth.FULL).raise_if_invalid()
    signer = SigstoreSigner(staging=args.staging)
    signed = sign_file(cert, token, signer)
    attested = attest_file(cert, token, signer)
    print(f"signed {signed.artifact} as {signed.identity.identity} ({signed.identity.issuer})")
    print(f"bundle: {signed.bundle}")
    print(f"attestation: {attested.bundle}")
    return 0
