"""Numeric evidence (issue 18): bitwise logprob comparison per pair and pass, and each verdict
branch it drives through the core."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_invariance.cert.certificate import is_promotable
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.evidence import CellEvidence, GatePolicy, Trial
from batch_invariance.core.numerics import (
    RISK_LENGTHS,
    ROUNDED_MIN_VALUES,
    cell_numerics,
    compare_pair,
    evidence_gate,
)
from batch_invariance.core.verdict import decide
from tests.support.factories import (
    cert_for,
    changed,
    green_evidence,
    ids,
    make_trial,
    replace_trial,
)

POLICY = GatePolicy()


def _shift(t: Trial, delta: float, at: int = 3) -> Trial:
    """``t`` with its logprob at position ``at`` and later moved by ``delta`` (same tokens)."""
    assert t.token_logprobs is not None
    moved = tuple(v - delta if i >= at else v for i, v in enumerate(t.token_logprobs))
    return changed(t, token_logprobs=moved)


def _drift_c(ev: CellEvidence, test_ids: list[str], delta: float = 0.125) -> CellEvidence:
    for p in ev.c_passes:
        for t in test_ids:
            ev = replace_trial(ev, "C", t, _shift(p.trials[t], delta), p.index)
    return ev


# ----------------------------------------------------------------- the comparison itself


def test_bitwise_equal_pair_has_no_rows_and_counts_every_position() -> None:
    a = {t: make_trial(t) for t in ids(3)}
    num = compare_pair("AC", a, [(0, dict(a)), (1, dict(a))])
    assert num.rows == () and num.drift_ids == () and num.max_abs_delta == 0.0
    per_row = len(a["t000"].tokens or ())
    assert num.positions == 2 * 3 * per_row
    assert [p.rows_compared for p in num.per_pass] == [3, 3]


def test_drift_is_found_at_its_first_position_with_its_size() -> None:
    a = {"x": make_trial("x")}
    c = {"x": _shift(a["x"], 0.25, at=4)}
    num = compare_pair("AC", a, [(0, c)])
    (row,) = num.rows
    assert (row.first_drift, row.token_flip) == (4, None)
    assert row.max_abs_delta == pytest.approx(0.25)
    assert num.per_pass[0].rows_with_drift == 1 and num.per_pass[0].first_drift_position == 4


def test_comparison_stops_at_the_first_token_difference() -> None:
    a = {"x": make_trial("x", tokens=("a", "b", "c", "d"))}
    x = a["x"]
    assert x.token_logprobs is not None
    # Tokens differ from position 2; logprobs differ only from position 3: no drift counted.
    moved = (*x.token_logprobs[:3], x.token_logprobs[3] - 1.0)
    c = {"x": changed(x, tokens=("a", "b", "Z", "d"), token_logprobs=moved)}
    num = compare_pair("AC", a, [(0, c)])
    (row,) = num.rows
    assert (row.positions, row.first_drift, row.token_flip) == (2, None, 2)
    assert num.drift_ids == () and num.per_pass[0].rows_with_token_flip == 1


def test_a_margin_change_alone_is_drift() -> None:
    a = {"x": make_trial("x")}
    x = a["x"]
    assert x.top_margins is not None
    c = {"x": changed(x, top_margins=(x.top_margins[0] + 1e-7, *x.top_margins[1:]))}
    assert compare_pair("AC", a, [(0, c)]).drift_ids == ("x",)


def test_missing_logprobs_are_counted_not_compared() -> None:
    a = {"x": make_trial("x"), "y": make_trial("y")}
    c = {"x": make_trial("x", numerics=False), "y": make_trial("y")}
    num = compare_pair("AC", a, [(0, c)])
    assert num.ids_without_logprobs == ("x",) and num.per_pass[0].rows_compared == 1


def test_evidence_gate_names_missing_and_rounded_logprobs() -> None:
    full = [make_trial(t) for t in ids(4)]
    assert evidence_gate({"A": full, "B": full}).ok
    bare = evidence_gate({"A": full, "B": [make_trial("t000", numerics=False)]})
    assert not bare.ok and bare.missing == {"B": 1}
    assert "1 trial(s) of B carry no pre-sampling logprobs" in bare.reason
    assert "cannot earn a promotable GREEN" in bare.reason
    rounded = [make_trial(t, token_logprobs=tuple(-0.1234 for _ in range(11))) for t in ids(4)]
    gate = evidence_gate({"A": full, "C0": rounded})
    assert not gate.ok and gate.rounded == ("C0",) and "look rounded" in gate.reason


def test_risk_estimate_is_the_share_of_margins_below_the_drift() -> None:
    # A's margins: 0.37 .. 0.414; AC drift of the margin 0.4 on half the positions.
    a = {t: make_trial(t) for t in ids(2)}
    c = {}
    for t, trial in a.items():
        assert trial.top_margins is not None
        margins = tuple(m + (0.4 if i % 2 else 0.0) for i, m in enumerate(trial.top_margins))
        c[t] = changed(trial, top_margins=margins)
    risk = cell_numerics(a, None, a, [(0, c)], 0.0).risk
    margins = [m for t in a.values() for m in t.top_margins or () if m is not None]
    deltas = [
        abs(mc - ma)
        for t in a
        for ma, mc in zip(a[t].top_margins or (), c[t].top_margins or (), strict=True)
        if ma is not None and mc is not None
    ]
    want = sum(sum(d > m for d in deltas) for m in margins) / (len(margins) * len(deltas))
    assert risk.per_token_flip_probability == pytest.approx(want) and 0 < want < 1
    assert [p.tokens for p in risk.curve] == list(RISK_LENGTHS)
    shares = [p.answer_change_share for p in risk.curve]
    assert shares == sorted(shares) and shares[0] == pytest.approx(1 - (1 - want) ** 64)


# ----------------------------------------------------------------- verdict branches


def test_bitwise_equal_everywhere_is_green_with_the_positions_it_proved() -> None:
    v = decide(green_evidence(), POLICY)
    assert v.status == "green" and v.numerics.evidence.ok
    positions = v.numerics.ac.positions
    assert positions == 2 * sum(len(t.tokens or ()) for t in green_evidence().a.values())
    want = f"tokens and logprobs bitwise equal at {positions} positions over 32 prompts x 2"
    assert v.numerics.statement.startswith(want) and "(64 co-batched)" in v.numerics.statement
    assert v.decision_reasons[-1] == v.numerics.statement
    cert, _ = cert_for()
    assert is_promotable(cert)


def test_drift_only_is_amber_latent_numeric_drift_naming_rows() -> None:
    ev = _drift_c(green_evidence(), ids(32)[:30])
    v = decide(ev, POLICY)
    assert v.status == "green_with_caveat" and v.anomaly == "latent_numeric_drift"
    assert v.divergence_class == "logit_drift"
    reason = next(r for r in v.decision_reasons if r.startswith("F4 latent numeric drift"))
    assert "batching changed the numerics on 30 of 32 rows" in reason
    assert "no answer changed in this sample" in reason and "first drift at token 3" in reason
    assert [p.rows_with_drift for p in v.numerics.ac.per_pass] == [30, 30]
    assert v.numerics.ac.max_abs_delta == pytest.approx(0.125)


def test_drift_plus_a_scored_change_is_red() -> None:
    ev = _drift_c(green_evidence(), ids(32))
    t = ev.c_passes[1].trials["t004"]
    ev = replace_trial(ev, "C", "t004", changed(t, extracted_answer="moved"), 1)
    v = decide(ev, POLICY)
    assert v.status == "failed" and v.divergence_class == "co_batching"
    assert v.numerics.statement.startswith("batching changed the numerics on 32 of 32 rows")


def test_no_logprobs_is_never_green_and_the_reason_says_why() -> None:
    ev = green_evidence()
    bare = {
        k: replace(t, token_logprobs=None, top_margins=None)
        for k, t in ev.c_passes[0].trials.items()
    }
    ev = replace(ev, c_passes=(replace(ev.c_passes[0], trials=bare), *ev.c_passes[1:]))
    v = decide(ev, POLICY)
    assert v.status == "green_unverified"
    assert any("numeric evidence missing: 32 trial(s) of C0" in r for r in v.decision_reasons)
    assert v.numerics.statement.startswith("no numeric statement")


def test_positive_logit_eps_can_be_green_but_never_promotable() -> None:
    ev = _drift_c(green_evidence(), ids(32), delta=0.001)
    assert decide(ev, POLICY).status == "green_with_caveat"
    loose = GatePolicy(logit_eps=0.01)
    v = decide(ev, loose)
    assert v.status == "green"
    assert v.numerics.statement.startswith("tokens and logprobs equal within eps 0.01 at ")
    cert, _ = cert_for(ev, policy=loose)
    verification = verify(cert, Depth.PARSED)
    assert verification.valid and not verification.promotable
    assert any("logit_eps 0.01 is looser" in r for r in verification.promotable_reasons)


def test_b_drift_while_c_equals_a_is_amber_slot_allocation() -> None:
    ev = green_evidence(serial_repeat=False)
    for t in ids(32)[:5]:
        ev = replace_trial(ev, "B", t, _shift(ev.b[t], 0.5))
    v = decide(ev, POLICY)
    assert v.status == "green_with_caveat" and v.anomaly == "AC_agree_B_disagrees"
    reason = v.decision_reasons[-1]
    assert reason.startswith("AB numeric drift on 5 of 32 rows") and "C equals A bitwise" in reason
    assert "slot allocation" in reason


def test_a_prime_drift_is_run_to_run_noise_and_never_green() -> None:
    ev = green_evidence()
    assert ev.a_repeat is not None
    ev = replace_trial(ev, "A_repeat", "t001", _shift(ev.a_repeat["t001"], 0.5))
    v = decide(ev, POLICY)
    assert v.status == "green_unverified" and not v.gates.serial_repeat.ok
    assert v.gates.serial_repeat.n_numeric_drift == 1
    assert "A' drifts numerically from A on 1 id(s)" in v.gates.serial_repeat.reason


def test_no_comparison_made_states_so() -> None:
    ev = green_evidence()
    failed = {k: replace(t, failure_mode="timeout") for k, t in ev.c_passes[0].trials.items()}
    ev = replace(ev, c_passes=(replace(ev.c_passes[0], trials=failed),))
    v = decide(ev, POLICY)
    assert v.status == "green_unverified"
    assert v.numerics.statement.startswith("no AC logprobs compared")


def _rounded_by_listing(trials: list[Trial]) -> bool:
    """The rounding rule as first written: list every non-zero value, then check them."""
    values = [
        v
        for t in trials
        if t.token_logprobs is not None
        for v in (*t.token_logprobs, *(m for m in t.top_margins or () if m is not None))
        if v
    ]
    return len(values) >= ROUNDED_MIN_VALUES and all(round(v, 4) == v for v in values)


@pytest.mark.parametrize(
    ("logprobs", "margins", "rounded"),
    [
        ((-0.1234,) * 8, (0.5,) * 8, True),  # 16 rounded non-zero values
        ((-0.1234,) * 8, (0.5,) * 7 + (0.0,), False),  # 15: a zero does not count
        ((-0.1234,) * 8, (0.5,) * 7 + (None,), False),  # 15: a missing margin does not count
        ((-0.1234,) * 40, (0.5,) * 39 + (0.123456789,), False),  # one exact value, last
        ((-0.123456789,) + (-0.1234,) * 39, (0.5,) * 40, False),  # the first value exact
        ((0.0,) * 40, (0.0,) * 40, False),  # nothing but zeros
    ],
)
def test_the_rounding_check_stops_early_but_judges_as_before(
    logprobs: tuple[float, ...], margins: tuple[float | None, ...], rounded: bool
) -> None:
    trials = [make_trial("x", token_logprobs=logprobs, top_margins=margins)]
    assert _rounded_by_listing(trials) is rounded
    assert (evidence_gate({"A": trials}).rounded == ("A",)) is rounded
