"""The cert model: the core's own frozen dataclasses, validated at the JSON edge by pydantic.

There are no pydantic twins of the core types. :class:`Cert` is a frozen dataclass whose
blocks *are* the core values (:class:`~batch_invariance.core.diff.PairReport`, the gate
records, :class:`~batch_invariance.core.verdict.Sensitivity`, :class:`GatePolicy`, ...).
One ``TypeAdapter`` validates and dumps the whole tree:

* strict and closed: an unknown key, a missing key or a wrongly typed value is a schema error
  (the config below reaches every nested dataclass);
* NaN, Infinity and integers too long to parse are schema errors, not crashes;
* :data:`JSON_RENAMES` is the one table of JSON keys that differ from attribute names.

The only cert-specific records are those with no core counterpart: the trial *as embedded*
(an excerpt and the content sha instead of the text, the map key instead of ``test_id``,
``cache_n`` instead of the timings), the blocks that hold such trials, and the small views
the cert derives (``arm_b``, ``gates``, ``promotion_scope``). Pure: no files, no clocks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, ConfigDict, TypeAdapter

from batch_invariance.cert.provenance import Provenance
from batch_invariance.core.cache_arm import PromptCacheOutcome
from batch_invariance.core.evidence import GatePolicy, ItemMeta
from batch_invariance.core.gates import CoverageGate, FloorGate, OverlapGate, TransportGate
from batch_invariance.core.numerics import Numerics
from batch_invariance.core.schedule import SerialRepeatGate
from batch_invariance.core.scope import SequenceScope
from batch_invariance.core.throughput import Throughput
from batch_invariance.core.verdict import Reports, Sensitivity, Status

__all__ = [
    "CERT_ADAPTER",
    "CERT_VERSION",
    "GATE_ABC_UNION",
    "HEADER_ADAPTER",
    "JSON_RENAMES",
    "SOURCES",
    "ArmB",
    "Cert",
    "CertHeader",
    "DisplayVerdict",
    "EvidenceRecord",
    "GateOutcome",
    "PassEvidence",
    "PromotionScope",
    "Source",
    "TrialRecord",
    "canonical_json",
    "cert_from_json",
    "cert_to_json",
    "compute_digest",
    "display_verdict",
    "schema_text",
]

#: The cert's layout (its keys and types), not its rules: those are ``rules_version``
#: (:data:`batch_invariance.core.rules.RULES_VERSION`). Bump together with the ``Literal`` on
#: :attr:`Cert.cert_version` (a test checks both).
CERT_VERSION: Final = 3
GATE_ABC_UNION = "abc_union"
Source = Literal["live", "mock", "attached"]
SOURCES: tuple[str, ...] = ("live", "mock", "attached")
DisplayVerdict = Literal["GREEN", "RED", "AMBER", "UNVERIFIED"]

_DISPLAY: Mapping[str, DisplayVerdict] = {
    "failed": "RED",
    "green_unverified": "UNVERIFIED",
    "green_with_caveat": "AMBER",
    "green": "GREEN",
}

#: Attribute name -> JSON key, wherever the two differ (the one rename table). Names are
#: unique across the model, so the table needs no class qualifier (a test checks it).
JSON_RENAMES: Mapping[str, str] = {
    "ac": "AC",
    "ab": "AB",
    "bc": "BC",
    "aa": "AA",
}


def _json_key(name: str) -> str:
    return JSON_RENAMES.get(name, name)


def _of_json_type(kind: type) -> BeforeValidator:
    """pydantic matches an int or bool ``Literal`` by equality, so ``true`` would pass for
    ``1`` and ``0`` for ``false``; a cert must hold the value with its own JSON type."""

    def check(value: object) -> object:
        if type(value) is not kind:
            raise ValueError(f"should be a JSON {'boolean' if kind is bool else 'integer'}")
        return value

    return BeforeValidator(check)


_CONFIG = ConfigDict(
    extra="forbid",
    strict=True,
    allow_inf_nan=False,
    alias_generator=_json_key,
)


@dataclass(frozen=True)
class TrialRecord:
    """One trial as embedded in the cert (its id is the map key)."""

    score: float | None
    passed: bool | None
    extracted_answer: str | None
    expected_answer: str | None
    prompt_tokens_measured: int | None
    failure_mode: str
    content_sha256: str | None = None
    #: The first characters of the completion; the content sha is what gets compared.
    completion_excerpt: str | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tokens: tuple[str, ...] | None = None
    token_logprobs: tuple[float, ...] | None = None
    top_margins: tuple[float | None, ...] | None = None
    dispatch_ts: float | None = None
    complete_ts: float | None = None
    slot_id: int | None = None
    transport_error: str | None = None
    #: The server's ``timings.cache_n`` (prompt tokens reused from cache) when reported.
    cache_n: int | None = None
    #: The failed first attempt of a serial request retried once (absent: not retried).
    first_attempt: str | None = None


@dataclass(frozen=True)
class PassEvidence:
    """One C pass as embedded: :class:`~batch_invariance.core.evidence.PassRecord` with
    embedded trials."""

    index: int
    server_busy_max: int | None
    busy_source: str
    order: tuple[str, ...]
    trials: Mapping[str, TrialRecord]


@dataclass(frozen=True)
class EvidenceRecord:
    """The cell's evidence as embedded, and the policy it was judged under."""

    items: tuple[ItemMeta, ...]
    a: Mapping[str, TrialRecord]
    a_repeat: Mapping[str, TrialRecord] | None
    b: Mapping[str, TrialRecord]
    c_passes: tuple[PassEvidence, ...]
    policy: GatePolicy
    #: The ids arm B ran on when a RED cell limited it to its divergent ids; absent: every id.
    b_ids: tuple[str, ...] | None = None
    #: The prompt-cache arm's passes; absent when the prompt cache was not measured.
    cache_passes: tuple[PassEvidence, ...] | None = None
    #: Tokens per slot the sequence-scope rule held the measured lengths against (always the
    #: cert's ``ctx``); absent in certs written before the rule, which it then does not judge.
    slot_ctx: int | None = None


