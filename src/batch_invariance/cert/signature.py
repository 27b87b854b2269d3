"""Verifying a sigstore bundle over a cert: who must have signed (:class:`SignerPolicy`),
against which Sigstore instance (:class:`TrustRoot`), and a one-line message for each way a
check fails. Signing is :mod:`batch_invariance.cert.signing`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_invariance.cert.signing import one_line, quiet_sigstore_logs
from batch_invariance.errors import CertInvalid, InfraError, UsageError

__all__ = [
    "SOURCE_REPOSITORY_OID",
    "BundlePolicy",
    "SignerPolicy",
    "TrustRoot",
    "classify_failure",
    "load_bundle",
    "policy_for",
    "repository_uri",
    "verifier_for",
    "verify_bundle",
]


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


def classify_failure(message: str, policy: SignerPolicy) -> str:
    """Turn sigstore's verification error into our one-line, kind-specific message."""
    text = one_line(message)
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
        first = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise CertInvalid(
            f"signature bundle corrupt: {bundle} is not a valid sigstore bundle ({first})"
        ) from None


def verifier_for(trust: TrustRoot) -> Any:
    """A sigstore Verifier for production or staging; InfraError when the root cannot load."""
    from sigstore.verify import Verifier

    quiet_sigstore_logs()
    try:
        if trust.staging:
            return Verifier.staging(offline=trust.offline)
        return Verifier.production(offline=trust.offline)
    except Exception as exc:  # TUF/network errors come in many kinds
        hint = "" if trust.offline else "; retry with --offline to use the embedded trust root"
        raise InfraError(f"cannot load the sigstore trust root: {one_line(exc)}{hint}") from None


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
