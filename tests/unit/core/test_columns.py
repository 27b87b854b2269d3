""":func:`decide` on per-arm columns against the straightforward definitions it replaces.

The verdict reads every arm once into :mod:`batch_invariance.core.columns`; BC reuses the AC
comparison wherever B has A's key; F1 and F3 share one sort of each pass's intervals; the hot
comparisons stay per-pass id sets; group counts go through a label index. Each property here
rebuilds what a gate or report says the slow, obvious way (one loop per trial, quadratic
co-batching, an event sweep for the depth, one ``classify`` per comparison) on random small
evidence mixing the cases a fast path could get wrong, and requires the same answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from batch_invariance.core.columns import arm_columns, fill_label, unequal_ids, unequal_via
from batch_invariance.core.diff import classify, compare
from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta, PassRecord, Trial
from batch_invariance.core.gates import cobatched_flags
from batch_invariance.core.plan import row_id
from batch_invariance.core.verdict import decide
from tests.unit.core.test_fast_paths import FAST, reference_depth, trials, twins
from tests.unit.core.test_gates import brute_cobatched as brute_cobatched_flags

#: Ids with repetitions of one prompt (``#rK``), so distinct prompts and hot pairs differ.
IDS = ["p0", "p1", "p1#r1", "p1#r2", "p2#r1", "p3"]
MARGINS = (0.0, 0.005, 0.5)


@st.composite
def arm(draw: st.DrawFn) -> dict[str, Trial]:
    chosen = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    return {tid: draw(trials(tid)) for tid in sorted(chosen)}


@st.composite
def items(draw: st.DrawFn) -> tuple[ItemMeta, ...]:
    chosen = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    return tuple(
        ItemMeta(
            tid,
            family=draw(st.sampled_from([None, "f1", "f2"])),
            fill=draw(st.sampled_from([None, 0.0, -0.0, 0.25, 0.5])),
        )
        for tid in chosen
    )


@st.composite
def evidence(draw: st.DrawFn) -> CellEvidence:
    a = draw(arm())

    def pass_trials() -> dict[str, Trial]:
        # Exactly A's ids in A's order (the core's same-order fast paths), a twin of A in its
        # order with ids dropped or added, or a twin in another order (the general paths).
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return {t: draw(st.one_of(st.just(replace(x)), trials(t))) for t, x in a.items()}
        twin = draw(twins(a))
        return twin if kind == 1 else dict(reversed(list(twin.items())))

    passes = tuple(
        PassRecord(
            index=i,
            trials=pass_trials(),
            server_busy_max=draw(st.sampled_from([None, 1, 2])),
        )
        for i in draw(st.lists(st.integers(0, 3), unique=True, min_size=1, max_size=3))
    )
    return CellEvidence(
        items=draw(items()),
        a=a,
        a_repeat=draw(st.one_of(st.none(), twins(a))),
        b=draw(st.one_of(twins(a), arm())),
        c_passes=passes,
    )


def brute_cobatched(p: PassRecord, margin: float) -> set[str]:
    timed = [
        (tid, t.dispatch_ts, t.complete_ts)
        for tid, t in p.trials.items()
        if t.dispatch_ts is not None and t.complete_ts is not None
    ]
    out = set()
    for tid, s, e in timed:
        for other, s2, e2 in timed:
            overlap = min(e, e2) - max(s, s2)
            if other != tid and overlap >= margin and overlap > 0:
                out.add(tid)
    return out


def reference_length(ev: CellEvidence, hot: list[tuple[int, str]]) -> dict[str, Any]:
    by_index = {p.index: p.trials for p in ev.c_passes}
    lengths, unknown, cut = [], 0, 0
    for index, tid in hot:
        at, ct = ev.a[tid], by_index[index][tid]
        cut += at.cut_by_budget or ct.cut_by_budget
        if at.completion_tokens is None or ct.completion_tokens is None:
            unknown += 1
        else:
            lengths.append(min(at.completion_tokens, ct.completion_tokens))
    lengths.sort()
    return {
        "n_measured": len(lengths),
        "n_unknown": unknown,
        "min": lengths[0] if lengths else None,
        "median": lengths[(len(lengths) - 1) // 2] if lengths else None,
        "max": lengths[-1] if lengths else None,
        "share": cut / len(hot) if hot else None,
    }


@FAST
@given(evidence(), st.sampled_from(MARGINS))
def test_decide_gates_match_their_per_trial_definitions(ev: CellEvidence, margin: float) -> None:
    policy = GatePolicy(overlap_margin_s=margin)
    verdict = decide(ev, policy)
    gates, sens = verdict.gates, verdict.sensitivity
    passes = sorted(ev.c_passes, key=lambda p: p.index)
    co = {p.index: brute_cobatched(p, margin) for p in passes}
    a_ok = {tid for tid, t in ev.a.items() if t.is_ok}
    both_ok = [
        (p.index, tid) for p in passes for tid, t in p.trials.items() if t.is_ok and tid in a_ok
    ]
    hot = sorted((index, tid) for index, tid in both_ok if tid in co[index])

    spans: dict[int, list[tuple[float, float]]] = {
        p.index: [
            (t.dispatch_ts, t.complete_ts)
            for t in p.trials.values()
            if t.dispatch_ts is not None and t.complete_ts is not None
        ]
        for p in passes
    }
    assert [(r.index, r.client_max_depth) for r in gates.overlap.per_pass] == [
        (p.index, reference_depth(spans[p.index]))
        for p in passes  # type: ignore[arg-type]
    ]
    assert [
        (r.index, r.n_ids, r.n_cobatched, r.missing_intervals) for r in gates.coverage.per_pass
    ] == [
        (p.index, len(p.trials), len(co[p.index]), len(p.trials) - len(spans[p.index]))
        for p in passes
    ]
    total = sum(len(set(ev.a) | set(p.trials)) for p in passes)
    assert (gates.floor.n_scored, gates.floor.n_total) == (len(both_ok), total)
    assert sens.n_hot_trials == gates.sample.n_hot_trials == len(hot)
    assert sens.n_distinct_prompts == len({row_id(tid) for _, tid in hot})
    length = gates.length
    assert {
        "n_measured": length.n_measured,
        "n_unknown": length.n_unknown,
        "min": length.answer_tokens_min,
        "median": length.answer_tokens_median,
        "max": length.answer_tokens_max,
        "share": length.share_cut_by_budget,
    } == reference_length(ev, hot)


def reference_groups(
    ev: CellEvidence, x: dict[str, Trial], ys: list[dict[str, Trial]], report: Any
) -> list[dict[str, tuple[int, int, int]]]:
    """Per family and per fill bucket: ids compared (in some pass, not skipped), divergent
    and token-only, counted one id at a time."""
    compared = {
        tid
        for y in ys
        for tid in x.keys() | y.keys()
        if classify(x.get(tid), y.get(tid)) != "skipped"
    }
    family = {m.test_id: m.family or "unknown" for m in ev.items}
    fill = {m.test_id: fill_label(m.fill) for m in ev.items}
    tables = []
    for label_of, default in ((family, "unknown"), (fill, fill_label(None))):
        n = Counter(label_of.get(t, default) for t in compared)
        d = Counter(label_of.get(t, default) for t in report.divergent_ids)
        o = Counter(label_of.get(t, default) for t in report.token_divergence_ids)
        tables.append({k: (n[k], d[k], o[k]) for k in sorted(n)})
    return tables


def counts(report: Any) -> list[dict[str, tuple[int, int, int]]]:
    return [
        {k: (g.n_compared, g.n_divergent, g.n_token_only) for k, g in table.items()}
        for table in (report.by_family, report.by_fill)
    ]


@FAST
@given(evidence())
def test_decide_reports_match_direct_comparisons(ev: CellEvidence) -> None:
    """AC, AB and BC inside :func:`decide` (BC through A where B has A's key) equal each
    pair compared on its own, and the group counts equal a Counter over the labels."""
    reports = decide(ev, GatePolicy()).reports
    ordered = sorted(ev.c_passes, key=lambda p: p.index)
    passes = [(p.index, p.trials) for p in ordered]
    assert reports.ac == compare("AC", ev.a, passes, ev.items)
    assert reports.bc == compare("BC", ev.b, passes, ev.items)
    assert reports.ab == compare("AB", ev.a, [(None, ev.b)], ev.items)
    c_maps = [dict(p.trials) for p in ordered]
    assert counts(reports.ac) == reference_groups(ev, dict(ev.a), c_maps, reports.ac)
    assert counts(reports.bc) == reference_groups(ev, dict(ev.b), c_maps, reports.bc)
    assert counts(reports.ab) == reference_groups(ev, dict(ev.a), [dict(ev.b)], reports.ab)


@FAST
@given(arm(), arm(), arm())
def test_unequal_via_a_reference_equals_the_direct_comparison(
    a: dict[str, Trial], b: dict[str, Trial], c: dict[str, Trial]
) -> None:
    ac, bc = arm_columns(a), arm_columns(b)
    cc = arm_columns(c, keyed=False)
    ab_unequal = unequal_ids(ac, bc)
    agree = frozenset(bc.ids).difference(ab_unequal)
    via = unequal_via(unequal_ids(ac, cc), agree, bc, cc)
    assert sorted(via) == sorted(unequal_ids(bc, cc))
    assert len(via) == len(set(via))


#: Starts that tie often (the sort only orders by start), durations around the margins.
SPANS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 0.004, 0.005, 0.5, 1.0])),
    max_size=10,
).map(lambda pairs: [(s, s + d) for s, d in pairs])


@FAST
@given(SPANS, st.sampled_from(MARGINS))
def test_cobatched_flags_match_the_pairwise_definition_with_tied_starts(
    spans: list[tuple[float, float]], margin: float
) -> None:
    assert cobatched_flags(spans, margin) == brute_cobatched_flags(spans, margin)
