"""Keyless sigstore signing of cert files (verification: :mod:`batch_invariance.cert.signature`).

A cert is signed as an opaque artifact: the bundle covers the exact bytes on disk, so a
changed byte (even whitespace) breaks the signature. Signing needs an OIDC identity: the
ambient GitHub Actions one (the job must have ``permissions: id-token: write``) or an explicit
token. Verification checks the bundle against the trust root of the instance that signed it
(public-good production, or staging for ``sign --staging``) and an identity policy
(certificate SAN, exactly or by regular expression, + OIDC issuer, optionally the GitHub
repository); that half lives in :mod:`batch_invariance.cert.signature`. The in-toto
attestation of a cert (:mod:`batch_invariance.cert.attestation`) goes through the same signer
and the same policy.

The network-facing part of signing (Fulcio, Rekor) sits behind :class:`BundleSigner`, so the
rest of the path (identity detection, token checks, atomic bundle write) runs in tests with a
fake signer; :class:`SigstoreSigner` is the real one.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from batch_invariance.cert.store import atomic_write_text
from batch_invariance.errors import InfraError, UsageError

__all__ = [
    "BUNDLE_SUFFIX",
    "GITHUB_ACTIONS_ISSUER",
    "BundleSigner",
    "SignedBundle",
    "SigningIdentity",
    "SigstoreSigner",
    "bundle_path_for",
    "detect_token",
    "identity_of",
    "one_line",
    "quiet_sigstore_logs",
    "sign_file",
    "write_bundle",
]

#: Suffix of the bundle written next to a signed file.
BUNDLE_SUFFIX = ".sigstore.json"

#: The OIDC issuer of GitHub Actions workflow identities.
GITHUB_ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"

_PERMISSION_HINT = (
    "add `permissions: id-token: write` to the job (GitHub Actions) or pass --identity-token TOKEN"
)


@dataclass(frozen=True)
class SigningIdentity:
    """Who a token says the signer is (read from its unverified claims).

    For GitHub Actions ``identity`` is the workflow URL the certificate SAN will carry
    (``https://github.com/OWNER/REPO/.github/workflows/X.yml@REF``).
    """

    identity: str
    issuer: str


@dataclass(frozen=True)
class SignedBundle:
    """A bundle written next to its artifact."""

    artifact: Path
    bundle: Path
    identity: SigningIdentity


class BundleSigner(Protocol):
    """Turns bytes plus an OIDC token into a sigstore bundle (JSON text).

    ``sign`` signs an artifact's bytes (a message-signature bundle); ``sign_statement`` signs
    an in-toto Statement (JSON bytes) as a DSSE envelope.
    """

    def sign(self, payload: bytes, token: str) -> str: ...

    def sign_statement(self, statement: bytes, token: str) -> str: ...


def bundle_path_for(artifact: Path) -> Path:
    """Where the bundle of ``artifact`` lives: ``<artifact>.sigstore.json`` beside it."""
    return artifact.with_name(artifact.name + BUNDLE_SUFFIX)


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def quiet_sigstore_logs() -> None:
    # sigstore warns on stderr that an offline TUF root is not refreshed; that is the point
    # of --offline, and the CLI's contract is one line per outcome.
    for name in ("sigstore", "tuf"):
        logging.getLogger(name).setLevel(logging.ERROR)


def detect_token(explicit: str | None) -> str:
    """Return the OIDC token to sign with: ``explicit`` if given, else the ambient one.

    The ambient credential comes from sigstore's detector (in GitHub Actions it asks
    ``ACTIONS_ID_TOKEN_REQUEST_URL`` with ``ACTIONS_ID_TOKEN_REQUEST_TOKEN``). Raises
    UsageError with one line saying what to add when no identity is available.
    """
    if explicit is not None:
        token = explicit.strip()
        if not token:
            raise UsageError(f"--identity-token is empty; {_PERMISSION_HINT}")
        return token
    from sigstore.oidc import IdentityError, detect_credential

    try:
        found = detect_credential()
    except IdentityError as exc:
        raise UsageError(
            f"no OIDC identity to sign with ({one_line(exc)}); {_PERMISSION_HINT}"
        ) from None
    if not found:
        raise UsageError(f"no OIDC identity to sign with; {_PERMISSION_HINT}")
    return str(found)


def identity_of(token: str) -> SigningIdentity:
    """Check that ``token`` is a usable sigstore identity token and say whose it is.

    The signature of the token is not checked here (Fulcio does that); this catches
    malformed, expired or wrong-audience tokens before any network call.
    """
    from sigstore.oidc import IdentityError, IdentityToken

    try:
        parsed = IdentityToken(token)
    except IdentityError as exc:
        raise UsageError(
            f"identity token rejected: {one_line(exc)}; pass a fresh sigstore-audience "
            "OIDC token or sign inside GitHub Actions with `permissions: id-token: write`"
        ) from None
    issuer = str(parsed.issuer)
    identity = str(parsed.identity)
    workflow_ref = _claims(token).get("job_workflow_ref")
    if issuer == GITHUB_ACTIONS_ISSUER and isinstance(workflow_ref, str) and workflow_ref:
        # Fulcio puts the workflow URL in the certificate SAN; that is what verifiers pin.
        identity = f"https://github.com/{workflow_ref}"
    return SigningIdentity(identity=identity, issuer=issuer)


def _claims(token: str) -> dict[str, Any]:
    """The unverified claims of a JWT (only read for display; Fulcio checks the token)."""
    try:
        payload = token.split(".")[1]
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class SigstoreSigner:
    """Signs against a Sigstore instance (Fulcio + Rekor; needs network)."""

    def __init__(self, *, staging: bool = False) -> None:
        self._staging = staging

    def sign(self, payload: bytes, token: str) -> str:
        return self._sign(lambda signer: signer.sign_artifact(payload), token)

    def sign_statement(self, statement: bytes, token: str) -> str:
        from sigstore.dsse import Statement

        return self._sign(lambda signer: signer.sign_dsse(Statement(statement)), token)

    def _sign(self, action: Any, token: str) -> str:
        from sigstore.models import ClientTrustConfig
        from sigstore.oidc import IdentityToken
        from sigstore.sign import SigningContext

        quiet_sigstore_logs()
        host = "sigstage.dev" if self._staging else "sigstore.dev"
        try:
            config = (
                ClientTrustConfig.staging() if self._staging else ClientTrustConfig.production()
            )
            context = SigningContext.from_trust_config(config)
            with context.signer(IdentityToken(token), cache=False) as signer:
                bundle: Any = action(signer)
        except Exception as exc:  # sigstore raises many kinds; all mean "could not sign"
            raise InfraError(
                f"sigstore signing failed: {one_line(exc)}; check network access to "
                f"fulcio.{host} and rekor.{host} and retry"
            ) from None
        return str(bundle.to_json())


def sign_file(artifact: Path, token: str, signer: BundleSigner | None = None) -> SignedBundle:
    """Sign ``artifact``'s bytes and write ``<artifact>.sigstore.json`` beside it atomically.

    Nothing is written unless signing succeeded; an existing bundle is replaced only by a
    complete new one.
    """
    try:
        payload = artifact.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {artifact}: {exc.strerror or exc}") from None
    who = identity_of(token)
    bundle_json = (signer or SigstoreSigner()).sign(payload, token)
    target = bundle_path_for(artifact)
    write_bundle(target, bundle_json)
    return SignedBundle(artifact=artifact, bundle=target, identity=who)


def write_bundle(target: Path, bundle_json: str) -> None:
    """Write a bundle atomically (a failure leaves any older bundle as it was)."""
    try:
        atomic_write_text(target, bundle_json)
    except OSError as exc:
        raise InfraError(f"cannot write {target}: {exc.strerror or exc}") from None
