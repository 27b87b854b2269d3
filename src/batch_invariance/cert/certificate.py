"""The cert: a pydantic model of the output contract, built and checked by pure functions.

* :func:`build_cert` turns evidence + verdict + spec + provenance into a :class:`Cert` whose
  ``digest`` is the sha256 of the canonical JSON of everything else.
* :func:`evidence_from_cert` rebuilds the :class:`~batch_invariance.core.evidence.CellEvidence`
  embedded in a cert, so :func:`rederive` can run the same :func:`~batch_invariance.core.verdict.
  decide` again and rebuild the whole cert; :func:`consistency_errors` names every top-level
  field where the stored cert and the rebuilt one differ.
* :func:`cert_is_green` and :func:`is_promotable` accept a :class:`Cert` or a plain ``dict``
  and fail closed: anything absent, malformed, wrongly typed, re-digested after an edit or
  inconsistent with its own evidence is ``False``, never an exception.

Nothing here reads files or clocks: the timestamp comes from the caller.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from batch_invariance import __version__
from batch_invariance.core.diff import (
    DivergenceRow,
    GroupCount,
    PairReport,
    content_key,
    excerpt,
)
from batch_invariance.core.evidence import (
    INVARIANT_FIELDS,
    CellEvidence,
    CellSpec,
    GatePolicy,
    ItemMeta,
    PassRecord,
    Trial,
    policy_problems,
)
from batch_invariance.core.verdict import Verdict, decide

CERT_VERSION = 2
GATE_ABC_UNION = "abc_union"
SOURCES: tuple[str, ...] = ("live", "mock")

_DISPLAY: Mapping[str, str] = {
    "failed": "RED",
    "green_unverified": "UNVERIFIED",
    "green_with_caveat": "AMBER",
    "green": "GREEN",
}

Scalar = str | bool | int | float | None
StatusLiteral = Literal["failed", "green_unverified", "green_with_caveat", "green"]


class _Model(BaseModel):
    """Strict and closed: unknown keys and wrongly typed values are schema errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- evidence block


class TrialRecord(_Model):
    """One trial as embedded in the cert: its invariant record plus the diagnostics the
    verdict and the report are derived from (content sha, tokens, interval, ...)."""

    score: float | None
    passed: bool | None
    extracted_answer: str | None
    expected_answer: str | None
    prompt_tokens_measured: int | None
    failure_mode: str
    content_sha256: str | None = None
    completion_excerpt: str | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tokens: list[str] | None = None
    token_logprobs: list[float] | None = None
    top_margins: list[float | None] | None = None
    dispatch_ts: float | None = None
    complete_ts: float | None = None
    slot_id: int | None = None
    transport_error: str | None = None
    #: The server's ``timings.cache_n`` (prompt tokens reused from cache) when it reported it.
    cache_n: int | None = None


class PassEvidence(_Model):
    index: int
    server_busy_max: int | None
    busy_source: str
    order: list[str]
    trials: dict[str, TrialRecord]


class ItemRecord(_Model):
    test_id: str
    family: str | None = None
    fill: float | None = None


class PolicyRecord(_Model):
    min_hot_trials: int
    completion_floor: float
    coverage_fraction: float
    overlap_margin_s: float
    logit_eps: float | None
    min_answer_tokens: int
    max_bound: float


class EvidenceBlock(_Model):
    items: list[ItemRecord]
    a: dict[str, TrialRecord]
    a_repeat: dict[str, TrialRecord] | None
    b: dict[str, TrialRecord]
    c_passes: list[PassEvidence]
    policy: PolicyRecord


# --------------------------------------------------------------------------- report blocks


class DivergenceRowModel(_Model):
    test_id: str
    pass_index: int | None
    kind: Literal["invariant", "missing", "token_only"]
    field: str
    fields: list[str]
    x: Scalar
    y: Scalar
    x_content_sha: str | None
    y_content_sha: str | None
    token_identical: bool | None
    first_divergent_token: int | None
    x_top_margin: float | None
    y_top_margin: float | None
    x_excerpt: str | None
    y_excerpt: str | None


class GroupCountModel(_Model):
    n_compared: int
    n_divergent: int
    n_token_only: int


class PassCountModel(_Model):
    index: int
    n_compared: int
    n_divergent: int
    n_token_only: int
    n_skipped: int


