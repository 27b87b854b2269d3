"""The verdict table, first match wins: every row reached, and every row missed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_invariance.core.evidence import CellEvidence, GatePolicy
from batch_invariance.core.verdict import decide
from tests.support.factories import (
    changed,
    concurrent_pass,
    green_evidence,
    ids,
    make_trial,
    replace_pass,
    replace_trial,
    serial_map,
    transport_failure,
)

POLICY = GatePolicy()


def _c(ev: CellEvidence, test_id: str, pass_index: int = 0, **changes: object) -> CellEvidence:
    t = next(p for p in ev.c_passes if p.index == pass_index).trials[test_id]
    return replace_trial(ev, "C", test_id, changed(t, **changes), pass_index)


def _b(ev: CellEvidence, test_id: str, **changes: object) -> CellEvidence:
    return replace_trial(ev, "B", test_id, changed(ev.b[test_id], **changes))


def _ungated(ev: CellEvidence) -> CellEvidence:
    """Break F1 in one pass (server reported a single busy slot)."""
    return replace_pass(ev, 0, server_busy_max=1)


# ----------------------------------------------------------------- row 5 (baseline)


def test_green_when_everything_holds() -> None:
    v = decide(green_evidence(), POLICY)
    assert v.status == "green" and v.divergence_class is None and v.anomaly is None
    assert v.sensitivity.n_hot_trials == 64 and v.sensitivity.n_distinct_prompts == 32
    assert v.sensitivity.rate_upper_bound_95 == pytest.approx(3 / 32)
    assert v.sensitivity.per_comparison_rate_upper_bound_95 == pytest.approx(3 / 64)
    assert v.sensitivity.observed_rate is None


# ----------------------------------------------------------------- row 1: RED


def test_row1_ac_divergence_is_red_co_batching() -> None:
    v = decide(_c(green_evidence(), "t005", pass_index=1, extracted_answer="drift"), POLICY)
    assert v.status == "failed" and v.divergence_class == "co_batching"
    assert "t005" in v.decision_reasons[0] and "extracted_answer" in v.decision_reasons[0]
    s = v.sensitivity
    assert s.n_ac_divergent == 1 and s.rate_upper_bound_95 is None
    assert s.ci95_low is not None and s.ci95_high is not None
    assert s.ci95_low < s.observed_rate < s.ci95_high  # type: ignore[operator]


def test_row1_with_ab_divergence_is_slot_allocation() -> None:
    ev = _b(_c(green_evidence(), "t005", score=0.0), "t006", score=0.0)
    v = decide(ev, POLICY)
    assert v.status == "failed" and v.divergence_class == "slot_allocation(+co_batching)"


def test_row1_wins_over_unmet_gates() -> None:
    ev = _ungated(_c(green_evidence(n_ids=5, n_passes=1), "t001", score=0.0))
    assert decide(ev, POLICY).status == "failed"


def test_row1_missing_id_in_a_pass_is_red() -> None:
    ev = replace_trial(green_evidence(), "C", "t003", None, pass_index=1)
    v = decide(ev, POLICY)
    assert v.status == "failed" and v.reports.ac.only_x == ("t003",)


def test_row1_with_run_to_run_names_it() -> None:
    ev = green_evidence()
    ev = replace_trial(ev, "A_repeat", "t002", changed(ev.a["t002"], score=0.0))
    v = decide(_c(ev, "t004", score=0.0), POLICY)
    assert v.status == "failed" and v.divergence_class == "run_to_run(+co_batching)"


def test_row1_missed_when_ac_is_clean() -> None:
    assert decide(green_evidence(), POLICY).status != "failed"


# ----------------------------------------------------------------- row 2: UNVERIFIED


def _serial_pass(ev: CellEvidence) -> CellEvidence:
    serial = {t: make_trial(t, interval=(float(k), k + 0.5)) for k, t in enumerate(ids(32))}
    return replace_pass(ev, 0, trials=serial)


def _low_floor(ev: CellEvidence) -> CellEvidence:
    for t in ids(32)[:7]:  # equal in A and C (no divergence), just not scored
        ev = replace_trial(ev, "A", t, changed(ev.a[t], failure_mode="empty"))
        for p in ev.c_passes:
            ev = _c(ev, t, p.index, failure_mode="empty")
    return ev


def _missing_interval(ev: CellEvidence) -> CellEvidence:
    return _c(ev, "t000", dispatch_ts=None)


def _transport(ev: CellEvidence) -> CellEvidence:
    return replace_trial(ev, "C", "t007", transport_failure("t007", "timeout", (100.0, 101.0)))


def _few_hot(ev: CellEvidence) -> CellEvidence:
    return green_evidence(n_ids=10, n_passes=2)  # 20 hot comparisons < 30


def _run_to_run(ev: CellEvidence) -> CellEvidence:
    return replace_trial(ev, "A_repeat", "t002", changed(ev.a["t002"], completion="other"))


def _prompt_cached(ev: CellEvidence) -> CellEvidence:
    return _c(ev, "t003", 1, timings={"cache_n": 17.0, "prompt_n": 3.0})


@pytest.mark.parametrize(
    ("breaker", "needle"),
    [
        (_ungated, "F1 overlap not met"),
        (_serial_pass, "F1 overlap not met"),
        (_low_floor, "F2 completion floor not met"),
        (_missing_interval, "F3 co-batch coverage not met"),
        (_transport, "transport failures"),
        (_few_hot, "sample size not met"),
        (_run_to_run, "serial repeat"),
        (_prompt_cached, "prompt cache"),
    ],
)
def test_row2_each_gate_gives_unverified(breaker, needle: str) -> None:  # type: ignore[no-untyped-def]
    v = decide(breaker(green_evidence()), POLICY)
    assert v.status == "green_unverified", v.decision_reasons
    assert any(needle in r for r in v.decision_reasons), v.decision_reasons


def test_prompt_cache_reuse_never_hides_a_red() -> None:
    ev = _c(_prompt_cached(green_evidence()), "t005", 0, score=0.0, passed=False)
    assert decide(ev, POLICY).status == "failed"


def test_row2_run_to_run_is_named_in_divergence_class() -> None:
    v = decide(_run_to_run(green_evidence()), POLICY)
    assert v.divergence_class == "run_to_run"


def test_row2_missed_when_gates_hold_and_min_hot_trials_is_policy() -> None:
    few = green_evidence(n_ids=32, n_passes=1)
    assert decide(few, GatePolicy(min_hot_trials=32)).status == "green"
    assert decide(few, GatePolicy(min_hot_trials=33)).status == "green_unverified"
    assert decide(green_evidence(serial_repeat=False), POLICY).status == "green"


def test_row2_reasons_list_every_unmet_gate_in_order() -> None:
    ev = _transport(_ungated(green_evidence()))
    reasons = decide(ev, POLICY).decision_reasons
    f1 = next(i for i, r in enumerate(reasons) if "F1" in r)
    tr = next(i for i, r in enumerate(reasons) if "transport" in r)
    assert 0 < f1 < tr


def test_transport_failure_is_never_red_but_real_divergence_still_is() -> None:
    ev = _transport(green_evidence())
    assert decide(ev, POLICY).status == "green_unverified"
    assert decide(_c(ev, "t001", score=0.0), POLICY).status == "failed"


# ----------------------------------------------------------------- row 3: AMBER (B)


def test_row3_ab_divergence_with_ac_clean_is_amber() -> None:
    v = decide(_b(green_evidence(), "t003", score=0.0), POLICY)
    assert v.status == "green_with_caveat" and v.anomaly == "AC_agree_B_disagrees"


def test_row3_loses_to_row2() -> None:
    ev = _ungated(_b(green_evidence(), "t003", score=0.0))
    assert decide(ev, POLICY).status == "green_unverified"


# ----------------------------------------------------------------- row 4: AMBER (tokens)


def test_row4_token_only_is_amber() -> None:
    ev = _c(green_evidence(), "t001", completion="different text, same answer")
    v = decide(ev, POLICY)
    assert v.status == "green_with_caveat" and v.divergence_class == "token_only"
    assert v.anomaly is None and v.reports.ac.token_divergence_ids == ("t001",)


def test_row4_loses_to_row3() -> None:
    ev = _b(_c(green_evidence(), "t001", completion="moved text"), "t002", score=0.0)
    assert decide(ev, POLICY).anomaly == "AC_agree_B_disagrees"


def test_token_only_b_is_amber_like_token_only_c() -> None:
    # Invariant fields equal everywhere, but B's content differs from A: as for AC (row 4),
    # token-only differences of the serial control are AMBER, never GREEN.
    ev = _b(green_evidence(), "t009", completion="b only")
    v = decide(ev, POLICY)
    assert v.reports.bc.n_token_only == 1 and v.reports.ab.n_token_only == 1
    assert v.status == "green_with_caveat" and v.anomaly == "AC_agree_B_disagrees"
    assert any("AB token-only differences on 1 id(s)" in r for r in v.decision_reasons)


def test_decide_does_not_depend_on_pass_order() -> None:
    ev = _c(green_evidence(n_passes=3), "t002", pass_index=2, score=0.0)
    rev = replace(ev, c_passes=tuple(reversed(ev.c_passes)))
    assert decide(ev, POLICY) == decide(rev, POLICY)


# ----------------------------------------------------------------- issue 12: trust rules


def test_length_floor_below_default_is_unverified_naming_the_length() -> None:
    ev = green_evidence()
    short = replace(
        ev,
        a={k: changed(t, completion_tokens=3, finish_reason="length") for k, t in ev.a.items()},
    )
    v = decide(short, POLICY)
    assert v.status == "green_unverified"
    reason = next(r for r in v.decision_reasons if r.startswith("answer length"))
    assert "median 3 generated tokens" in reason and "need a median >= 64" in reason
    assert v.gates.length.share_cut_by_budget == 1.0
    # Exactly at the floor is enough; a raised floor is not met by the same evidence.
    at_floor = replace(ev, a={k: changed(t, completion_tokens=64) for k, t in ev.a.items()})
    assert decide(at_floor, POLICY).status == "green"
    assert decide(at_floor, GatePolicy(min_answer_tokens=65)).status == "green_unverified"


def test_length_is_the_shorter_side_and_an_unknown_count_fails_closed() -> None:
    ev = _c(green_evidence(), "t001", 0, completion_tokens=None)
    v = decide(ev, POLICY)
    assert v.status == "green_unverified"
    assert any("no server-reported generated-token count" in r for r in v.decision_reasons)
    ev = green_evidence()
    for t in ids(32)[:17]:  # more than half of each pass answered short in C
        for p in ev.c_passes:
            ev = _c(ev, t, p.index, completion_tokens=10)
    g = decide(ev, POLICY).gates.length
    assert (g.answer_tokens_min, g.answer_tokens_median, g.answer_tokens_max) == (10, 10, 80)
    assert not g.ok


def test_bound_counts_distinct_prompts_not_repetitions() -> None:
    # 1 row x 4 reps x 8 passes: 32 hot comparisons of one prompt.
    rep_ids = [f"n0#r{k}" for k in range(4)]
    one = replace(
        green_evidence(),
        items=(),
        a=serial_map(rep_ids),
        a_repeat=serial_map(rep_ids),
        b=serial_map(rep_ids),
        c_passes=tuple(concurrent_pass(rep_ids, i) for i in range(8)),
    )
    v = decide(one, POLICY)
    s = v.sensitivity
    assert s.n_hot_trials == 32 and s.n_distinct_prompts == 1
    assert s.rate_upper_bound_95 == 1.0 and s.per_comparison_rate_upper_bound_95 == 3 / 32
    assert v.status == "green_unverified"
    assert any("per-prompt bound not met" in r for r in v.decision_reasons)


def test_bound_of_exactly_max_bound_is_met_and_stricter_max_bound_is_not() -> None:
    ev = green_evidence(n_ids=30)
    assert decide(ev, POLICY).sensitivity.rate_upper_bound_95 == pytest.approx(0.1)
    assert decide(ev, POLICY).status == "green"
    assert decide(ev, GatePolicy(max_bound=0.09)).status == "green_unverified"
    assert decide(green_evidence(n_ids=29), POLICY).status == "green_unverified"


def test_every_bound_is_a_probability_even_under_min_hot_trials_1() -> None:
    v = decide(green_evidence(n_ids=2, n_passes=1), GatePolicy(min_hot_trials=1))
    s = v.sensitivity
    assert s.rate_upper_bound_95 == 1.0 and s.per_comparison_rate_upper_bound_95 == 1.0
    assert v.status == "green_unverified"


def test_green_needs_a_serial_repeat_a_prime_or_b() -> None:
    no_a_prime = green_evidence(serial_repeat=False)
    assert decide(no_a_prime, POLICY).status == "green"  # B is the serial repeat
    neither = replace(no_a_prime, b={})
    v = decide(neither, POLICY)
    assert v.status == "green_unverified" and not v.gates.serial_repeat.ok
    assert any("neither A' nor B" in r for r in v.decision_reasons)
    # A' is a serial repeat on its own; a B with nothing in it still is no GREEN (row 3).
    only_a_prime = decide(replace(green_evidence(), b={}), POLICY)
    assert only_a_prime.gates.serial_repeat.ok and only_a_prime.status == "green_with_caveat"


def test_unreported_cache_n_fails_closed() -> None:
    ev = _c(green_evidence(), "t004", 1, timings={"prompt_n": 12.0})
    v = decide(ev, POLICY)
    assert v.status == "green_unverified"
    assert any("did not report timings.cache_n" in r for r in v.decision_reasons)
    assert v.gates.prompt_cache.unreported == {"C[1]": 1}


def test_red_from_an_id_missing_in_a_c_pass_names_it_and_counts_it() -> None:
    ev = replace_trial(green_evidence(), "C", "t011", None, 1)
    v = decide(ev, POLICY)
    assert v.status == "failed"
    assert "t011 missing from C in pass 1" in v.decision_reasons[0]
    s = v.sensitivity
    assert s.n_ac_divergent == 1 and s.n_ac_divergent_ids == 1
    assert s.rate_upper_bound_95 is None and s.observed_rate is not None
    assert 0.0 <= s.ci95_low <= s.observed_rate <= s.ci95_high <= 1.0  # type: ignore[operator]


# ----------------------------------------------------------------- the rules as a table
def test_the_rules_are_asked_in_order_and_the_first_match_decides() -> None:
    """Each rule reads the findings on the understanding that the rules before it did not
    match (the table is ordered): a RED is decided by the first rule, a GREEN by the last."""
    from batch_invariance.core.findings import find
    from batch_invariance.core.verdict import RULES, green, red_ac, unverified

    assert RULES[0] is red_ac and RULES[-1] is green and len(RULES) == 7
    red = _c(green_evidence(), "t003", extracted_answer="other")
    ruling = red_ac(find(red, POLICY))
    assert ruling is not None and ruling.status == decide(red, POLICY).status == "failed"
    clean = find(green_evidence(), POLICY)
    assert [rule.__name__ for rule in RULES[:-1] if rule(clean) is not None] == []
    assert green(clean).reasons == decide(green_evidence(), POLICY).decision_reasons
    ungated = find(_ungated(green_evidence()), POLICY)
    assert red_ac(ungated) is None and unverified(ungated) is not None
