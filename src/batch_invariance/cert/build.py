"""Building a cert from the core's values, and rebuilding it from its own evidence (pure).

* :func:`build_cert` turns evidence + verdict + spec + provenance into a :class:`Cert` whose
  ``digest`` is the sha256 of the canonical JSON of everything else. The cert is validated
  from its own JSON form before it is digested, so what is written is exactly what a reader
  gets back.
* :func:`rederive` rebuilds the whole cert from its embedded evidence with the same pure
  :func:`~batch_invariance.core.verdict.decide`; :func:`differing_fields` names every
  top-level field where a stored cert and its rebuild disagree. :func:`rederive_draft` is
  the same rebuild before the JSON edge, for the verification path to compare value by value
  (:mod:`~batch_invariance.cert.identical`) before it serialises anything.

Nothing here reads files or clocks: the timestamp comes from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from operator import attrgetter
from typing import Any, NamedTuple

from batch_invariance import __version__
from batch_invariance.cert.derived import gates_block, promotion_scope
from batch_invariance.cert.provenance import Provenance
from batch_invariance.cert.schema import (
    CERT_VERSION,
    SOURCES,
    ArmB,
    Cert,
    EvidenceRecord,
    PassEvidence,
    Source,
    TrialRecord,
    canonical_json,
    cert_from_json,
    cert_to_json,
    compute_digest,
    display_verdict,
)
from batch_invariance.core.diff import content_key, excerpt
from batch_invariance.core.evidence import (
    INVARIANT_FIELDS,
    CellEvidence,
    CellSpec,
    GatePolicy,
    PassRecord,
    Trial,
)
from batch_invariance.core.rules import RULES_VERSION
from batch_invariance.core.throughput import throughput_of_arms
from batch_invariance.core.verdict import EngineAdvice, Verdict, decide

#: Trial attributes carried one to one into the embedded record (same name, same value).
_SHARED_TRIAL_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(TrialRecord) if f.name in {g.name for g in fields(Trial)}
)
#: Those attributes read in one C call (a cert embeds thousands of trials).
_shared_values = attrgetter(*_SHARED_TRIAL_FIELDS)


def embed_trial(trial: Trial) -> TrialRecord:
    """The trial as the cert carries it: an excerpt and the content sha stand in for the
    completion, and of the timings only ``cache_n`` is kept."""
    cache_n = trial.timings.get("cache_n")
    shared = dict(zip(_SHARED_TRIAL_FIELDS, _shared_values(trial), strict=True))
    shared["content_sha256"] = content_key(trial)
    return TrialRecord(
        **shared,
        completion_excerpt=excerpt(trial),
        cache_n=None if cache_n is None else int(cache_n),
    )


def trial_from_record(test_id: str, record: TrialRecord) -> Trial:
    """The :class:`Trial` an embedded record stands for (the excerpt in place of the text)."""
    shared = dict(zip(_SHARED_TRIAL_FIELDS, _shared_values(record), strict=True))
    return Trial(
        test_id=test_id,
        completion=record.completion_excerpt,
        timings={} if record.cache_n is None else {"cache_n": float(record.cache_n)},
        **shared,
    )


def _embed(trials: Mapping[str, Trial]) -> dict[str, TrialRecord]:
    return {k: embed_trial(trials[k]) for k in sorted(trials)}


def _unembed(records: Mapping[str, TrialRecord]) -> dict[str, Trial]:
    return {k: trial_from_record(k, v) for k, v in records.items()}


def _pass_evidence(passes: tuple[PassRecord, ...]) -> tuple[PassEvidence, ...]:
    return tuple(
        PassEvidence(
            index=p.index,
            server_busy_max=p.server_busy_max,
            busy_source=p.busy_source,
            order=tuple(p.order),
            trials=_embed(p.trials),
        )
        for p in sorted(passes, key=lambda q: q.index)
    )


def _pass_records(passes: tuple[PassEvidence, ...]) -> tuple[PassRecord, ...]:
    return tuple(
        PassRecord(
            index=p.index,
            trials=_unembed(p.trials),
            server_busy_max=p.server_busy_max,
            busy_source=p.busy_source,
            order=p.order,
        )
        for p in passes
    )


def _evidence_record(evidence: CellEvidence, policy: GatePolicy) -> EvidenceRecord:
    cache = evidence.cache_passes
    return EvidenceRecord(
        items=tuple(sorted(evidence.items, key=lambda m: m.test_id)),
        a=_embed(evidence.a),
        a_repeat=None if evidence.a_repeat is None else _embed(evidence.a_repeat),
        b=_embed(evidence.b),
        c_passes=_pass_evidence(evidence.c_passes),
        policy=policy,
        b_ids=None if evidence.b_ids is None else tuple(sorted(evidence.b_ids)),
        cache_passes=None if cache is None else _pass_evidence(cache),
        slot_ctx=evidence.slot_ctx,
    )


def evidence_from_cert(cert: Cert) -> CellEvidence:
    """The :class:`CellEvidence` embedded in a cert."""
    e = cert.evidence
    return CellEvidence(
        items=e.items,
        a=_unembed(e.a),
        a_repeat=None if e.a_repeat is None else _unembed(e.a_repeat),
        b=_unembed(e.b),
        c_passes=_pass_records(e.c_passes),
        b_ids=e.b_ids,
        cache_passes=None if e.cache_passes is None else _pass_records(e.cache_passes),
        slot_ctx=e.slot_ctx,
    )


def spec_from_cert(cert: Cert) -> CellSpec:
    """The :class:`CellSpec` the cert speaks for."""
    return CellSpec(
        model=cert.model,
        ctx=cert.ctx,
        dispatch_n=cert.dispatch_n,
        kv_label=cert.kv_label,
        reps=cert.reps,
        gate=cert.gate,
        is_moe=cert.promotion_scope.is_moe,
    )


class CertInputs(NamedTuple):
    """Everything a cert is built from (see :func:`build_cert`)."""

    evidence: CellEvidence
    verdict: Verdict
    spec: CellSpec
    policy: GatePolicy
    provenance: Provenance | Mapping[str, Any]
    source: Source
    ts_utc: str
    with_throughput: bool = True
    #: The header: this tool's for a new cert, the stored one when a cert is rebuilt.
    tool_version: str = __version__
    rules_version: int | None = RULES_VERSION


def draft_cert(inputs: CertInputs) -> Cert:
    """:func:`build_cert` before the JSON edge: the values as the core gave them, the
    ``digest`` empty."""
    evidence, verdict, spec, policy, provenance, source, ts_utc, with_throughput = inputs[:8]
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    r = verdict.reports
    g = verdict.gates
    recorded = (
        provenance if isinstance(provenance, Provenance) else Provenance.from_record(provenance)
    )
    return Cert(
        cert_version=CERT_VERSION,
        tool_version=inputs.tool_version,
        model=spec.model,
        ctx=spec.ctx,
        dispatch_n=spec.dispatch_n,
        status=verdict.status,
        verdict=display_verdict(verdict.status),
        source=source,
        gate=spec.gate,
        overlap_ok=g.overlap.ok,
        overlap=g.overlap,
        kv_label=spec.kv_label,
        reps=spec.reps,
        n_passes=len(evidence.c_passes),
        invariant_fields=INVARIANT_FIELDS,
        ts_utc=ts_utc,
        mismatch=not r.ac.clean,
        divergence_class=verdict.divergence_class,
        anomaly=verdict.anomaly,
        token_divergence_ids=r.ac.token_divergence_ids,
        arm_b=ArmB(ab_passed=r.ab.clean, bc_passed=r.bc.clean),
        per_pass_ac_divergent=tuple(p.n_divergent for p in r.ac.per_pass),
        per_pass_ac_token_only=tuple(p.n_token_only for p in r.ac.per_pass),
        decision_reasons=verdict.decision_reasons,
        divergence_report=r,
        completion_floor=g.floor,
        cobatch_coverage=g.coverage,
        transport=g.transport,
        serial_repeat=g.serial_repeat,
        gates=gates_block(verdict, spec, source, policy),
        sensitivity=verdict.sensitivity,
        numerics=verdict.numerics,
        promotion_scope=promotion_scope(spec, verdict),
        provenance=recorded,
        evidence=_evidence_record(evidence, policy),
        digest="",
        throughput=throughput_of_arms(recorded.arms) if with_throughput else None,
        prompt_cache=verdict.prompt_cache,
        sequence_scope=verdict.scope,
        rules_version=inputs.rules_version,
    )


def _sealed(draft: Cert) -> Cert:
    # Through the JSON edge once: types checked, keys closed, numbers in their JSON form
    # (an int score becomes 1.0), so the digest is over exactly what a reader gets back.
    cert = cert_from_json(canonical_json(cert_to_json(draft)))
    return replace(cert, digest=compute_digest(cert_to_json(cert)))


def build_cert(
    evidence: CellEvidence,
    verdict: Verdict,
    spec: CellSpec,
    policy: GatePolicy,
    provenance: Provenance | Mapping[str, Any],
    source: Source,
    ts_utc: str,
    *,
    with_throughput: bool = True,
) -> Cert:
    """The cert for one cell. ``verdict`` must be ``decide(evidence, policy, advice)``, with
    the words of the engine ``provenance`` names (:func:`~batch_invariance.cert.advice.
    engine_advice`); ``source`` is what the caller really ran against (``run-mock`` always
    passes ``"mock"``). The ``throughput`` block is computed from ``provenance.arms``
    (``with_throughput=False`` leaves it out, as certs written before it existed have it)."""
    inputs = CertInputs(
        evidence, verdict, spec, policy, provenance, source, ts_utc, with_throughput
    )  # fmt: skip
    return _sealed(draft_cert(inputs))


#: The words of the engine a cert names, for its verdict's reasons (the verification passes
#: :func:`batch_invariance.cert.advice.engine_advice`; the core names no engine).
AdviceReader = Callable[[str], EngineAdvice]


def _inputs_of(cert: Cert, advice: AdviceReader) -> CertInputs:
    """A cert's own evidence, policy, spec, provenance and timestamp, with the verdict the
    same pure :func:`~batch_invariance.core.verdict.decide` gives on that evidence, in the
    words ``advice`` gives for the engine it names."""
    evidence = evidence_from_cert(cert)
    policy = cert.evidence.policy
    return CertInputs(
        evidence,
        decide(evidence, policy, advice(cert.provenance.engine_name)),
        spec_from_cert(cert),
        policy,
        cert.provenance,
        cert.source,
        cert.ts_utc,
        with_throughput=cert.throughput is not None,
        tool_version=cert.tool_version,  # who may re-derive it: cert/parse.py decides
        rules_version=cert.rules_version,
    )


def rederive(cert: Cert, advice: AdviceReader) -> Cert:
    """Rebuild the whole cert from its own evidence, policy, spec, provenance and timestamp
    with the same pure :func:`~batch_invariance.core.verdict.decide`."""
    return _sealed(draft_cert(_inputs_of(cert, advice)))


def rederive_draft(cert: Cert, advice: AdviceReader) -> Cert:
    """:func:`rederive` before the JSON edge (:func:`draft_cert`): the same values, not yet
    serialised, validated and digested. When it is type-strictly identical to a cert that
    came through the JSON edge (:mod:`~batch_invariance.cert.identical`), the full
    :func:`rederive` would give the same JSON in every field."""
    return draft_cert(_inputs_of(cert, advice))


def differing_fields(stored: Cert, rebuilt: Cert) -> list[str]:
    """Top-level fields (``status`` first when it differs) where two certs disagree, the
    digest aside. Empty means consistent."""
    a = cert_to_json(stored)
    b = cert_to_json(rebuilt)
    keys = sorted((set(a) | set(b)) - {"digest"}, key=lambda k: (k != "status", k))
    return [k for k in keys if canonical_json(a.get(k)) != canonical_json(b.get(k))]
