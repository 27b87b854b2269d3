"""Keyless sigstore signing and verification of cert files.

A cert is signed as an opaque artifact: the bundle covers the exact bytes on disk, so a
changed byte (even whitespace) breaks the signature. Signing needs an OIDC identity: the
ambient GitHub Actions one (the job must have ``permissions: id-token: write``) or an explicit
token. Verification checks the bundle against the trust root of the instance that signed it
(public-good production, or staging for ``sign --staging``) and an identity policy
(certificate SAN, exactly or by regular expression, + OIDC issuer, optionally the GitHub
repository). The in-toto attestation of a cert (:mod:`batch_invariance.cert.attestation`)
goes through the same signer and the same policy.

The network-facing part of signing (Fulcio, Rekor) sits behind :class:`BundleSigner`, so the
rest of the path (identity detection, token checks, atomic bundle write) runs in tests with a
fake signer; :class:`SigstoreSigner` is the real one.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from batch_invariance.cert.store import atomic_write_text
from batch_invariance.errors import CertInvalid, InfraError, UsageError

__all__ = [
    "BUNDLE_SUFFIX",
    "GITHUB_ACTIONS_ISSUER",
    "BundlePolicy",
    "BundleSigner",
    "SignedBundle",
    "SignerPolicy",
    "SigningIdentity",
    "SigstoreSigner",
    "TrustRoot",
    "bundle_path_for",
    "classify_failure",
    "detect_token",
    "identity_of",
    "load_bundle",
    "policy_for",
    "sign_file",
    "verifier_for",
    "verify_bundle",
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


@dataclass(frozen=True)
class SignerPolicy:
    """Who must have signed: the certificate SAN, its OIDC issuer, optionally the repository.

    With ``identity_is_regexp`` the SAN must match ``identity`` as a whole (``re.fullmatch``),
    which lets one policy accept a reusable workflow pinned by tag or by commit SHA.
    """

    identity: str
    issuer: str
    repository: str | None = None
    identity_is_regexp: bool = False


@dataclass(frozen=True)
class TrustRoot:
    """Which Sigstore instance's trust root to verify against, and whether to go online."""

    staging: bool = False
    offline: bool = False


@dataclass(frozen=True)
class BundlePolicy:
    """A signature requirement: who must have signed, checked against which trust root."""

    signer: SignerPolicy
    trust: TrustRoot


def bundle_path_for(artifact: Path) -> Path:
    """Where the bundle of ``artifact`` lives: ``<artifact>.sigstore.json`` beside it."""
    return artifact.with_name(artifact.name + BUNDLE_SUFFIX)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _quiet_sigstore_logs() -> None:
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
            f"no OIDC identity to sign with ({_one_line(exc)}); {_PERMISSION_HINT}"
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
            f"identity token rejected: {_one_line(exc)}; pass a fresh sigstore-audience "
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

        _quiet_sigstore_logs()
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
                f"sigstore signing failed: {_one_line(exc)}; check network access to "
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


def classify_failure(message: str, policy: SignerPolicy) -> str:
    """Turn sigstore's verification error into our one-line, kind-specific message."""
    text = _one_line(message)
    if "digest mismatch" in text:
        return (
            "signature does not cover these bytes (digest mismatch): the cert was changed "
            "after it was signed"
        )
    if "SANs do not match" in text:
        actual = text.split("actual SANs:", 1)[1].strip() if "actual SANs:" in text else "?"
        # sigstore prints the SANs as a Python set; show them as plain text.
        actual = ", ".join(s.strip(" '\"") for s in actual.strip("{}").split(",")) or "?"
        wanted = f"/{policy.identity}/" if policy.identity_is_regexp else policy.identity
        return f"signature identity mismatch: signed by {actual}, expected {wanted}"
    if "OIDCIssuer" in text:
        return f"signature issuer mismatch: {text} (expected issuer {policy.issuer})"
    if SOURCE_REPOSITORY_POLICY in text:
        if "does not contain" in text:
            return (
                "signature repository mismatch: the signing certificate carries no "
                f"source-repository claim ({SOURCE_REPOSITORY_OID}), so it cannot show it was "
                f"signed for {policy.repository}"
            )
        got = text.split("(got ", 1)[1].split(",", 1)[0] if "(got " in text else "?"
        wanted = repository_uri(policy.repository) if policy.repository else "?"
        return (
            f"signature repository mismatch: signed for source repository {got}, expected {wanted}"
        )
    lowered = text.lower()
    if any(k in lowered for k in ("verified time", "certificate chain", "trust root", "ct log")):
        # The bundle's certificate or log entry is not anchored in the trust root we used:
        # typically a staging bundle checked against production, or the other way round.
        return (
            f"signature not anchored in this Sigstore instance's trust root ({text}); a "
            "bundle from `sign --staging` verifies only with --staging, and vice versa"
        )
    return f"signature verification failed: {text}"


