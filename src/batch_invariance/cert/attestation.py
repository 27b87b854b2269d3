"""A cert as an in-toto attestation: a Test Result Statement, signed as a DSSE sigstore bundle.

The Statement (``https://in-toto.io/Statement/v1``) carries the Test Result predicate
(``https://in-toto.io/attestation/test-result/v0.1``) so the wider supply-chain tooling
(``gh attestation verify --predicate-type ...``, policy engines) can read a cert's outcome
without knowing our format:

* ``result``: GREEN → ``PASSED``, AMBER → ``WARNED``, RED and UNVERIFIED → ``FAILED``;
* ``configuration``: the cell (model, ctx, N, KV, gate, source) as one resource descriptor;
* ``passedTests`` / ``failedTests``: the cert's gate names by outcome;
* subjects: the cert file, the model and the server binary, each by sha256 (a mock cert
  has no model or server file, so only the cert file is a subject).

The bundle is written as ``<cert>.intoto.sigstore.json`` beside the cert. Verification checks
the signature and signer policy (the same as for the cert's own bundle), then that the
Statement is a test result whose subjects are exactly this cert file's bytes and the model
and server digests the cert records, and whose result is the cert's verdict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from batch_invariance.cert.schema import Cert
from batch_invariance.cert.signature import (
    SignerPolicy,
    TrustRoot,
    classify_failure,
    load_bundle,
    policy_for,
    verifier_for,
)
from batch_invariance.cert.signing import (
    BundleSigner,
    SigningIdentity,
    identity_of,
    write_bundle,
)
from batch_invariance.errors import CertInvalid, UsageError

__all__ = [
    "ATTESTATION_SUFFIX",
    "IN_TOTO_PAYLOAD_TYPE",
    "RESULT_OF_VERDICT",
    "STATEMENT_TYPE",
    "TEST_RESULT_PREDICATE",
    "SignedAttestation",
    "Subject",
    "VerifiedStatement",
    "attest_file",
    "attestation_path_for",
    "check_subjects",
    "expected_subjects",
    "statement_for",
    "verify_attestation",
    "verify_statement_bundle",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: Suffix of the attestation bundle written next to a cert.
ATTESTATION_SUFFIX = ".intoto.sigstore.json"

#: The Test Result ``result`` of each verdict: only GREEN passes; UNVERIFIED is a failure.
RESULT_OF_VERDICT: Mapping[str, str] = {
    "GREEN": "PASSED",
    "AMBER": "WARNED",
    "RED": "FAILED",
    "UNVERIFIED": "FAILED",
}


@dataclass(frozen=True)
class Subject:
    """One attested file: its name and sha256 (hex)."""

    name: str
    sha256: str


@dataclass(frozen=True)
class SignedAttestation:
    """An attestation bundle written next to its cert."""

    cert: Path
    bundle: Path
    identity: SigningIdentity


@dataclass(frozen=True)
class VerifiedStatement:
    """A DSSE bundle whose signature and signer policy verified, with its Statement."""

    statement: dict[str, Any]
    subjects: tuple[Subject, ...]


def attestation_path_for(cert: Path) -> Path:
    """Where the attestation of ``cert`` lives: ``<cert>.intoto.sigstore.json`` beside it."""
    return cert.with_name(cert.name + ATTESTATION_SUFFIX)


def expected_subjects(cert: Cert, cert_name: str, cert_sha256: str) -> tuple[Subject, ...]:
    """The subjects a cert's Statement must have: the cert file, then the model file and the
    server binary the provenance records a sha256 of."""
    subjects = [Subject(cert_name, cert_sha256)]
    model = cert.provenance.model_file
    if model is not None and model.sha256:
        subjects.append(Subject(model.name or Path(str(model.path)).name, model.sha256))
    binary = cert.provenance.server_binary
    if binary is not None and binary.sha256:
        subjects.append(Subject("llama-server", binary.sha256))
    return tuple(subjects)


def statement_for(cert: Cert, cert_name: str, cert_sha256: str) -> dict[str, Any]:
    """The in-toto Test Result Statement of ``cert`` (pure)."""
    verdict = str(cert.verdict)
    cell = f"{cert.model}/{cert.ctx}/{cert.dispatch_n}"
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": s.name, "digest": {"sha256": s.sha256}}
            for s in expected_subjects(cert, cert_name, cert_sha256)
        ],
        "predicateType": TEST_RESULT_PREDICATE,
        "predicate": {
            "result": RESULT_OF_VERDICT.get(verdict, "FAILED"),
            "configuration": [
                {
                    "name": cell,
                    "annotations": {
                        "model": cert.model,
                        "ctx": cert.ctx,
                        "parallel": cert.dispatch_n,
                        "kv": cert.kv_label,
                        "gate": cert.gate,
                        "source": cert.source,
                        "verdict": verdict,
                        "status": cert.status,
                        "tool_version": cert.tool_version,
                    },
                }
            ],
            "passedTests": sorted(name for name, gate in cert.gates.items() if gate.ok),
            "warnedTests": [],
            "failedTests": sorted(name for name, gate in cert.gates.items() if not gate.ok),
        },
    }


class _CertBytes(NamedTuple):
    """A cert file's bytes (what the Statement's first subject hashes) and the cert in them."""

    raw: bytes
    cert: Cert


def _read_cert_bytes(cert_path: Path) -> _CertBytes:
    from batch_invariance.cert.parse import parse_cert

    try:
        raw = cert_path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {cert_path}: {exc.strerror or exc}") from None
    return _CertBytes(raw, parse_cert(raw.decode("utf-8"), str(cert_path)))


def attest_file(cert_path: Path, token: str, signer: BundleSigner) -> SignedAttestation:
    """Sign the cert's Test Result Statement as DSSE; write the bundle beside it atomically."""
    raw, cert = _read_cert_bytes(cert_path)
    who = identity_of(token)
    statement = statement_for(cert, cert_path.name, hashlib.sha256(raw).hexdigest())
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode("utf-8")
    bundle_json = signer.sign_statement(payload, token)
    target = attestation_path_for(cert_path)
    write_bundle(target, bundle_json)
    return SignedAttestation(cert=cert_path, bundle=target, identity=who)