class LogitDriftModel(_Model):
    armed: bool
    eps: float | None
    max_logit_delta: float | None
    logit_drift_ids: list[str]
    per_id_delta: dict[str, float]


class PairReportModel(_Model):
    pair: str
    n_compared: int
    n_divergent: int
    divergence_rate: float
    divergent_ids: list[str]
    only_x: list[str]
    only_y: list[str]
    n_token_only: int
    token_divergence_ids: list[str]
    transport_skipped_ids: list[str]
    per_id: list[DivergenceRowModel]
    by_family: dict[str, GroupCountModel]
    by_fill: dict[str, GroupCountModel]
    logit_drift: LogitDriftModel
    per_pass: list[PassCountModel]


class DivergenceReport(_Model):
    AC: PairReportModel
    AB: PairReportModel
    BC: PairReportModel
    #: A against its serial repeat A'; ``None`` when A' was not run.
    AA: PairReportModel | None


# --------------------------------------------------------------------------- gate blocks


class OverlapPass(_Model):
    index: int
    client_max_depth: int
    server_busy_max: int | None
    busy_source: str
    ok: bool


class OverlapBlock(_Model):
    ok: bool
    required_depth: int
    per_pass: list[OverlapPass]
    reason: str


class CompletionFloorBlock(_Model):
    ok: bool
    required: float
    observed: float | None
    n_scored: int
    n_total: int
    reason: str


class CoveragePass(_Model):
    index: int
    n_ids: int
    n_cobatched: int
    required: int
    missing_intervals: int
    ok: bool


class CoverageBlock(_Model):
    ok: bool
    margin_s: float
    fraction: float
    per_pass: list[CoveragePass]
    reason: str


class TransportBlock(_Model):
    ok: bool
    counts: dict[str, int]
    ids: list[str]
    reason: str


class SerialRepeatBlock(_Model):
    ran: bool
    ok: bool
    n_divergent: int
    n_token_only: int
    ids: list[str]
    reason: str


class GateOutcome(_Model):
    ok: bool
    reason: str


class ArmB(_Model):
    ab_passed: bool
    bc_passed: bool


class SensitivityBlock(_Model):
    n_hot_trials: int
    n_scored_comparisons: int
    n_ac_divergent: int
    n_ac_divergent_ids: int
    n_distinct_prompts: int
    rate_upper_bound_95: float | None
    per_comparison_rate_upper_bound_95: float | None
    observed_rate: float | None
    ci95_low: float | None
    ci95_high: float | None


class PromotionScope(_Model):
    model: str
    ctx: int
    dispatch_n: int
    kv_label: str
    valid_for: str
    generalizes: Literal[False]
    is_moe: bool | None
    moe_warning: str
    rule_of_three: str
    answer_tokens_min: int | None
    answer_tokens_median: int | None
    answer_tokens_max: int | None
    share_cut_by_budget: float | None


# --------------------------------------------------------------------------- the cert


class Cert(_Model):
    """One cell's cert. See ``docs/output-contract.md`` for every field."""

    cert_version: Literal[2]
    tool_version: str
    model: str
    ctx: int
    dispatch_n: int
    status: StatusLiteral
    verdict: Literal["GREEN", "RED", "AMBER", "UNVERIFIED"]
    source: Literal["live", "mock"]
    gate: str
    overlap_ok: bool
    overlap: OverlapBlock
    kv_label: str
    reps: int
    n_passes: int
    invariant_fields: list[str]
    ts_utc: str
    mismatch: bool
    divergence_class: str | None
    anomaly: str | None
    token_divergence_ids: list[str]
    arm_b: ArmB
    per_pass_ac_divergent: list[int]
    per_pass_ac_token_only: list[int]
    decision_reasons: list[str]
    divergence_report: DivergenceReport
    completion_floor: CompletionFloorBlock
    cobatch_coverage: CoverageBlock
    transport: TransportBlock
    serial_repeat: SerialRepeatBlock
    gates: dict[str, GateOutcome]
    sensitivity: SensitivityBlock
    promotion_scope: PromotionScope
    provenance: dict[str, Any]
    evidence: EvidenceBlock
    digest: str


# --------------------------------------------------------------------------- helpers