#: The Fulcio certificate extension that names the repository a GitHub Actions job ran for
#: (the caller's, also when a reusable workflow signs), and sigstore's policy class for it.
SOURCE_REPOSITORY_OID = "1.3.6.1.4.1.57264.1.12"
SOURCE_REPOSITORY_POLICY = "OIDCSourceRepositoryURI"
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def repository_uri(repository: str) -> str:
    """``OWNER/REPO`` (or its ``https://github.com/`` URL) as the certificate's
    source-repository claim spells it; a usage error when it is not one."""
    name = repository.strip().removeprefix("https://github.com/").rstrip("/")
    if not _REPOSITORY.match(name):
        raise UsageError(f"repository {repository!r} is not OWNER/REPO (e.g. octo-org/llm-deploy)")
    return f"https://github.com/{name}"


class _IdentityPattern:
    """A sigstore verification policy: OIDC issuer plus a SAN that fully matches a pattern."""

    def __init__(self, pattern: str, issuer: str) -> None:
        try:
            self._pattern = re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"identity pattern {pattern!r} is not a valid regex: {exc}") from None
        self._issuer = issuer

    def verify(self, cert: Any) -> None:
        from cryptography.x509 import RFC822Name, SubjectAlternativeName, UniformResourceIdentifier
        from sigstore.errors import VerificationError
        from sigstore.verify import policy

        policy.OIDCIssuer(self._issuer).verify(cert)
        san = cert.extensions.get_extension_for_class(SubjectAlternativeName).value
        sans = {
            *san.get_values_for_type(RFC822Name),
            *san.get_values_for_type(UniformResourceIdentifier),
        }
        if not any(self._pattern.fullmatch(value) for value in sans):
            raise VerificationError(
                f"Certificate's SANs do not match {self._pattern.pattern}; actual SANs: {sans}"
            )


def policy_for(wanted: SignerPolicy) -> Any:
    """The sigstore verification policy for ``wanted``."""
    from sigstore.verify import policy

    if not wanted.identity or not wanted.issuer:
        raise UsageError("signature verification needs both an identity and an OIDC issuer")
    rules: list[Any] = [
        _IdentityPattern(wanted.identity, wanted.issuer)
        if wanted.identity_is_regexp
        else policy.Identity(identity=wanted.identity, issuer=wanted.issuer)
    ]
    if wanted.repository:
        rules.append(policy.OIDCSourceRepositoryURI(repository_uri(wanted.repository)))
    return policy.AllOf(rules)


def load_bundle(bundle: Path, what: str = "the cert") -> Any:
    """Parse a sigstore bundle file; CertInvalid (one line) when it is missing or corrupt."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle

    if not bundle.is_file():
        raise CertInvalid(
            f"signature bundle missing: {bundle} does not exist; sign {what} with "
            "`batch-invariance sign CERT` or pass the right bundle"
        )
    try:
        return Bundle.from_json(bundle.read_bytes())
    except (SigstoreError, ValueError, OSError) as exc:
        first = _one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise CertInvalid(
            f"signature bundle corrupt: {bundle} is not a valid sigstore bundle ({first})"
        ) from None


def verifier_for(trust: TrustRoot) -> Any:
    """A sigstore Verifier for production or staging; InfraError when the root cannot load."""
    from sigstore.verify import Verifier

    _quiet_sigstore_logs()
    try:
        if trust.staging:
            return Verifier.staging(offline=trust.offline)
        return Verifier.production(offline=trust.offline)
    except Exception as exc:  # TUF/network errors come in many kinds
        hint = "" if trust.offline else "; retry with --offline to use the embedded trust root"
        raise InfraError(f"cannot load the sigstore trust root: {_one_line(exc)}{hint}") from None


def verify_bundle(
    artifact: Path, bundle: Path, wanted: SignerPolicy, trust: TrustRoot = TrustRoot()
) -> None:
    """Verify that ``bundle`` signs ``artifact``'s exact bytes for the ``wanted`` signer.

    The policy is the certificate SAN ``identity`` (exact, or a full-match regular expression
    with ``identity_is_regexp``) plus OIDC ``issuer`` and, when ``repository`` is given, the
    certificate's source-repository claim (``OWNER/REPO``, extension
    :data:`SOURCE_REPOSITORY_OID`). ``trust.staging`` verifies against the
    Sigstore staging instance (bundles from ``sign --staging``); ``trust.offline`` uses the
    trust root embedded in sigstore (no network; HOME must be writable for its cache). Raises
    CertInvalid with a distinct one-line message for a missing or corrupt bundle, a changed
    byte, a wrong identity, issuer, repository or instance; InfraError when the trust root
    cannot be loaded.
    """
    from sigstore.errors import Error as SigstoreError

    rules = policy_for(wanted)
    parsed = load_bundle(bundle)
    try:
        payload = artifact.read_bytes()
    except OSError as exc:
        raise CertInvalid(f"cannot read {artifact}: {exc.strerror or exc}") from None
    verifier = verifier_for(trust)
    try:
        verifier.verify_artifact(payload, parsed, rules)
    except SigstoreError as exc:
        raise CertInvalid(classify_failure(str(exc), wanted)) from None
