"""The core's fast paths against the straightforward definitions they replace.

:func:`batch_invariance.core.diff.compare` skips the per-id step for ids whose agreement keys
are equal; the gates count with set operations and C-level maps. Each property here rebuilds
the result the slow, obvious way (one :func:`classify` per id x pass, one loop per trial) and
requires the same answer on random maps that mix the cases a fast path could get wrong:
``1`` vs ``True`` vs ``1.0``, NaN, a recorded sha against a completion text, missing ids,
transport failures, logprobs, missing intervals and unreported ``cache_n``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batch_invariance.core.diff import PairReport, classify, compare
from batch_invariance.core.evidence import (
    TRANSPORT_MODES,
    CellEvidence,
    GatePolicy,
    PassRecord,
    Trial,
)
from batch_invariance.core.gates import (
    completion_floor_gate,
    max_overlap_depth,
    prompt_cache_gate,
    transport_gate,
)
from batch_invariance.core.sample import hot_trials
from tests.support.factories import make_trial, transport_failure

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAN = float("nan")
IDS = [f"i{k}" for k in range(6)]


@st.composite
def trials(draw: st.DrawFn, test_id: str) -> Trial:
    if draw(st.integers(0, 7)) == 0:
        return transport_failure(test_id, draw(st.sampled_from(sorted(TRANSPORT_MODES))))
    start = draw(st.sampled_from([0.0, 0.5, 1.0, 1.5]))
    trial = make_trial(
        test_id,
        completion=draw(st.sampled_from([None, "a", "b"])),
        score=draw(st.sampled_from([None, 0.0, 1.0, 1, True, NAN])),
        passed=draw(st.sampled_from([None, True, False, 1, 0])),
        extracted_answer=draw(st.sampled_from([None, "x", "y"])),
        prompt_tokens_measured=draw(st.sampled_from([None, 1, True, 12])),
        failure_mode=draw(st.sampled_from(["ok", "ok", "empty", "scorer_error"])),
        tokens=draw(st.sampled_from([None, ("a",), ("a", "b"), ("b",)])),
        token_logprobs=draw(st.sampled_from([None, (-0.5,), (-0.5, -1.0), (-0.25, -1.0)])),
        interval=draw(st.sampled_from([None, (start, start + 1.0), (start, start)])),
        completion_tokens=draw(st.sampled_from([None, 3, 40])),
        finish_reason=draw(st.sampled_from(["stop", "length"])),
        cache_n=draw(st.sampled_from([0.0, 0, None, 5.0])),
    )
    if draw(st.booleans()):
        # A recorded sha that may or may not match the text.
        trial = replace(trial, content_sha256=draw(st.sampled_from(["s1", "s2"])))
    return trial


@st.composite
def trial_maps(draw: st.DrawFn) -> dict[str, Trial]:
    chosen = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    return {tid: draw(trials(tid)) for tid in sorted(chosen)}


RETYPED_FIELDS = ("score", "passed", "prompt_tokens_measured")
#: An equal value of another type: ``1 == True == 1.0`` must still count as a change of
#: ``passed``'s type (bool vs int), exactly as :func:`same_value` says.
RETYPE: tuple[tuple[Any, Any], ...] = (
    (True, 1), (1, 1.0), (1.0, True), (False, 0), (0, 0.0), (0.0, False),
)  # fmt: skip


def retyped(trial: Trial, field: str) -> Trial:
    value = getattr(trial, field)
    if value is None or value != value:
        return replace(trial)
    for old, new in RETYPE:
        if type(old) is type(value) and old == value:
            return replace(trial, **{field: new})
    return replace(trial)


@st.composite
def twins(draw: st.DrawFn, base: dict[str, Trial]) -> dict[str, Trial]:
    """A map that mostly repeats ``base`` (equal trials, as distinct objects), with some
    ids dropped, changed or added: the fast path's common case next to its edge cases."""
    out: dict[str, Trial] = {}
    for tid, trial in base.items():
        choice = draw(st.integers(0, 5))
        if choice == 0:
            continue
        if choice == 1:
            out[tid] = draw(trials(tid))
        elif choice == 2:
            out[tid] = retyped(trial, draw(st.sampled_from(RETYPED_FIELDS)))
        else:
            out[tid] = replace(trial)
    for tid in IDS:
        if tid not in base and draw(st.booleans()):
            out[tid] = draw(trials(tid))
    return out


@st.composite
def arms(draw: st.DrawFn) -> tuple[dict[str, Trial], list[dict[str, Trial]]]:
    x = draw(trial_maps())
    ys = [draw(twins(x)) for _ in range(draw(st.integers(1, 3)))]
    return x, ys