@dataclass(frozen=True)
class GateOutcome:
    ok: bool
    reason: str


@dataclass(frozen=True)
class ArmB:
    ab_passed: bool
    bc_passed: bool


@dataclass(frozen=True)
class PromotionScope:
    model: str
    ctx: int
    dispatch_n: int
    kv_label: str
    valid_for: str
    generalizes: Annotated[Literal[False], _of_json_type(bool)]
    is_moe: bool | None
    moe_warning: str
    rule_of_three: str
    #: Generated tokens over the hot comparisons (each the shorter of A and C), lower median.
    answer_tokens_min: int | None
    answer_tokens_median: int | None
    answer_tokens_max: int | None
    #: Share of hot comparisons where the token budget cut A or C.
    share_cut_by_budget: float | None


@dataclass(frozen=True)
class Cert:
    """One cell's cert. See ``docs/output-contract.md`` for every field."""

    __pydantic_config__ = _CONFIG

    cert_version: Annotated[Literal[3], _of_json_type(int)]
    tool_version: str
    model: str
    ctx: int
    dispatch_n: int
    status: Status
    verdict: DisplayVerdict
    source: Source
    gate: str
    overlap_ok: bool
    overlap: OverlapGate
    kv_label: str
    reps: int
    n_passes: int
    invariant_fields: tuple[str, ...]
    ts_utc: str
    mismatch: bool
    divergence_class: str | None
    anomaly: str | None
    token_divergence_ids: tuple[str, ...]
    arm_b: ArmB
    per_pass_ac_divergent: tuple[int, ...]
    per_pass_ac_token_only: tuple[int, ...]
    decision_reasons: tuple[str, ...]
    #: AC, AB, BC and AA (A against its serial repeat A'; ``null`` when A' was not run).
    divergence_report: Reports
    completion_floor: FloorGate
    cobatch_coverage: CoverageGate
    transport: TransportGate
    serial_repeat: SerialRepeatGate
    gates: Mapping[str, GateOutcome]
    sensitivity: Sensitivity
    #: Every arm's pre-sampling logprobs compared bitwise: AC, AB, BC and AA per pass, the
    #: numeric evidence gate, the divergence-risk estimate and the statement.
    numerics: Numerics
    promotion_scope: PromotionScope
    #: How the cell was run: open, but every key the tool reads is typed.
    provenance: Provenance
    evidence: EvidenceRecord
    digest: str
    #: Serial (arm A) against concurrent (C passes) throughput, from ``provenance.arms``;
    #: absent (never ``null``) in certs written before it was measured.
    throughput: Throughput | None = None
    #: The prompt-cache arm against A (reuse the server reported, the comparison, its
    #: status); absent (never ``null``) when the cell did not measure the prompt cache, as in
    #: every cert written before it could: such a cert covers cache-off traffic only.
    prompt_cache: PromptCacheOutcome | None = None
    #: The sequence lengths measured against the slot (the longest, the bands, where drift
    #: began); absent (never ``null``) in certs written before it was recorded: readers then
    #: say "sequence length: not recorded" and the deploy gate covers no slot with them.
    sequence_scope: SequenceScope | None = None
    #: The decision rules it was judged under (:mod:`batch_invariance.core.rules`); absent
    #: (never ``null``) in certs written before the rules were versioned: those hold the
    #: rules of exactly their ``tool_version``.
    rules_version: Annotated[int, _of_json_type(int)] | None = None