def canonical_json(data: Any) -> str:
    """Sorted keys, no insignificant whitespace, no NaN: the form the digest is taken over."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def compute_digest(data: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``data`` without its ``digest`` key."""
    body = {k: v for k, v in data.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def display_verdict(status: str) -> str:
    """GREEN / RED / AMBER / UNVERIFIED; anything unknown shows as UNVERIFIED."""
    return _DISPLAY.get(status, "UNVERIFIED") if isinstance(status, str) else "UNVERIFIED"


def schema_text() -> str:
    """The JSON schema of :class:`Cert`, as written to ``docs/cert.schema.json``."""
    schema = Cert.model_json_schema()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def _trial_record(t: Trial) -> dict[str, Any]:
    return {
        "score": None if t.score is None else float(t.score),
        "passed": t.passed,
        "extracted_answer": t.extracted_answer,
        "expected_answer": t.expected_answer,
        "prompt_tokens_measured": t.prompt_tokens_measured,
        "failure_mode": t.failure_mode,
        "content_sha256": content_key(t),
        "completion_excerpt": excerpt(t),
        "completion_tokens": t.completion_tokens,
        "finish_reason": t.finish_reason,
        "tokens": None if t.tokens is None else [str(x) for x in t.tokens],
        "token_logprobs": None
        if t.token_logprobs is None
        else [float(x) for x in t.token_logprobs],
        "top_margins": None
        if t.top_margins is None
        else [None if x is None else float(x) for x in t.top_margins],
        "dispatch_ts": None if t.dispatch_ts is None else float(t.dispatch_ts),
        "complete_ts": None if t.complete_ts is None else float(t.complete_ts),
        "slot_id": t.slot_id,
        "transport_error": t.transport_error,
        "cache_n": None if t.timings.get("cache_n") is None else int(t.timings["cache_n"]),
    }


def _trials(trials: Mapping[str, Trial]) -> dict[str, Any]:
    return {k: _trial_record(trials[k]) for k in sorted(trials)}


def _policy_record(policy: GatePolicy) -> dict[str, Any]:
    return {
        "min_hot_trials": policy.min_hot_trials,
        "completion_floor": float(policy.completion_floor),
        "coverage_fraction": float(policy.coverage_fraction),
        "overlap_margin_s": float(policy.overlap_margin_s),
        "logit_eps": None if policy.logit_eps is None else float(policy.logit_eps),
        "min_answer_tokens": policy.min_answer_tokens,
        "max_bound": float(policy.max_bound),
    }


def _evidence_block(evidence: CellEvidence, policy: GatePolicy) -> dict[str, Any]:
    return {
        "items": [
            {
                "test_id": m.test_id,
                "family": m.family,
                "fill": None if m.fill is None else float(m.fill),
            }
            for m in sorted(evidence.items, key=lambda m: m.test_id)
        ],
        "a": _trials(evidence.a),
        "a_repeat": None if evidence.a_repeat is None else _trials(evidence.a_repeat),
        "b": _trials(evidence.b),
        "c_passes": [
            {
                "index": p.index,
                "server_busy_max": p.server_busy_max,
                "busy_source": p.busy_source,
                "order": list(p.order),
                "trials": _trials(p.trials),
            }
            for p in sorted(evidence.c_passes, key=lambda q: q.index)
        ],
        "policy": _policy_record(policy),
    }


def _scalar(v: Any) -> Any:
    return float(v) if isinstance(v, float) else v


def _row(r: DivergenceRow) -> dict[str, Any]:
    return {
        "test_id": r.test_id,
        "pass_index": r.pass_index,
        "kind": r.kind,
        "field": r.field,
        "fields": list(r.fields),
        "x": _scalar(r.x),
        "y": _scalar(r.y),
        "x_content_sha": r.x_content_sha,
        "y_content_sha": r.y_content_sha,
        "token_identical": r.token_identical,
        "first_divergent_token": r.first_divergent_token,
        "x_top_margin": r.x_top_margin,
        "y_top_margin": r.y_top_margin,
        "x_excerpt": r.x_excerpt,
        "y_excerpt": r.y_excerpt,
    }


def _group(c: GroupCount) -> dict[str, int]:
    return {
        "n_compared": c.n_compared,
        "n_divergent": c.n_divergent,
        "n_token_only": c.n_token_only,
    }


def _report(r: PairReport) -> dict[str, Any]:
    d = r.logit_drift
    return {
        "pair": r.pair,
        "n_compared": r.n_compared,
        "n_divergent": r.n_divergent,
        "divergence_rate": float(r.divergence_rate),
        "divergent_ids": list(r.divergent_ids),
        "only_x": list(r.only_x),
        "only_y": list(r.only_y),
        "n_token_only": r.n_token_only,
        "token_divergence_ids": list(r.token_divergence_ids),
        "transport_skipped_ids": list(r.transport_skipped_ids),
        "per_id": [_row(x) for x in r.per_id],
        "by_family": {k: _group(v) for k, v in r.by_family.items()},
        "by_fill": {k: _group(v) for k, v in r.by_fill.items()},
        "logit_drift": {
            "armed": d.armed,
            "eps": None if d.eps is None else float(d.eps),
            "max_logit_delta": d.max_logit_delta,
            "logit_drift_ids": list(d.logit_drift_ids),
            "per_id_delta": {k: float(v) for k, v in d.per_id_delta.items()},
        },
        "per_pass": [
            {
                "index": p.index,
                "n_compared": p.n_compared,
                "n_divergent": p.n_divergent,
                "n_token_only": p.n_token_only,
                "n_skipped": p.n_skipped,
            }
            for p in r.per_pass
        ],
    }


def _rule_of_three_text(verdict: Verdict) -> str:
    s = verdict.sensitivity
    if s.n_ac_divergent:
        assert s.observed_rate is not None and s.ci95_low is not None
        assert s.ci95_high is not None
        return (
            f"{s.n_ac_divergent} divergent comparison(s) in {s.n_scored_comparisons}: observed "
            f"rate {s.observed_rate:.4g}, exact 95% interval [{s.ci95_low:.4g}, "
            f"{s.ci95_high:.4g}]"
        )
    if s.rate_upper_bound_95 is None or s.per_comparison_rate_upper_bound_95 is None:
        return "no co-batched comparison was scored: no bound on the divergence rate"
    return (
        f"0 divergences over {s.n_distinct_prompts} distinct co-batched prompts: by the rule "
        f"of three the per-prompt divergence rate is below {s.rate_upper_bound_95:.4g} (about "
        f"95% confidence); per id x pass comparison ({s.n_hot_trials}, repetitions not "
        f"independent) below {s.per_comparison_rate_upper_bound_95:.4g}; rarer effects can "
        "still exist"
    )


def _valid_for(spec: CellSpec, verdict: Verdict) -> str:
    longest = verdict.gates.length.answer_tokens_max
    length = (
        f"; holds for answers up to {longest} tokens"
        if longest is not None
        else "; answer length unknown, so it holds for no answer length"
    )
    return (
        f"only model {spec.model} at ctx {spec.ctx} with --parallel {spec.dispatch_n} "
        f"(KV {spec.kv_label}) on this server build and host{length}"
    )


def _moe_warning(is_moe: bool | None) -> str:
    tail = (
        "expert routing can depend on what else shares the batch, so a result for one load, "
        "N or build does not carry over"
    )
    if is_moe is True:
        return f"mixture-of-experts model (from the GGUF header): {tail}"
    if is_moe is False:
        return f"dense model (from the GGUF header); for mixture-of-experts models {tail}"
    return f"expert count unknown; if this is a mixture-of-experts model, {tail}"


def _gates_block(
    verdict: Verdict, spec: CellSpec, source: str, ac: PairReport, policy: GatePolicy
) -> dict[str, dict[str, Any]]:
    g = verdict.gates
    drift = ac.logit_drift
    if not drift.armed:
        f4 = {"ok": True, "reason": "F4 logit drift disarmed (no eps set)"}
    elif drift.logit_drift_ids:
        f4 = {
            "ok": False,
            "reason": f"F4 logit drift on {len(drift.logit_drift_ids)} id(s) "
            f"beyond eps {drift.eps:g}",
        }
    else:
        f4 = {"ok": True, "reason": f"F4 armed (eps {drift.eps:g}): no drift beyond eps"}
    loose = policy_problems(policy)
    promotable = (
        verdict.status == "green" and source == "live" and spec.gate == GATE_ABC_UNION and not loose
    )
    f5_reason = (
        "F5 promotable: status green, source live, gate abc_union, default-or-stricter "
        "policy; valid for this cell only"
        if promotable
        else f"F5 not promotable: needs status green (is {verdict.status}), source live "
        f"(is {source}), gate {GATE_ABC_UNION} (is {spec.gate}) and a policy no looser "
        f"than the defaults ({'; '.join(loose) if loose else 'it is'})"
    )
    f0_reason = (
        f"F0 exact match: AC clean on {ac.n_compared} id(s) over every pass"
        if ac.clean
        else f"F0 exact match failed: {ac.n_divergent} id(s) diverged"
    )
    return {
        "F0": {"ok": ac.clean, "reason": f0_reason},
        "F1": {"ok": g.overlap.ok, "reason": g.overlap.reason},
        "F2": {"ok": g.floor.ok, "reason": g.floor.reason},
        "F3": {"ok": g.coverage.ok, "reason": g.coverage.reason},
        "F4": f4,
        "F5": {"ok": promotable, "reason": f5_reason},
        "transport": {"ok": g.transport.ok, "reason": g.transport.reason},
        "min_hot_trials": {"ok": g.sample.ok, "reason": g.sample.reason},
        "per_prompt_bound": {"ok": g.bound.ok, "reason": g.bound.reason},
        "answer_length": {"ok": g.length.ok, "reason": g.length.reason},
        "serial_repeat": {"ok": g.serial_repeat.ok, "reason": g.serial_repeat.reason},
        "prompt_cache": {"ok": g.prompt_cache.ok, "reason": g.prompt_cache.reason},
    }


def _json_safe(value: Mapping[str, Any]) -> dict[str, Any]:
    """Provenance as plain JSON (paths and other objects become strings)."""
    out: dict[str, Any] = json.loads(json.dumps(dict(value), sort_keys=True, default=str))
    return out


# --------------------------------------------------------------------------- build


def build_cert(
    evidence: CellEvidence,
    verdict: Verdict,
    spec: CellSpec,
    policy: GatePolicy,
    provenance: Mapping[str, Any],
    source: Literal["live", "mock"],
    ts_utc: str,
) -> Cert:
    """The cert for one cell. ``verdict`` must be ``decide(evidence, policy)``; ``source`` is
    what the caller really ran against (``run-mock`` always passes ``"mock"``)."""
    if source not in SOURCES:
        raise ValueError(f"source must be 'live' or 'mock', got {source!r}")
    r = verdict.reports
    g = verdict.gates
    s = verdict.sensitivity
    data: dict[str, Any] = {
        "cert_version": CERT_VERSION,
        "tool_version": __version__,
        "model": spec.model,
        "ctx": spec.ctx,
        "dispatch_n": spec.dispatch_n,
        "status": verdict.status,
        "verdict": display_verdict(verdict.status),
        "source": source,
        "gate": spec.gate,
        "overlap_ok": g.overlap.ok,
        "overlap": {
            "ok": g.overlap.ok,
            "required_depth": g.overlap.required_depth,
            "per_pass": [
                {
                    "index": p.index,
                    "client_max_depth": p.client_max_depth,
                    "server_busy_max": p.server_busy_max,
                    "busy_source": p.busy_source,
                    "ok": p.ok,
                }
                for p in g.overlap.per_pass
            ],
            "reason": g.overlap.reason,
        },
        "kv_label": spec.kv_label,
        "reps": spec.reps,
        "n_passes": len(evidence.c_passes),
        "invariant_fields": list(INVARIANT_FIELDS),
        "ts_utc": ts_utc,
        "mismatch": not r.ac.clean,
        "divergence_class": verdict.divergence_class,
        "anomaly": verdict.anomaly,
        "token_divergence_ids": list(r.ac.token_divergence_ids),
        "arm_b": {"ab_passed": r.ab.clean, "bc_passed": r.bc.clean},
        "per_pass_ac_divergent": [p.n_divergent for p in r.ac.per_pass],
        "per_pass_ac_token_only": [p.n_token_only for p in r.ac.per_pass],
        "decision_reasons": list(verdict.decision_reasons),
        "divergence_report": {
            "AC": _report(r.ac),
            "AB": _report(r.ab),
            "BC": _report(r.bc),
            "AA": None if r.aa is None else _report(r.aa),
        },
        "completion_floor": {
            "ok": g.floor.ok,
            "required": float(g.floor.required),
            "observed": g.floor.observed,
            "n_scored": g.floor.n_scored,
            "n_total": g.floor.n_total,
            "reason": g.floor.reason,
        },
        "cobatch_coverage": {
            "ok": g.coverage.ok,
            "margin_s": float(g.coverage.margin_s),
            "fraction": float(g.coverage.fraction),
            "per_pass": [
                {
                    "index": p.index,
                    "n_ids": p.n_ids,
                    "n_cobatched": p.n_cobatched,
                    "required": p.required,
                    "missing_intervals": p.missing_intervals,
                    "ok": p.ok,
                }
                for p in g.coverage.per_pass
            ],
            "reason": g.coverage.reason,
        },
        "transport": {
            "ok": g.transport.ok,
            "counts": dict(g.transport.counts),
            "ids": list(g.transport.ids),
            "reason": g.transport.reason,
        },
        "serial_repeat": {
            "ran": g.serial_repeat.ran,
            "ok": g.serial_repeat.ok,
            "n_divergent": g.serial_repeat.n_divergent,
            "n_token_only": g.serial_repeat.n_token_only,
            "ids": list(g.serial_repeat.ids),
            "reason": g.serial_repeat.reason,
        },
        "gates": _gates_block(verdict, spec, source, r.ac, policy),
        "sensitivity": {
            "n_hot_trials": s.n_hot_trials,
            "n_scored_comparisons": s.n_scored_comparisons,
            "n_ac_divergent": s.n_ac_divergent,
            "n_ac_divergent_ids": s.n_ac_divergent_ids,
            "n_distinct_prompts": s.n_distinct_prompts,
            "rate_upper_bound_95": s.rate_upper_bound_95,
            "per_comparison_rate_upper_bound_95": s.per_comparison_rate_upper_bound_95,
            "observed_rate": s.observed_rate,
            "ci95_low": s.ci95_low,
            "ci95_high": s.ci95_high,
        },
        "promotion_scope": {
            "model": spec.model,
            "ctx": spec.ctx,
            "dispatch_n": spec.dispatch_n,
            "kv_label": spec.kv_label,
            "valid_for": _valid_for(spec, verdict),
            "generalizes": False,
            "is_moe": spec.is_moe,
            "moe_warning": _moe_warning(spec.is_moe),
            "rule_of_three": _rule_of_three_text(verdict),
            "answer_tokens_min": g.length.answer_tokens_min,
            "answer_tokens_median": g.length.answer_tokens_median,
            "answer_tokens_max": g.length.answer_tokens_max,
            "share_cut_by_budget": g.length.share_cut_by_budget,
        },
        "provenance": _json_safe(provenance),
        "evidence": _evidence_block(evidence, policy),
        "digest": "",
    }
    # Validate first (types, closed keys), then digest the JSON form that will be written.
    cert = Cert.model_validate(data)
    dumped = cert.model_dump(mode="json")
    return cert.model_copy(update={"digest": compute_digest(dumped)})


# --------------------------------------------------------------------------- read back


def _trial_from(test_id: str, r: TrialRecord) -> Trial:
    return Trial(
        test_id=test_id,
        score=r.score,
        passed=r.passed,
        extracted_answer=r.extracted_answer,
        expected_answer=r.expected_answer,
        prompt_tokens_measured=r.prompt_tokens_measured,
        failure_mode=r.failure_mode,
        # The excerpt stands in for the text: the content sha is what gets compared.
        completion=r.completion_excerpt,
        content_sha256=r.content_sha256,
        completion_tokens=r.completion_tokens,
        finish_reason=r.finish_reason,
        tokens=None if r.tokens is None else tuple(r.tokens),
        token_logprobs=None if r.token_logprobs is None else tuple(r.token_logprobs),
        top_margins=None if r.top_margins is None else tuple(r.top_margins),
        dispatch_ts=r.dispatch_ts,
        complete_ts=r.complete_ts,
        slot_id=r.slot_id,
        transport_error=r.transport_error,
        timings={} if r.cache_n is None else {"cache_n": float(r.cache_n)},
    )


def _trials_from(block: Mapping[str, TrialRecord]) -> dict[str, Trial]:
    return {k: _trial_from(k, v) for k, v in block.items()}


def coerce_cert(cert: object) -> Cert:
    """A validated :class:`Cert` from a ``Cert`` or a JSON-like ``dict``.

    A ``Cert`` instance is re-validated from its JSON form, so values smuggled past
    validation (``model_construct``) are caught. Raises on anything invalid.
    """
    if isinstance(cert, Cert):
        return Cert.model_validate(cert.model_dump(mode="json"))
    if isinstance(cert, dict):
        return Cert.model_validate(cert)
    raise TypeError(f"expected a Cert or a dict, got {type(cert).__name__}")


def evidence_from_cert(cert: object) -> CellEvidence:
    """The :class:`CellEvidence` embedded in a cert (a ``Cert`` or a dict)."""
    c = coerce_cert(cert)
    e = c.evidence
    return CellEvidence(
        items=tuple(ItemMeta(i.test_id, i.family, i.fill) for i in e.items),
        a=_trials_from(e.a),
        a_repeat=None if e.a_repeat is None else _trials_from(e.a_repeat),
        b=_trials_from(e.b),
        c_passes=tuple(
            PassRecord(
                index=p.index,
                trials=_trials_from(p.trials),
                server_busy_max=p.server_busy_max,
                busy_source=p.busy_source,
                order=tuple(p.order),
            )
            for p in e.c_passes
        ),
    )


def policy_from_cert(cert: object) -> GatePolicy:
    """The :class:`GatePolicy` the cert was judged under."""
    p = coerce_cert(cert).evidence.policy
    return GatePolicy(
        min_hot_trials=p.min_hot_trials,
        completion_floor=p.completion_floor,
        coverage_fraction=p.coverage_fraction,
        overlap_margin_s=p.overlap_margin_s,
        logit_eps=p.logit_eps,
        min_answer_tokens=p.min_answer_tokens,
        max_bound=p.max_bound,
    )


def spec_from_cert(cert: object) -> CellSpec:
    """The :class:`CellSpec` the cert speaks for."""
    c = coerce_cert(cert)
    return CellSpec(
        model=c.model,
        ctx=c.ctx,
        dispatch_n=c.dispatch_n,
        kv_label=c.kv_label,
        reps=c.reps,
        gate=c.gate,
        is_moe=c.promotion_scope.is_moe,
    )


def rederive(cert: object) -> Cert:
    """Rebuild the whole cert from its own evidence, policy, spec, provenance and timestamp
    with the same pure :func:`~batch_invariance.core.verdict.decide`."""
    c = coerce_cert(cert)
    evidence = evidence_from_cert(c)
    policy = policy_from_cert(c)
    return build_cert(
        evidence,
        decide(evidence, policy),
        spec_from_cert(c),
        policy,
        c.provenance,
        c.source,
        c.ts_utc,
    )


def digest_ok(cert: object) -> bool:
    """True when the stored digest matches the cert's content."""
    c = coerce_cert(cert)
    return c.digest == compute_digest(c.model_dump(mode="json"))


def consistency_errors(cert: object) -> list[str]:
    """Top-level fields (``status`` first when it differs) where the stored cert and the cert
    rebuilt from its own evidence disagree. Empty means consistent."""
    c = coerce_cert(cert)
    stored = c.model_dump(mode="json")
    rebuilt = rederive(c).model_dump(mode="json")
    keys = sorted(set(stored) | set(rebuilt) - {"digest"}, key=lambda k: (k != "status", k))
    return [
        k
        for k in keys
        if k != "digest" and canonical_json(stored.get(k)) != canonical_json(rebuilt.get(k))
    ]


def cert_is_green(cert: object, require_source: str = "live") -> bool:
    """True only for a valid, untampered, self-consistent cert whose status is literally
    ``"green"`` and whose source is ``require_source``. Never raises."""
    try:
        # Cheap, exact checks on a raw value before any validation.
        if isinstance(cert, dict) and (
            cert.get("status") != "green" or cert.get("source") != require_source
        ):
            return False
        c = coerce_cert(cert)
        if c.status != "green" or c.source != require_source:
            return False
        return digest_ok(c) and not consistency_errors(c)
    except Exception:
        return False


def is_promotable(cert: object, require_gate: str = GATE_ABC_UNION) -> bool:
    """:func:`cert_is_green` with source ``live`` and the gate ``require_gate``. Never
    raises; a mock cert is never promotable."""
    try:
        c = coerce_cert(cert)
        return (
            c.gate == require_gate
            and not policy_problems(policy_from_cert(c))
            and cert_is_green(c, require_source="live")
        )
    except Exception:
        return False
