"""Each anti-vacuity gate, made to pass and to fail."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from batch_invariance.core import gates as g
from batch_invariance.core import sample
from batch_invariance.core.evidence import GatePolicy, PassRecord
from tests.support.factories import (
    changed,
    concurrent_pass,
    green_evidence,
    ids,
    make_trial,
    replace_pass,
    replace_trial,
    transport_failure,
)

POLICY = GatePolicy()


def brute_cobatched(spans: list[tuple[float, float]], m: float) -> list[bool]:
    """The quadratic definition the fast version must match."""
    out = []
    for i, (si, ei) in enumerate(spans):
        hit = False
        for j, (sj, ej) in enumerate(spans):
            if i != j:
                ov = min(ei, ej) - max(si, sj)
                if ov >= m and ov > 0:
                    hit = True
                    break
        out.append(hit)
    return out


# ----------------------------------------------------------------- interval helpers


def test_overlap_depth_ignores_touching_intervals() -> None:
    assert g.max_overlap_depth([(0, 1), (1, 2), (2, 3)]) == 1
    assert g.max_overlap_depth([(0, 1), (0.5, 2), (0.9, 3)]) == 3
    assert g.max_overlap_depth([]) == 0


def test_cobatched_needs_a_real_margin_not_a_touch() -> None:
    m = 0.005
    assert g.cobatched_flags([(0.0, 1.0), (1.0, 2.0)], m) == [False, False]
    assert g.cobatched_flags([(0.0, 1.0), (0.996, 2.0)], m) == [False, False]
    assert g.cobatched_flags([(0.0, 1.0), (0.99, 2.0)], m) == [True, True]


def test_short_intervals_never_count() -> None:
    # A 1 ms request inside a long one overlaps it entirely but by less than the margin.
    assert g.cobatched_flags([(0.0, 1.0), (0.5, 0.501)], 0.005) == [False, False]


def test_later_partner_found_through_next_long_interval() -> None:
    # i=0 starts first; its only partner starts later; a short one sits in between.
    spans = [(0.0, 1.0), (0.1, 0.1005), (0.5, 3.0)]
    assert g.cobatched_flags(spans, 0.005) == [True, False, True]


def test_fast_cobatch_matches_quadratic_definition_on_random_sets() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 12)
        spans = []
        for _ in range(n):
            s = round(rng.uniform(0, 2), 3)
            spans.append((s, s + round(rng.choice([0.0, 0.001, 0.004, 0.005, 0.3, 1.0]), 3)))
        m = rng.choice([0.0, 0.005, 0.01])
        assert g.cobatched_flags(spans, m) == brute_cobatched(spans, m), (spans, m)


# ----------------------------------------------------------------- F1 overlap


def test_f1_met_when_every_pass_overlaps_and_server_busy() -> None:
    gate = g.overlap_gate(green_evidence().c_passes)
    assert gate.ok and all(p.client_max_depth >= 2 for p in gate.per_pass)


def test_f1_fails_when_client_intervals_never_overlap() -> None:
    ev = green_evidence()
    serial = {t: make_trial(t, interval=(float(k), k + 0.5)) for k, t in enumerate(ids(20))}
    ev = replace_pass(ev, 1, trials=serial)
    gate = g.overlap_gate(ev.c_passes)
    assert not gate.ok and "pass 1" in gate.reason and "client depth 1" in gate.reason


@pytest.mark.parametrize("busy", [None, 0, 1])
def test_f1_fails_without_server_busy_signal_of_two(busy: int | None) -> None:
    ev = replace_pass(green_evidence(), 0, server_busy_max=busy)
    assert not g.overlap_gate(ev.c_passes).ok


def test_f1_fails_closed_with_no_passes() -> None:
    assert not g.overlap_gate(()).ok


# ----------------------------------------------------------------- F2 floor


def _with_failed(n_failed: int, total: int = 32) -> PassRecord:
    p = concurrent_pass(ids(total), 0)
    trials = dict(p.trials)
    for t in ids(total)[:n_failed]:
        trials[t] = changed(trials[t], failure_mode="empty")
    return replace(p, trials=trials)


def test_f2_floor_met_at_exactly_80_percent() -> None:
    ev = green_evidence()
    a = {t: ev.a[t] for t in ids(20)}
    gate = g.completion_floor_gate(a, [_with_failed(4, 20)], POLICY)
    assert gate.ok and gate.n_scored == 16 and gate.n_total == 20


def test_f2_floor_not_met_below_80_percent() -> None:
    ev = green_evidence()
    a = {t: ev.a[t] for t in ids(20)}
    gate = g.completion_floor_gate(a, [_with_failed(5, 20)], POLICY)
    assert not gate.ok and gate.observed == 0.75


def test_f2_counts_failures_in_a_too_and_fails_closed_when_empty() -> None:
    ev = green_evidence()
    a = {k: changed(v, failure_mode="empty") for k, v in ev.a.items()}
    assert not g.completion_floor_gate(a, ev.c_passes, POLICY).ok
    assert not g.completion_floor_gate({}, (), POLICY).ok


# ----------------------------------------------------------------- F3 coverage


def test_required_is_exact_and_at_least_two() -> None:
    assert g.required_cobatched(15, 0.8) == 12  # 0.8 * 15 in floats is 12.000000000000002
    assert g.required_cobatched(1, 0.8) == 2
    assert g.required_cobatched(10, 0.8) == 8


def test_f3_met_when_all_ids_cobatched() -> None:
    gate = g.coverage_gate(green_evidence().c_passes, POLICY)
    assert gate.ok and all(p.n_cobatched == 32 for p in gate.per_pass)


def test_f3_fails_when_too_few_ids_overlap() -> None:
    p = concurrent_pass(ids(20), 0)
    trials = dict(p.trials)
    for k, t in enumerate(ids(20)[:5]):  # 5 of 20 run alone, far later
        trials[t] = changed(trials[t], dispatch_ts=1000.0 + 10 * k, complete_ts=1001.0 + 10 * k)
    gate = g.coverage_gate([replace(p, trials=trials)], POLICY)
    assert not gate.ok and gate.per_pass[0].n_cobatched == 15 and gate.per_pass[0].required == 16


def test_f3_fails_closed_on_any_missing_interval() -> None:
    ev = green_evidence()
    t = ev.c_passes[0].trials["t000"]
    ev = replace_trial(ev, "C", "t000", changed(t, complete_ts=None), pass_index=0)
    gate = g.coverage_gate(ev.c_passes, POLICY)
    assert not gate.ok and gate.per_pass[0].missing_intervals == 1
    assert "no request interval" in gate.reason


def test_f3_never_mixes_passes() -> None:
    # Each pass alone is serial; together their intervals would overlap.
    a = {t: make_trial(t, interval=(float(k), k + 0.5)) for k, t in enumerate(ids(10))}
    b = {t: make_trial(t, interval=(k + 0.25, k + 0.75)) for k, t in enumerate(ids(10))}
    passes = [PassRecord(0, a, 4), PassRecord(1, b, 4)]
    gate = g.coverage_gate(passes, POLICY)
    assert not gate.ok and [p.n_cobatched for p in gate.per_pass] == [0, 0]


def test_f3_fails_closed_with_no_passes() -> None:
    assert not g.coverage_gate((), POLICY).ok


# ----------------------------------------------------------------- transport, sample size


def test_transport_gate_met_and_not_met() -> None:
    ev = green_evidence()
    assert g.transport_gate(ev).ok
    bad = replace_trial(ev, "C", "t004", transport_failure("t004", "timeout", (100.0, 101.0)), 1)
    gate = g.transport_gate(bad)
    assert not gate.ok and gate.counts == {"C[1]": 1} and gate.ids == ("t004",)
    bad_a = replace_trial(ev, "A", "t001", transport_failure("t001", "connection_error"))
    assert not g.transport_gate(bad_a).ok


def test_prompt_cache_gate_met_and_not_met() -> None:
    ev = green_evidence()
    gate = g.prompt_cache_gate(ev)
    assert gate.ok and "every trial reported cache_n 0" in gate.reason
    zero = replace_trial(ev, "B", "t002", replace(ev.b["t002"], timings={"cache_n": 0.0}))
    assert g.prompt_cache_gate(zero).ok
    reused = replace_trial(ev, "A", "t002", replace(ev.a["t002"], timings={"cache_n": 9.0}))
    bad = g.prompt_cache_gate(reused)
    assert not bad.ok and bad.counts == {"A": 1} and bad.ids == ("t002",)
    silent = replace_trial(ev, "B", "t003", replace(ev.b["t003"], timings={}))
    unreported = g.prompt_cache_gate(silent)
    assert not unreported.ok and unreported.unreported == {"B": 1}
    assert "did not report timings.cache_n" in unreported.reason
    # A transport failure has no timings: the transport gate owns it, not this one.
    lost = replace_trial(ev, "C", "t001", transport_failure("t001", "timeout", (100.0, 101.0)))
    assert g.prompt_cache_gate(lost).ok


def test_hot_trials_need_ok_in_both_and_cobatched() -> None:
    ev = green_evidence(n_ids=10, n_passes=2)
    assert len(sample.hot_trials(ev.a, ev.c_passes, 0.005)) == 20
    ev2 = replace_trial(ev, "A", "t000", changed(ev.a["t000"], failure_mode="empty"))
    assert len(sample.hot_trials(ev2.a, ev2.c_passes, 0.005)) == 18


def test_sample_gate_met_and_not_met() -> None:
    assert sample.sample_gate(30, POLICY).ok
    assert not sample.sample_gate(29, POLICY).ok
    assert not sample.sample_gate(0, GatePolicy(min_hot_trials=0)).ok


# ----------------------------------------------------------------- per-prompt bound, length


def test_bound_gate_is_exact_at_the_limit_and_fails_closed_without_a_bound() -> None:
    assert sample.bound_gate(30, 3 / 30, POLICY).ok
    assert not sample.bound_gate(29, 3 / 29, POLICY).ok
    gate = sample.bound_gate(0, None, POLICY)
    assert not gate.ok and "bound none" in gate.reason and ">= 30 distinct prompts" in gate.reason


def test_length_gate_uses_lower_median_and_counts_budget_cuts() -> None:
    ev = green_evidence(n_ids=4, n_passes=1)
    p = ev.c_passes[0]
    lengths = {"t000": 10, "t001": 70, "t002": 90, "t003": 100}
    a = {k: changed(t, completion_tokens=lengths[k]) for k, t in ev.a.items()}
    trials = dict(p.trials)
    trials["t003"] = changed(trials["t003"], finish_reason="length")
    hot = tuple((0, k) for k in sorted(lengths))
    gate = sample.length_gate(a, [replace(p, trials=trials)], hot, POLICY)
    # C answered 80 tokens each: the shorter side counts (10, 70, 80, 80), lower median 70.
    assert (gate.answer_tokens_min, gate.answer_tokens_median, gate.answer_tokens_max) == (
        10,
        70,
        80,
    )
    assert gate.ok and gate.share_cut_by_budget == 0.25
    assert not sample.length_gate(a, [p], hot, GatePolicy(min_answer_tokens=71)).ok
    empty = sample.length_gate(a, [p], (), POLICY)
    assert not empty.ok and empty.answer_tokens_median is None