def verify_statement_bundle(
    bundle: Path, signer: SignerPolicy, trust: TrustRoot
) -> VerifiedStatement:
    """Verify a DSSE bundle's signature and signer policy; return its in-toto Statement."""
    from sigstore.errors import Error as SigstoreError

    rules = policy_for(signer)
    parsed = load_bundle(bundle, "the attestation")
    verifier = verifier_for(trust)
    try:
        payload_type, payload = verifier.verify_dsse(parsed, rules)
    except SigstoreError as exc:
        message = classify_failure(str(exc), signer).replace("signature", "attestation", 1)
        raise CertInvalid(message) from None
    if payload_type != IN_TOTO_PAYLOAD_TYPE:
        raise CertInvalid(f"attestation is not in-toto: payload type {payload_type!r}")
    try:
        statement = json.loads(payload)
        subjects = tuple(
            Subject(str(s["name"]), str(s["digest"]["sha256"])) for s in statement["subject"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CertInvalid(f"attestation Statement is malformed ({type(exc).__name__})") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise CertInvalid(f"attestation is not an in-toto Statement v1 ({STATEMENT_TYPE})")
    return VerifiedStatement(statement=statement, subjects=subjects)


def check_subjects(verified: VerifiedStatement, wanted: tuple[Subject, ...]) -> None:
    """Every wanted subject must be attested with its exact digest, and nothing else."""
    have = {s.sha256 for s in verified.subjects}
    missing = [s for s in wanted if s.sha256 not in have]
    if missing:
        names = ", ".join(f"{s.name} sha256:{s.sha256[:12]}…" for s in missing)
        raise CertInvalid(f"attestation does not cover {names} (subject digest mismatch)")
    extra = have - {s.sha256 for s in wanted}
    if extra:
        raise CertInvalid(f"attestation names {len(extra)} subject(s) this cert does not record")


def verify_attestation(
    cert_path: Path, bundle: Path, signer: SignerPolicy, trust: TrustRoot
) -> VerifiedStatement:
    """Verify a cert's attestation: signer, Test Result predicate, subjects and verdict."""
    verified = verify_statement_bundle(bundle, signer, trust)
    raw, cert = _read_cert_bytes(cert_path)
    if verified.statement.get("predicateType") != TEST_RESULT_PREDICATE:
        raise CertInvalid(
            f"attestation predicate is {verified.statement.get('predicateType')!r}, "
            f"not the Test Result predicate {TEST_RESULT_PREDICATE}"
        )
    check_subjects(
        verified, expected_subjects(cert, cert_path.name, hashlib.sha256(raw).hexdigest())
    )
    predicate = verified.statement.get("predicate")
    result = predicate.get("result") if isinstance(predicate, dict) else None
    wanted = RESULT_OF_VERDICT.get(str(cert.verdict), "FAILED")
    if result != wanted:
        raise CertInvalid(
            f"attestation result {result!r} does not match the cert's verdict "
            f"{cert.verdict} ({wanted})"
        )
    return verified
