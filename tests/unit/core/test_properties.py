"""Hypothesis properties of the pure core and the cert predicates."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_invariance.cert.build import build_cert
from batch_invariance.cert.schema import cert_to_json, compute_digest
from batch_invariance.cert.verify import is_promotable
from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import (
    INVARIANT_FIELDS,
    TRANSPORT_MODES,
    CellEvidence,
    GatePolicy,
)
from batch_invariance.core.gates import cobatched_flags
from batch_invariance.core.verdict import decide
from tests.support.factories import cert_for, changed, green_evidence, make_trial, transport_failure

FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICY = GatePolicy()

texts = st.text(alphabet="abcxyz 01", max_size=12)
maybe_float = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32))


@st.composite
def trials(draw: st.DrawFn, test_id: str) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return transport_failure(test_id, draw(st.sampled_from(sorted(TRANSPORT_MODES))))
    s = draw(st.floats(0, 100, allow_nan=False))
    return make_trial(
        test_id,
        completion=draw(texts),
        score=draw(st.one_of(st.none(), st.floats(0, 1, allow_nan=False))),
        passed=draw(st.one_of(st.none(), st.booleans())),
        extracted_answer=draw(st.one_of(st.none(), texts)),
        expected_answer=draw(st.one_of(st.none(), texts)),
        prompt_tokens_measured=draw(st.one_of(st.none(), st.integers(0, 50))),
        failure_mode=draw(st.sampled_from(["ok", "ok", "empty", "scorer_error"])),
        tokens=draw(st.one_of(st.none(), st.lists(st.sampled_from("abc"), max_size=4).map(tuple))),
        interval=(s, s + draw(st.floats(0, 2, allow_nan=False))),
    )


@st.composite
def trial_maps(draw: st.DrawFn, max_ids: int = 8) -> dict[str, Any]:
    n = draw(st.integers(0, max_ids))
    return {f"i{k}": draw(trials(f"i{k}")) for k in range(n)}


@FAST
@given(trial_maps(), st.integers(1, 3))
def test_diff_of_a_map_with_itself_is_clean(x: dict[str, Any], passes: int) -> None:
    r = compare("AC", x, [(i, dict(x)) for i in range(passes)])
    assert r.clean and r.n_token_only == 0 and r.per_id == ()
    assert r.only_x == () and r.only_y == ()


def _shuffled(m: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    keys = list(m)
    rng.shuffle(keys)
    return {k: m[k] for k in keys}


@st.composite
def evidences(draw: st.DrawFn) -> CellEvidence:
    ev = green_evidence(n_ids=draw(st.integers(2, 12)), n_passes=draw(st.integers(1, 3)))
    ids = sorted(ev.a)
    for _ in range(draw(st.integers(0, 4))):
        test_id = draw(st.sampled_from(ids))
        arm = draw(st.sampled_from(["A", "B", "C"]))
        t = draw(trials(test_id))
        if arm == "A":
            ev = replace(ev, a={**ev.a, test_id: t})
        elif arm == "B":
            ev = replace(ev, b={**ev.b, test_id: t})
        else:
            k = draw(st.integers(0, len(ev.c_passes) - 1))
            passes = list(ev.c_passes)
            passes[k] = replace(passes[k], trials={**passes[k].trials, test_id: t})
            ev = replace(ev, c_passes=tuple(passes))
    return ev


@FAST
@given(evidences(), st.randoms(use_true_random=False))
def test_verdict_and_cert_independent_of_insertion_and_completion_order(
    ev: CellEvidence, rng: random.Random
) -> None:
    passes = [replace(p, trials=_shuffled(dict(p.trials), rng)) for p in ev.c_passes]
    rng.shuffle(passes)
    other = replace(
        ev,
        a=_shuffled(dict(ev.a), rng),
        b=_shuffled(dict(ev.b), rng),
        a_repeat=None if ev.a_repeat is None else _shuffled(dict(ev.a_repeat), rng),
        c_passes=tuple(passes),
        items=tuple(rng.sample(list(ev.items), len(ev.items))),
    )
    v1, v2 = decide(ev, POLICY), decide(other, POLICY)
    assert v1 == v2
    c1 = cert_to_json(cert_for(ev)[0])
    c2 = cert_to_json(cert_for(other)[0])
    assert c1 == c2


@FAST
@given(
    st.lists(st.tuples(st.floats(0, 5), st.floats(0, 1)), max_size=15),
    st.randoms(use_true_random=False),
)
def test_cobatch_flags_follow_their_intervals_under_permutation(
    raw: list[tuple[float, float]], rng: random.Random
) -> None:
    spans = [(s, s + d) for s, d in raw]
    perm = list(range(len(spans)))
    rng.shuffle(perm)
    flags = cobatched_flags(spans, 0.005)
    permuted = cobatched_flags([spans[i] for i in perm], 0.005)
    assert [flags[i] for i in perm] == permuted


_NEW_VALUES: dict[str, Any] = {
    "score": st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)),
    "passed": st.one_of(st.none(), st.booleans()),
    "extracted_answer": st.one_of(st.none(), texts),
    "expected_answer": st.one_of(st.none(), texts),
    "prompt_tokens_measured": st.one_of(st.none(), st.integers(0, 99)),
    "failure_mode": st.sampled_from(["ok", "empty", "scorer_error", "truncated"]),
}


@FAST
@given(st.data())
def test_any_change_of_one_invariant_field_of_one_id_is_red(data: st.DataObject) -> None:
    ev = green_evidence(n_ids=data.draw(st.integers(30, 34)), n_passes=data.draw(st.integers(2, 3)))
    assert decide(ev, POLICY).status == "green"
    field = data.draw(st.sampled_from(INVARIANT_FIELDS))
    k = data.draw(st.integers(0, len(ev.c_passes) - 1))
    test_id = data.draw(st.sampled_from(sorted(ev.a)))
    old = ev.c_passes[k].trials[test_id]
    value = data.draw(
        _NEW_VALUES[field].filter(
            lambda v: not (v == getattr(old, field) and type(v) is type(getattr(old, field)))
        )
    )
    passes = list(ev.c_passes)
    passes[k] = replace(
        passes[k], trials={**passes[k].trials, test_id: changed(old, **{field: value})}
    )
    v = decide(replace(ev, c_passes=tuple(passes)), POLICY)
    assert v.status == "failed" and test_id in v.reports.ac.divergent_ids


@FAST
@given(st.data())
def test_transport_failures_alone_never_give_red(data: st.DataObject) -> None:
    ev = green_evidence(n_ids=data.draw(st.integers(2, 12)), n_passes=data.draw(st.integers(1, 3)))
    ids = sorted(ev.a)
    n = data.draw(st.integers(1, 10))
    for _ in range(n):
        test_id = data.draw(st.sampled_from(ids))
        mode = data.draw(st.sampled_from(sorted(TRANSPORT_MODES)))
        arm = data.draw(st.sampled_from(["A", "A_repeat", "B", "C"]))
        t = transport_failure(
            test_id, mode, data.draw(st.one_of(st.none(), st.just((100.0, 100.5))))
        )
        if arm == "A":
            ev = replace(ev, a={**ev.a, test_id: t})
        elif arm == "A_repeat":
            assert ev.a_repeat is not None
            ev = replace(ev, a_repeat={**ev.a_repeat, test_id: t})
        elif arm == "B":
            ev = replace(ev, b={**ev.b, test_id: t})
        else:
            k = data.draw(st.integers(0, len(ev.c_passes) - 1))
            passes = list(ev.c_passes)
            passes[k] = replace(passes[k], trials={**passes[k].trials, test_id: t})
            ev = replace(ev, c_passes=tuple(passes))
    v = decide(ev, POLICY)
    assert v.status == "green_unverified"
    assert any("transport" in r for r in v.decision_reasons)


# ----------------------------------------------------------------- promotability

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**6), 10**6),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

_PROMOTABLE = cert_to_json(cert_for()[0])
assert is_promotable(_PROMOTABLE)

GATING_PATHS: tuple[tuple[str, ...], ...] = (
    ("status",),
    ("verdict",),
    ("source",),
    ("gate",),
    ("overlap_ok",),
    ("mismatch",),
    ("divergence_class",),
    ("anomaly",),
    ("token_divergence_ids",),
    ("n_passes",),
    ("arm_b", "ab_passed"),
    ("arm_b", "bc_passed"),
    ("per_pass_ac_divergent",),
    ("decision_reasons",),
    ("completion_floor", "ok"),
    ("completion_floor", "observed"),
    ("cobatch_coverage", "ok"),
    ("overlap", "ok"),
    ("transport", "ok"),
    ("serial_repeat", "ok"),
    ("sensitivity", "n_hot_trials"),
    ("sensitivity", "rate_upper_bound_95"),
    ("promotion_scope", "generalizes"),
    ("gates", "F1", "ok"),
    ("gates", "F5", "ok"),
    ("evidence", "policy", "min_hot_trials"),
    ("evidence", "policy", "completion_floor"),
    ("evidence", "policy", "overlap_margin_s"),
    ("divergence_report", "AC", "n_divergent"),
    ("invariant_fields",),
    # identity: the cell must be the one its own provenance ran, by the version that reads it
    ("ctx",),
    ("dispatch_n",),
    ("model",),
    ("kv_label",),
    # the rules it was judged under (any release with these rules re-derives it, so
    # ``tool_version`` alone gates nothing: tests/unit/cert/test_rules.py)
    ("rules_version",),
    ("cert_version",),
    ("provenance", "model_file", "sha256"),
    ("provenance", "servers"),
)


def _set_path(d: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(d))
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


def _get_path(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = d
    for key in path:
        cur = cur[key]
    return cur


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(GATING_PATHS), json_values, st.booleans())
def test_no_mutation_of_a_gating_field_is_promotable(
    path: tuple[str, ...], value: Any, redigest: bool
) -> None:
    old = _get_path(_PROMOTABLE, path)
    if json.dumps(value, sort_keys=True) == json.dumps(old, sort_keys=True):
        return
    mutated = _set_path(_PROMOTABLE, path, value)
    if redigest:
        mutated["digest"] = compute_digest(mutated)
    assert not is_promotable(mutated)


@settings(max_examples=80, deadline=None)
@given(json_values)
def test_no_random_json_is_promotable(value: Any) -> None:
    assert not is_promotable(value)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_no_random_object_with_green_live_keys_is_promotable(extra: dict[str, Any]) -> None:
    obj = {
        **extra,
        "status": "green",
        "source": "live",
        "gate": "abc_union",
        "digest": "sha256:" + "0" * 64,
    }
    obj["digest"] = compute_digest(obj)
    assert not is_promotable(obj)


def test_build_cert_is_deterministic() -> None:
    ev = green_evidence()
    v = decide(ev, POLICY)
    from tests.support.factories import PROVENANCE, TS, spec

    a = build_cert(ev, v, spec(), POLICY, PROVENANCE, "live", TS)
    b = build_cert(ev, v, spec(), POLICY, PROVENANCE, "live", TS)
    assert a == b and a.digest == b.digest


@FAST
@given(st.data())
def test_report_agrees_with_classify_on_single_comparisons(data: st.DataObject) -> None:
    from batch_invariance.core.diff import classify, diff_pair

    x = data.draw(trials("a"))
    y = data.draw(st.one_of(trials("a"), st.builds(lambda t: changed(t), st.just(x))))
    r = diff_pair("AB", {"a": x}, {"a": y})
    outcome = classify(x, y)
    assert (outcome == "divergent") == (r.n_divergent == 1)
    assert (outcome == "token_only") == (r.n_token_only == 1)
    assert (outcome == "skipped") == (r.transport_skipped_ids == ("a",))
