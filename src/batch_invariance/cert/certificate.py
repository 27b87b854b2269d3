"""The cert's public names in one import, for callers outside the cert package.

The work is done elsewhere, one job per module: :mod:`~batch_invariance.cert.schema` (the
model and its JSON edge), :mod:`~batch_invariance.cert.build` (build and re-derive),
:mod:`~batch_invariance.cert.parse` (text to a checked cert) and
:mod:`~batch_invariance.cert.verify` (the one verification path and promotability rule).
"""

from __future__ import annotations

from batch_invariance.cert.build import (
    build_cert,
    differing_fields,
    evidence_from_cert,
    rederive,
    spec_from_cert,
)
from batch_invariance.cert.schema import (
    CERT_VERSION,
    GATE_ABC_UNION,
    SOURCES,
    Cert,
    canonical_json,
    cert_from_json,
    cert_to_json,
    compute_digest,
    display_verdict,
    schema_text,
)
from batch_invariance.cert.verify import cert_is_green, is_promotable

__all__ = [
    "CERT_VERSION",
    "GATE_ABC_UNION",
    "SOURCES",
    "Cert",
    "build_cert",
    "canonical_json",
    "cert_from_json",
    "cert_is_green",
    "cert_to_json",
    "compute_digest",
    "differing_fields",
    "display_verdict",
    "evidence_from_cert",
    "is_promotable",
    "rederive",
    "schema_text",
    "spec_from_cert",
]