def reference_compare(x: dict[str, Trial], ys: list[dict[str, Trial]]) -> dict[str, Any]:
    """The union report by its definition: one :func:`classify` per id x pass."""
    out: dict[str, Any] = {
        "divergent": set(), "token_only": set(), "compared": set(), "skipped": set(),
        "rows": [], "per_pass": [],
    }  # fmt: skip
    for index, y in enumerate(ys):
        counts = {"divergent": 0, "token_only": 0, "clean": 0, "skipped": 0}
        for tid in sorted(x.keys() | y.keys()):
            xt, yt = x.get(tid), y.get(tid)
            outcome = classify(xt, yt)
            counts[outcome] += 1
            if outcome == "skipped":
                out["skipped"].add(tid)
                continue
            out["compared"].add(tid)
            if outcome == "divergent":
                out["divergent"].add(tid)
                kind = "missing" if xt is None or yt is None else "invariant"
                out["rows"].append((tid, index, kind))
                continue
            assert xt is not None and yt is not None
            if outcome == "token_only":
                out["token_only"].add(tid)
                out["rows"].append((tid, index, "token_only"))
        n = counts["divergent"] + counts["token_only"] + counts["clean"]
        out["per_pass"].append(
            (index, n, counts["divergent"], counts["token_only"], counts["skipped"])
        )
    out["token_only"] -= out["divergent"]
    return out


def observed(report: PairReport) -> dict[str, Any]:
    return {
        "divergent": set(report.divergent_ids),
        "token_only": set(report.token_divergence_ids),
        "compared": report.n_compared,
        "skipped": set(report.transport_skipped_ids),
        "rows": sorted((r.test_id, r.pass_index, r.kind) for r in report.per_id),
        "per_pass": [
            (p.index, p.n_compared, p.n_divergent, p.n_token_only, p.n_skipped)
            for p in report.per_pass
        ],
    }


@FAST
@given(arms())
def test_compare_fast_path_matches_classify_per_comparison(case: Any) -> None:
    x, ys = case
    report = compare("AC", x, list(enumerate(ys)))
    want = reference_compare(x, ys)
    want["compared"] = len(want["compared"])
    want["rows"] = sorted(want["rows"])
    assert observed(report) == want
    assert sum(g.n_compared for g in report.by_family.values()) == report.n_compared


def reference_depth(intervals: list[tuple[float, float]]) -> int:
    events = sorted(
        [(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s]
    )
    depth = best = 0
    for _, step in events:
        depth += step
        best = max(best, depth)
    return best


@FAST
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(-1, 4)).map(
            lambda p: (p[0] / 2, (p[0] + p[1]) / 2)
        ),
        max_size=12,
    )
)
def test_max_overlap_depth_matches_the_event_sweep(intervals: list[tuple[float, float]]) -> None:
    assert max_overlap_depth(intervals) == reference_depth(intervals)


@st.composite
def evidence(draw: st.DrawFn) -> CellEvidence:
    a = draw(trial_maps())
    passes = tuple(
        PassRecord(index=i, trials=draw(twins(a)), server_busy_max=2)
        for i in draw(st.lists(st.integers(0, 3), unique=True, min_size=1, max_size=3))
    )
    return CellEvidence(
        items=(), a=a, a_repeat=draw(st.one_of(st.none(), twins(a))), b=draw(twins(a)),
        c_passes=passes,
    )  # fmt: skip


def reference_arms(ev: CellEvidence) -> list[tuple[str, dict[str, Trial]]]:
    arms = [("A", dict(ev.a))]
    if ev.a_repeat is not None:
        arms.append(("A_repeat", dict(ev.a_repeat)))
    arms.append(("B", dict(ev.b)))
    arms += [(f"C[{p.index}]", dict(p.trials)) for p in sorted(ev.c_passes, key=lambda q: q.index)]
    return arms


@FAST
@given(evidence())
def test_gates_match_their_per_trial_definitions(ev: CellEvidence) -> None:
    ok = {tid for tid, t in ev.a.items() if t.is_ok}
    hot = sorted(
        (p.index, tid) for p in ev.c_passes for tid, t in p.trials.items() if t.is_ok and tid in ok
    )
    everything = {p.index: frozenset(p.trials) for p in ev.c_passes}
    assert list(hot_trials(ev.a, ev.c_passes, 0.0, everything)) == hot

    total = sum(len(set(ev.a) | set(p.trials)) for p in ev.c_passes)
    floor = completion_floor_gate(ev.a, ev.c_passes, GatePolicy())
    assert (floor.n_scored, floor.n_total) == (len(hot), total)

    transport: dict[str, int] = {}
    unreported: dict[str, int] = {}
    reused: dict[str, int] = {}
    for label, trials_ in reference_arms(ev):
        for t in trials_.values():
            if t.is_transport_failure:
                transport[label] = transport.get(label, 0) + 1
                continue
            cached = t.timings.get("cache_n")
            table = unreported if cached is None else reused if cached != 0 else None
            if table is not None:
                table[label] = table.get(label, 0) + 1
    assert dict(transport_gate(ev).counts) == transport
    cache = prompt_cache_gate(ev)
    assert (dict(cache.counts), dict(cache.unreported)) == (reused, unreported)
    assert list(cache.counts) == list(reused)
