"""Checking a cert file end to end: schema, digest, and the verdict re-derived from its own
evidence with the same pure core that wrote it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.certificate import (
    Cert,
    consistency_errors,
    display_verdict,
    is_promotable,
    rederive,
)
from batch_invariance.cert.store import read_cert
from batch_invariance.errors import CertInvalid


@dataclass(frozen=True)
class VerificationReport:
    """What ``verify-cert`` found for a cert that passed every check."""

    path: Path
    cert: Cert
    model: str
    ctx: int
    dispatch_n: int
    status: str
    verdict: str
    source: str
    gate: str
    promotable: bool
    reasons: tuple[str, ...]


def verify_cert(cert: Cert, origin: str = "cert") -> None:
    """Re-derive ``cert`` from its embedded evidence; raise :class:`CertInvalid` naming the
    first disagreement (the status first, then any other top-level field)."""
    try:
        errors = consistency_errors(cert)
    except Exception as exc:  # evidence that cannot be judged is not a valid cert
        raise CertInvalid(
            f"{origin}: the embedded evidence cannot be re-judged ({type(exc).__name__}: {exc})"
        ) from None
    if not errors:
        return
    if errors[0] == "status":
        rebuilt = rederive(cert)
        raise CertInvalid(
            f"{origin}: stored status {cert.status!r} but its own evidence gives "
            f"{rebuilt.status!r}; the verdict was edited or the evidence was changed"
        )
    shown = ", ".join(errors[:5]) + (" ..." if len(errors) > 5 else "")
    raise CertInvalid(
        f"{origin}: fields disagree with the verdict re-derived from its evidence: {shown}"
    )


def verify_cert_file(path: Path) -> VerificationReport:
    """Read ``path`` and check schema, digest and re-derivation; raise :class:`CertInvalid`
    with a specific one-line message on the first failure."""
    p = Path(path)
    cert = read_cert(p)
    verify_cert(cert, str(p))
    return VerificationReport(
        path=p,
        cert=cert,
        model=cert.model,
        ctx=cert.ctx,
        dispatch_n=cert.dispatch_n,
        status=cert.status,
        verdict=display_verdict(cert.status),
        source=cert.source,
        gate=cert.gate,
        promotable=is_promotable(cert),
        reasons=tuple(cert.decision_reasons),
    )
