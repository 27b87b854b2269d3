"""Command-line options as plain data, owned below the commands that offer them.

The signer-identity options (:data:`POLICY_OPTIONS`, read by
:func:`~batch_invariance.cert.signing_policy.signing_policy`) are shared by check-deploy,
serve, compare and run-live; serve's whole table is
:data:`batch_invariance.gate.serve_line.SERVE_OPTIONS`. argparse is built from a table
only in ``commands/`` (:func:`batch_invariance.commands.option_args.add_options`); the deploy
gate reads a ``batch-invariance serve`` line from the same table with its own exact parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["POLICY_OPTIONS", "Option"]

#: ``text`` and ``path`` take one value, ``flag`` none (store true); ``positional`` is one
#: required word, ``rest`` every further positional word.
Kind = Literal["text", "path", "flag", "positional", "rest"]


@dataclass(frozen=True)
class Option:
    """One option: its long flag (or positional name), what it takes, its help."""

    name: str
    kind: Kind
    help: str
    metavar: str | None = None
    #: Options sharing a group name are mutually exclusive.
    group: str | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


POLICY_OPTIONS: tuple[Option, ...] = (
    Option("--cert-identity", "text",
           "every covering cert's CERT.sigstore.json must be signed by this identity (SAN)",
           "ID", "who"),
    Option("--cert-identity-regexp", "text",
           "the same, as a regular expression the whole SAN must match (tag or SHA pins)",
           "REGEX", "who"),
    Option("--cert-oidc-issuer", "text", "OIDC issuer of --cert-identity", "URL"),
    Option("--repository", "text",
           "the GitHub repository each covering cert must have been signed for (the signing "
           "certificate's source-repository claim); required with an identity policy",
           "OWNER/REPO"),
    Option("--any-repository", "flag",
           "accept a cert signed for any repository whose job matches the identity (not for "
           "the reusable cell workflow: every caller signs as it; see docs/deploy.md)"),
    Option("--signing-policy", "path",
           "TOML file with identity (or identity_regexp), issuer and repository (or "
           "any_repository = true) instead of the flags",
           "FILE"),
    Option("--offline", "flag",
           "verify bundles with the trust root embedded in sigstore (no network)"),
    Option("--allow-unsigned", "flag",
           "local use only: accept certs without a verified signature (the result says so)"),
)  # fmt: skip
