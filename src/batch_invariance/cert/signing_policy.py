"""The identity policy a cert's signature must meet, read from the flags every command that
verifies signatures shares (check-deploy, serve, compare, run-live --baseline) or from a
``--signing-policy`` TOML file.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Protocol

from batch_invariance.cert.signature import BundlePolicy, SignerPolicy, TrustRoot, policy_for
from batch_invariance.errors import UsageError

__all__ = ["PolicyFlags", "load_toml", "signing_policy"]

# tomllib is stdlib from 3.11; tomli is its backport (a dependency on 3.10 only). Imported by
# name so type checking does not need tomli installed on newer Pythons.
_toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")


class PolicyFlags(Protocol):
    """The parsed identity policy options (an ``argparse.Namespace`` of them)."""

    cert_identity: str | None
    cert_identity_regexp: str | None
    cert_oidc_issuer: str | None
    repository: str | None
    any_repository: bool
    signing_policy: Path | None
    allow_unsigned: bool
    offline: bool


def load_toml(text: str, source: str) -> dict[str, Any]:
    """Decode TOML text (a signing policy, a profile, models.toml); a syntax error is a
    one-line :class:`UsageError` naming ``source``."""
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise UsageError(f"{source} is not valid TOML: {exc}") from None
    return dict(data)


def signing_policy(args: PolicyFlags, command: str = "check-deploy") -> BundlePolicy | None:
    """The identity policy from the flags or ``--signing-policy``; ``None`` = --allow-unsigned.
    ``command`` names the caller in the usage errors."""
    identity, issuer, repository = args.cert_identity, args.cert_oidc_issuer, args.repository
    pattern = args.cert_identity_regexp
    any_repository = bool(args.any_repository)
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
        any_repository = any_repository or table.get("any_repository") is True
    if pattern:
        identity = pattern
    given = identity or issuer or repository or any_repository
    if args.allow_unsigned:
        if given:
            raise UsageError("--allow-unsigned skips signatures; drop it or the identity policy")
        return None
    if not (isinstance(identity, str) and identity and isinstance(issuer, str) and issuer):
        raise UsageError(
            f"{command} verifies every cert's signature: pass --cert-identity (or "
            "--cert-identity-regexp) and --cert-oidc-issuer (or --signing-policy FILE), or "
            "--allow-unsigned for a local check"
        )
    if repository and any_repository:
        raise UsageError("give --repository or --any-repository, not both")
    if not (isinstance(repository, str) and repository) and not any_repository:
        raise UsageError(
            f"{command} needs --repository OWNER/REPO (or `repository` in --signing-policy): "
            "every repository that calls the reusable cell workflow signs with the same "
            "workflow identity, so the identity alone accepts a cert signed for any of them "
            "(--any-repository accepts that explicitly)"
        )
    signer = SignerPolicy(
        identity=identity,
        issuer=issuer,
        repository=repository if isinstance(repository, str) else None,
        identity_is_regexp=bool(pattern),
    )
    policy_for(signer)  # a bad regexp is a usage error before any cert is read
    return BundlePolicy(signer, TrustRoot(offline=args.offline))