@dataclass(frozen=True)
class CertHeader:
    """What any cert version carries, read leniently to say which version wrote a cert."""

    __pydantic_config__ = ConfigDict(extra="ignore", strict=True)

    cert_version: int
    tool_version: str
    #: ``None``: not recorded (a cert written before the rules were versioned).
    rules_version: int | None = None


CERT_ADAPTER: TypeAdapter[Cert] = TypeAdapter(Cert)
HEADER_ADAPTER: TypeAdapter[CertHeader] = TypeAdapter(CertHeader)


def canonical_json(data: Any) -> str:
    """Sorted keys, no insignificant whitespace, no NaN: the form the digest is taken over."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def cert_to_json(cert: Cert) -> dict[str, Any]:
    """The cert as plain JSON values, with the JSON key names."""
    out: dict[str, Any] = CERT_ADAPTER.dump_python(cert, mode="json", by_alias=True, warnings=False)
    if out.get("throughput") is None:
        # Absent, not null: a cert written without the block keeps its digest.
        out.pop("throughput", None)
    if out.get("prompt_cache") is None:
        # Absent: the cache was not measured, as in every cert before the cache arm.
        out.pop("prompt_cache", None)
    if out.get("sequence_scope") is None:
        # Absent: the slot was not recorded, as in every cert before the scope rule.
        out.pop("sequence_scope", None)
    if out.get("rules_version") is None:
        # Absent: a cert written before the rules were versioned keeps its digest.
        out.pop("rules_version", None)
    if out["evidence"].get("slot_ctx") is None:
        out["evidence"].pop("slot_ctx", None)
    if out["evidence"]["policy"].get("min_slot_fill") is None:
        # Absent: the default share, as in every cert written before it could be set.
        out["evidence"]["policy"].pop("min_slot_fill", None)
    if out["evidence"].get("cache_passes") is None:
        out["evidence"].pop("cache_passes", None)
    if out["evidence"].get("b_ids") is None:
        # Likewise: B on every id, as every cert written before B could run on a subset.
        out["evidence"].pop("b_ids", None)
    for item in out["evidence"]["items"]:
        if item.get("request_key") is None:
            # Likewise: items of certs written before request keys were recorded.
            item.pop("request_key", None)
    for trials in _trial_maps(out["evidence"]):
        for record in trials.values():
            if record.get("first_attempt") is None:
                # Likewise: a request that was not retried, as in every cert before retries.
                record.pop("first_attempt", None)
    return out


def _trial_maps(evidence: dict[str, Any]) -> list[dict[str, Any]]:
    """Every map of embedded trials in the evidence block (A, A', B, each C pass and each
    prompt-cache pass)."""
    maps = [evidence.get("a"), evidence.get("a_repeat"), evidence.get("b")]
    maps += [p.get("trials") for p in evidence.get("c_passes") or ()]
    maps += [p.get("trials") for p in evidence.get("cache_passes") or ()]
    return [m for m in maps if isinstance(m, dict)]


def cert_from_json(text: str | bytes) -> Cert:
    """Validate cert JSON text; raises ``pydantic.ValidationError`` on any schema error."""
    return CERT_ADAPTER.validate_json(text)


def compute_digest(data: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``data`` without its ``digest`` key."""
    body = {k: v for k, v in data.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def display_verdict(status: str) -> DisplayVerdict:
    """GREEN / RED / AMBER / UNVERIFIED; anything unknown shows as UNVERIFIED."""
    return _DISPLAY.get(status, "UNVERIFIED") if isinstance(status, str) else "UNVERIFIED"


def schema_text() -> str:
    """The JSON schema of :class:`Cert`, as written to ``docs/cert.schema.json``."""
    schema = CERT_ADAPTER.json_schema(by_alias=True)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
