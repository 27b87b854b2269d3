"""The identity policy options of check-deploy and serve (read by
:func:`batch_invariance.cert.signing_policy.signing_policy`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The identity policy options (check-deploy's and serve's), read by :func:`signing_policy`."""
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
        help=(
            "the GitHub repository each covering cert must have been signed for (the signing "
            "certificate's source-repository claim); required with an identity policy"
        ),
    )
    parser.add_argument(
        "--any-repository",
        action="store_true",
        help=(
            "accept a cert signed for any repository whose job matches the identity (not for "
            "the reusable cell workflow: every caller signs as it; see docs/deploy.md)"
        ),
    )
    parser.add_argument(
        "--signing-policy",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "TOML file with identity (or identity_regexp), issuer and repository (or "
            "any_repository = true) instead of the flags"
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
