"""The cert contract: fields, digest, round trip through evidence, predicates."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any

import pytest

from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import (
    build_cert,
    differing_fields,
    embed_trial,
    evidence_from_cert,
    rederive,
)
from batch_invariance.cert.parse import parse_cert
from batch_invariance.cert.schema import (
    CERT_VERSION,
    JSON_RENAMES,
    TrialRecord,
    canonical_json,
    cert_from_json,
    cert_to_json,
    compute_digest,
    display_verdict,
    schema_text,
)
from batch_invariance.cert.verify import cert_is_green, is_promotable
from batch_invariance.core.evidence import INVARIANT_FIELDS, GatePolicy, Trial
from batch_invariance.core.verdict import decide
from tests.support.factories import (
    PROVENANCE,
    TS,
    cert_for,
    changed,
    green_evidence,
    make_trial,
    replace_trial,
    spec,
)

CONTRACT_FIELDS = [
    "model",
    "ctx",
    "dispatch_n",
    "status",
    "source",
    "gate",
    "overlap_ok",
    "overlap",
    "kv_label",
    "reps",
    "n_passes",
    "invariant_fields",
    "ts_utc",
    "mismatch",
    "divergence_class",
    "anomaly",
    "token_divergence_ids",
    "arm_b",
    "per_pass_ac_divergent",
    "per_pass_ac_token_only",
    "decision_reasons",
    "divergence_report",
    "completion_floor",
    "cobatch_coverage",
    "sensitivity",
    "promotion_scope",
    "provenance",
    "evidence",
    "digest",
]


def _redigest(d: dict[str, Any]) -> dict[str, Any]:
    d = dict(d)
    d["digest"] = compute_digest(d)
    return d


def test_every_contract_field_is_present() -> None:
    cert, _ = cert_for()
    d = cert_to_json(cert)
    for name in CONTRACT_FIELDS:
        assert name in d, name
    assert set(d["arm_b"]) == {"ab_passed", "bc_passed"}
    assert set(d["divergence_report"]) >= {"AC", "AB", "BC"}
    report = d["divergence_report"]["AC"]
    for name in [
        "pair",
        "n_compared",
        "n_divergent",
        "divergence_rate",
        "divergent_ids",
        "only_x",
        "only_y",
        "n_token_only",
        "token_divergence_ids",
        "per_id",
        "by_family",
        "by_fill",
    ]:
        assert name in report, name
    numerics = d["numerics"]
    assert set(numerics) == {"eps", "AC", "AB", "BC", "AA", "evidence", "risk", "statement"}
    assert numerics["eps"] == 0.0 and numerics["evidence"]["ok"] is True
    assert set(numerics["AC"]) >= {"per_pass", "rows", "drift_ids", "positions", "max_abs_delta"}
    assert numerics["statement"].startswith("tokens and logprobs bitwise equal at ")
    assert d["invariant_fields"] == list(INVARIANT_FIELDS)
    assert d["sensitivity"]["n_hot_trials"] == 64
    assert d["sensitivity"]["n_distinct_prompts"] == 32
    assert d["sensitivity"]["per_comparison_rate_upper_bound_95"] == 3 / 64
    assert d["evidence"]["policy"]["min_answer_tokens"] == 64
    assert d["evidence"]["policy"]["max_bound"] == 0.1
    assert set(d["gates"]) == {
        "F0",
        "F1",
        "F2",
        "F3",
        "F4",
        "F5",
        "transport",
        "min_hot_trials",
        "per_prompt_bound",
        "answer_length",
        "serial_repeat",
        "prompt_cache",
        "numeric_evidence",
    }


def test_promotion_scope_is_cell_only_with_moe_warning_and_rule_of_three() -> None:
    cert, _ = cert_for(cell=spec(is_moe=True))
    scope = cert.promotion_scope
    assert scope.generalizes is False and scope.model == "tiny-model" and scope.ctx == 2048
    assert scope.dispatch_n == 4 and "mixture-of-experts" in scope.moe_warning
    assert "rule of three" in scope.rule_of_three and "0.09375" in scope.rule_of_three
    assert "holds for answers up to 80 tokens" in scope.valid_for
    assert (scope.answer_tokens_min, scope.answer_tokens_median) == (80, 80)
    assert scope.answer_tokens_max == 80 and scope.share_cut_by_budget == 0.0


def test_per_id_rows_carry_excerpts_and_shas() -> None:
    ev = green_evidence()
    ev = replace_trial(
        ev,
        "C",
        "t001",
        changed(ev.c_passes[0].trials["t001"], score=0.0, completion="something else"),
    )
    cert, _ = cert_for(ev)
    (row,) = cert.divergence_report.ac.per_id
    assert row.test_id == "t001" and row.field == "score" and row.pass_index == 0
    assert row.x_excerpt == "answer-t001" and row.y_excerpt == "something else"
    assert row.x_content_sha and row.y_content_sha and row.x_content_sha != row.y_content_sha
    assert cert.mismatch and cert.status == "failed" and cert.per_pass_ac_divergent == (1, 0)


def test_digest_covers_everything_but_itself() -> None:
    cert, _ = cert_for()
    d = cert_to_json(cert)
    assert d["digest"] == compute_digest(d)
    d["ts_utc"] = "2030-01-01T00:00:00Z"
    assert compute_digest(d) != cert.digest


def test_canonical_json_is_sorted_and_refuses_nan() -> None:
    assert canonical_json({"b": 1, "a": [1.5, None]}) == '{"a":[1.5,null],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


@pytest.mark.parametrize("mutate", ["token", "red", "unverified", "plain"])
def test_evidence_round_trip_rederives_the_same_cert(mutate: str) -> None:
    ev = green_evidence()
    t = ev.c_passes[1].trials["t003"]
    if mutate == "token":
        ev = replace_trial(ev, "C", "t003", changed(t, completion="x" * 200), 1)
    elif mutate == "red":
        ev = replace_trial(
            ev, "C", "t003", changed(t, passed=False, tokens=("a", "b"), top_margins=(1.0, 0.5)), 1
        )
    elif mutate == "unverified":
        ev = green_evidence(n_ids=6)
    cert, verdict = cert_for(ev)
    back = evidence_from_cert(cert)
    assert decide(back, cert.evidence.policy).status == verdict.status
    assert rederive(cert, engine_advice) == cert
    assert differing_fields(cert, rederive(cert, engine_advice)) == []


def test_source_must_be_live_or_mock() -> None:
    ev = green_evidence()
    with pytest.raises(ValueError):
        build_cert(ev, decide(ev, GatePolicy()), spec(), GatePolicy(), PROVENANCE, "staging", TS)  # type: ignore[arg-type]


def test_provenance_becomes_plain_json() -> None:
    from pathlib import Path

    ev = green_evidence()
    cert = build_cert(
        ev,
        decide(ev, GatePolicy()),
        spec(),
        GatePolicy(),
        {"server_bin": Path("/x/llama-server"), "argv": ("a", "b")},
        "live",
        TS,
    )
    assert cert.provenance.record() == {"server_bin": "/x/llama-server", "argv": ["a", "b"]}


# ----------------------------------------------------------------- predicates


def test_green_live_cert_is_green_and_promotable_as_object_and_dict() -> None:
    cert, _ = cert_for()
    d = json.loads(json.dumps(cert_to_json(cert)))
    assert cert_is_green(cert) and is_promotable(cert)
    assert cert_is_green(d) and is_promotable(d)


def test_mock_cert_is_never_promotable() -> None:
    cert, _ = cert_for(source="mock")
    assert cert.status == "green" and not is_promotable(cert) and not cert_is_green(cert)
    assert cert_is_green(cert, require_source="mock")


def test_not_green_statuses_are_not_promotable() -> None:
    for ev in (
        green_evidence(n_ids=6),
        replace_trial(
            green_evidence(), "B", "t001", changed(green_evidence().b["t001"], score=0.0)
        ),
    ):
        cert, _ = cert_for(ev)
        assert cert.status != "green" and not is_promotable(cert) and not cert_is_green(cert)


def test_wrong_gate_is_not_promotable() -> None:
    cert, _ = cert_for()
    assert not is_promotable(cert, require_gate="something_else")


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.pop("status"),
        lambda d: d.update(status="GREEN"),
        lambda d: d.update(status=True),
        lambda d: d.update(source="Live"),
        lambda d: d.update(gate=None),
        lambda d: d.update(ctx="2048"),
        lambda d: d.update(overlap_ok="yes"),
        lambda d: d.update(extra_field=1),
        lambda d: d.pop("evidence"),
        lambda d: d.update(digest="sha256:" + "0" * 64),
    ],
)
def test_predicates_fail_closed_on_malformed_certs(edit: Any) -> None:
    cert, _ = cert_for()
    d = cert_to_json(cert)
    edit(d)
    assert not is_promotable(d) and not cert_is_green(d)
    if d.get("digest") == cert.digest:
        # Re-sealing the edited content with a fresh digest must not help either.
        assert not is_promotable(_redigest(d)) and not cert_is_green(_redigest(d))


@pytest.mark.parametrize("value", [None, 1, "green", [], {}, {"status": "green"}, object()])
def test_predicates_fail_closed_on_non_certs(value: Any) -> None:
    assert not is_promotable(value) and not cert_is_green(value)


def test_values_smuggled_into_a_cert_object_are_caught() -> None:
    cert, _ = cert_for(green_evidence(n_ids=6))  # unverified
    # A dataclass does not validate on construction: the predicates go through the JSON edge.
    assert not is_promotable(replace(cert, status="green", verdict="GREEN"))
    assert not is_promotable(replace(cert, ctx="2048"))  # type: ignore[arg-type]


def test_redigested_status_edit_is_not_promotable() -> None:
    cert, _ = cert_for(green_evidence(n_ids=6))
    d = cert_to_json(cert)
    d.update(status="green", verdict="GREEN")
    d = _redigest(d)
    parsed = parse_cert(canonical_json(d))  # the digest is fine: it is recomputable
    assert not is_promotable(d)
    assert differing_fields(parsed, rederive(parsed, engine_advice))[0] == "status"


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        ("failed", "RED"),
        ("green", "GREEN"),
        ("green_with_caveat", "AMBER"),
        ("green_unverified", "UNVERIFIED"),
        ("weird", "UNVERIFIED"),
    ],
)
def test_display_verdict(status: str, shown: str) -> None:
    assert display_verdict(status) == shown


# ----------------------------------------------------------------- one model, one edge


def test_the_json_edge_round_trips_a_cert_exactly() -> None:
    cert, _ = cert_for()
    assert cert_from_json(canonical_json(cert_to_json(cert))) == cert


def test_every_rename_names_a_real_attribute_and_a_real_json_key() -> None:
    d = cert_to_json(cert_for()[0])
    report = d["divergence_report"]
    for attr, key in JSON_RENAMES.items():
        assert key in report and attr not in report, (attr, key)


def test_the_embedded_trial_carries_every_trial_field_but_the_text_and_timings() -> None:
    # If Trial gains a field, the cert must carry it (or say here why not).
    carried = {f.name for f in fields(TrialRecord)}
    trial_fields = {f.name for f in fields(Trial)}
    assert trial_fields - carried == {"test_id", "completion", "timings"}
    assert carried - trial_fields == {"completion_excerpt", "cache_n"}
    record = embed_trial(replace(make_trial("x", completion="y" * 100), timings={"cache_n": 3.0}))
    assert record.completion_excerpt == "y" * 80 and record.cache_n == 3


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["evidence"]["a"]["t000"].update(extra=1),
        lambda d: d["evidence"]["policy"].update(min_hot_trials="30"),
        lambda d: d["divergence_report"]["AC"].update(n_compared=1.5),
        lambda d: d["overlap"]["per_pass"][0].update(ok=1),
        lambda d: d["sensitivity"].update(unknown=None),
        lambda d: d["divergence_report"].update(ac=d["divergence_report"]["AC"]),
        # pydantic matches int and bool Literals by equality: the JSON type must match too
        lambda d: d.update(cert_version=True),
        lambda d: d.update(cert_version=1.0),
        lambda d: d["promotion_scope"].update(generalizes=0),
    ],
)
def test_nested_blocks_are_strict_and_closed(edit: Any) -> None:
    d = cert_to_json(cert_for()[0])
    edit(d)
    with pytest.raises(ValueError):
        cert_from_json(json.dumps(d))


def test_the_schema_pins_the_current_cert_version() -> None:
    # Bumping CERT_VERSION means bumping the Literal on Cert.cert_version with it.
    schema = json.loads(schema_text())
    assert schema["properties"]["cert_version"]["const"] == CERT_VERSION
    assert cert_to_json(cert_for()[0])["cert_version"] == CERT_VERSION
