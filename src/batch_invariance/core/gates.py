"""The anti-vacuity gates (pure): what must hold before a clean comparison may be GREEN.

A clean A/C comparison proves nothing unless requests really shared batches, enough of them
were genuinely scored, and nothing got in the way. Each gate here returns a small frozen
record with ``ok`` and a one-line ``reason``; :mod:`batch_invariance.core.verdict` combines them.
Every gate fails closed: missing evidence (no passes, no server signal, a missing interval)
counts as "not met", never as "met".

* F1 overlap - in EVERY C pass the client intervals reach depth >= 2 AND the server itself
  reported >= 2 busy slots (``PassRecord.server_busy_max``).
* F2 completion floor - at least ``completion_floor`` of the id x pass comparisons are
  genuinely scored (``failure_mode == "ok"``) in both A and that C pass.
* F3 co-batch coverage - per pass, from that pass's own intervals: at least
  ``max(2, ceil(coverage_fraction x ids))`` ids overlap another request of the pass by at
  least ``overlap_margin_s``; any trial without an interval fails the pass.
* transport - no transport failure in any arm.
* prompt cache - every answered trial reported ``cache_n == 0`` (unreported fails).

How much a clean result covers (sample size, per-prompt bound, answer length) is in
:mod:`batch_invariance.core.sample`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import compress, repeat
from operator import attrgetter, is_, methodcaller, ne, sub

from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    OK,
    TRANSPORT_MODES,
    CellEvidence,
    GatePolicy,
    PassRecord,
    Trial,
)

#: Both the client-side overlap depth and the server's busy slots must reach this.
REQUIRED_DEPTH = 2


def exact_fraction(value: float) -> Fraction:
    """An exact fraction for a policy threshold (0.8 is 4/5, not 0.8000000000000000444)."""
    return Fraction(repr(float(value)))


# --------------------------------------------------------------------------- intervals


def max_overlap_depth(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at once. Touching intervals (one ends as the next starts) do not
    overlap: at equal times, ends are processed before starts. O(n log n)."""
    real = [(start, end) for start, end in intervals if not end <= start]
    starts = sorted(start for start, _ in real)
    ends = sorted(end for _, end in real)
    # Just after the k-th start (0-based, sorted), k + 1 intervals have started and those
    # ending at or before it (ends first at equal times) have closed; the peak follows a start.
    closed = map(bisect_right, repeat(ends), starts)
    return max(map(sub, range(1, len(starts) + 1), closed), default=0)


def cobatched_flags(intervals: Sequence[tuple[float, float]], margin: float) -> list[bool]:
    """For each interval, whether it overlaps some OTHER interval by at least ``margin``
    (and by more than zero). O(n log n): sort by start, then

    * an earlier-started partner exists iff ``min(e_i, prefix_max_end) - s_i >= margin``;
    * a later-started partner exists iff the next-started interval (in sort order) whose
      duration is at least ``margin`` starts at or before ``e_i - margin``: among later
      intervals long enough, the earliest start gives the largest overlap with ``i``.

    Intervals shorter than ``margin`` can never count, as either side of a pair.
    """
    n = len(intervals)
    # A stable sort on (start, end) orders ties by index, as (start, end, index) would.
    order = sorted(range(n), key=intervals.__getitem__)
    starts = [intervals[i][0] for i in order]
    ends = [intervals[i][1] for i in order]
    flags_sorted = [False] * n
    long_enough = [(d := e - s) >= margin and d > 0 for s, e in zip(starts, ends, strict=True)]

    # Backward scan: index of the next (in sort order) long-enough interval after k.
    next_long: list[int | None] = [None] * n
    following: int | None = None
    for k in range(n - 1, -1, -1):
        next_long[k] = following
        if long_enough[k]:
            following = k

    prefix_max_end = -math.inf
    for k in range(n):
        s, e = starts[k], ends[k]
        if long_enough[k]:
            overlap = (prefix_max_end if prefix_max_end < e else e) - s  # min(e, prefix_max_end)
            if overlap >= margin and overlap > 0:
                flags_sorted[k] = True
            else:
                j = next_long[k]
                if j is not None:
                    overlap = min(e, ends[j]) - starts[j]
                    if overlap >= margin and overlap > 0:
                        flags_sorted[k] = True
        if e > prefix_max_end:
            prefix_max_end = e

    flags = [False] * n
    for k, original in enumerate(order):
        flags[original] = flags_sorted[k]
    return flags


#: A trial's request interval (dispatch, completion); either may be ``None``.
_SPAN = attrgetter("dispatch_ts", "complete_ts")


_FAILURE_MODE = attrgetter("failure_mode")
_CACHE_N = methodcaller("get", "cache_n")
_TIMINGS = attrgetter("timings")


def ok_ids(trials: Mapping[str, Trial]) -> set[str]:
    """Ids whose trial was genuinely scored (``failure_mode == "ok"``)."""
    return set(compress(trials.keys(), map(OK.__eq__, map(_FAILURE_MODE, trials.values()))))


def transport_ids(trials: Mapping[str, Trial]) -> set[str]:
    """Ids whose trial is a transport failure."""
    modes = map(_FAILURE_MODE, trials.values())
    return set(compress(trials.keys(), map(TRANSPORT_MODES.__contains__, modes)))


def cobatched_ids(pass_record: PassRecord, margin: float) -> frozenset[str]:
    """Ids of the pass whose interval overlaps another of the same pass by ``margin``.

    Trials without an interval are ignored here (they can never be attributed); the coverage
    gate fails such a pass closed separately.
    """
    timed = [
        (test_id, span)
        for test_id, span in zip(
            pass_record.trials.keys(), map(_SPAN, pass_record.trials.values()), strict=True
        )
        if None not in span
    ]
    ids = [test_id for test_id, _ in timed]
    spans = [span for _, span in timed]
    flags = cobatched_flags(spans, margin)
    return frozenset(i for i, f in zip(ids, flags, strict=True) if f)


# --------------------------------------------------------------------------- F1 overlap


@dataclass(frozen=True)
class PassOverlap:
    index: int
    client_max_depth: int
    server_busy_max: int | None
    busy_source: str
    ok: bool


@dataclass(frozen=True)
class OverlapGate:
    ok: bool
    required_depth: int
    per_pass: tuple[PassOverlap, ...]
    reason: str


def overlap_gate(passes: Sequence[PassRecord]) -> OverlapGate:
    """F1: every pass shows client depth >= 2 and server busy slots >= 2."""
    rows: list[PassOverlap] = []
    for p in sorted(passes, key=lambda q: q.index):
        spans = [span for span in map(_SPAN, p.trials.values()) if None not in span]
        depth = max_overlap_depth(spans)
        busy = p.server_busy_max
        ok = depth >= REQUIRED_DEPTH and busy is not None and busy >= REQUIRED_DEPTH
        rows.append(PassOverlap(p.index, depth, busy, p.busy_source, ok))
    if not rows:
        return OverlapGate(False, REQUIRED_DEPTH, (), "F1 overlap not met: no C pass ran")
    bad = [r for r in rows if not r.ok]
    if not bad:
        return OverlapGate(
            True,
            REQUIRED_DEPTH,
            tuple(rows),
            f"F1 overlap met in all {len(rows)} pass(es) (client depth and server busy >= 2)",
        )
    first = bad[0]
    busy_text = "no server signal" if first.server_busy_max is None else first.server_busy_max
    return OverlapGate(
        False,
        REQUIRED_DEPTH,
        tuple(rows),
        f"F1 overlap not met in {len(bad)} of {len(rows)} pass(es); pass {first.index}: "
        f"client depth {first.client_max_depth}, server busy {busy_text} (need both >= 2)",
    )


# --------------------------------------------------------------------------- F2 floor


@dataclass(frozen=True)
class FloorGate:
    ok: bool
    required: float
    observed: float | None
    n_scored: int
    n_total: int
    reason: str


def completion_floor_gate(
    a: Mapping[str, Trial], passes: Sequence[PassRecord], policy: GatePolicy
) -> FloorGate:
    """F2: the share of id x pass comparisons scored ``ok`` in both A and the pass."""
    total = scored = 0
    a_ok = ok_ids(a)
    for p in passes:
        total += len(a.keys() | p.trials.keys())
        scored += len(a_ok & ok_ids(p.trials))
    required = policy.completion_floor
    if total == 0:
        return FloorGate(False, required, None, 0, 0, "F2 completion floor not met: no trials")
    observed = scored / total
    ok = Fraction(scored, total) >= exact_fraction(required)
    verb = "met" if ok else "not met"
    return FloorGate(
        ok,
        required,
        observed,
        scored,
        total,
        f"F2 completion floor {verb}: {scored}/{total} comparisons scored ok in both A and C "
        f"(need >= {required:.0%})",
    )


# --------------------------------------------------------------------------- F3 coverage


@dataclass(frozen=True)
class PassCoverage:
    index: int
    n_ids: int
    n_cobatched: int
    required: int
    missing_intervals: int
    ok: bool


@dataclass(frozen=True)
class CoverageGate:
    ok: bool
    margin_s: float
    fraction: float
    per_pass: tuple[PassCoverage, ...]
    reason: str


def required_cobatched(n_ids: int, fraction: float) -> int:
    """``max(2, ceil(fraction x n_ids))``, computed exactly."""
    return max(REQUIRED_DEPTH, math.ceil(exact_fraction(fraction) * n_ids))


def cobatched_by_pass(passes: Sequence[PassRecord], margin: float) -> dict[int, frozenset[str]]:
    """:func:`cobatched_ids` for every pass, keyed by pass index (computed once, shared)."""
    return {p.index: cobatched_ids(p, margin) for p in passes}


def coverage_gate(
    passes: Sequence[PassRecord],
    policy: GatePolicy,
    cobatched: Mapping[int, frozenset[str]] | None = None,
) -> CoverageGate:
    """F3: per pass, enough ids co-batched with a real margin; a missing interval fails.
    ``cobatched`` may pass in :func:`cobatched_by_pass` already computed for ``passes``."""
    margin = policy.overlap_margin_s
    co_sets = cobatched if cobatched is not None else cobatched_by_pass(passes, margin)
    rows: list[PassCoverage] = []
    for p in sorted(passes, key=lambda q: q.index):
        n_ids = len(p.trials)
        missing = sum(
            1 for t in p.trials.values() if t.dispatch_ts is None or t.complete_ts is None
        )
        n_co = len(co_sets[p.index])
        required = required_cobatched(n_ids, policy.coverage_fraction)
        ok = missing == 0 and n_co >= required
        rows.append(PassCoverage(p.index, n_ids, n_co, required, missing, ok))
    if not rows:
        return CoverageGate(
            False, margin, policy.coverage_fraction, (), "F3 coverage not met: no C pass ran"
        )
    bad = [r for r in rows if not r.ok]
    if not bad:
        worst = min(rows, key=lambda r: (r.n_cobatched - r.required, r.index))
        return CoverageGate(
            True,
            margin,
            policy.coverage_fraction,
            tuple(rows),
            f"F3 co-batch coverage met in all {len(rows)} pass(es) "
            f"(lowest: pass {worst.index}, {worst.n_cobatched}/{worst.n_ids} ids, "
            f"need {worst.required})",
        )
    first = bad[0]
    if first.missing_intervals:
        detail = (
            f"pass {first.index}: {first.missing_intervals} trial(s) have no request interval "
            "so co-batching cannot be attributed"
        )
    else:
        detail = (
            f"pass {first.index}: {first.n_cobatched}/{first.n_ids} ids co-batched by "
            f">= {margin * 1000:g} ms, need {first.required}"
        )
    return CoverageGate(
        False,
        margin,
        policy.coverage_fraction,
        tuple(rows),
        f"F3 co-batch coverage not met in {len(bad)} of {len(rows)} pass(es); {detail}",
    )


# --------------------------------------------------------------------------- transport


@dataclass(frozen=True)
class TransportGate:
    ok: bool
    #: Transport failures per arm label ("A", "A_repeat", "B", "C[k]"), only non-zero ones.
    counts: Mapping[str, int]
    ids: tuple[str, ...]
    reason: str


def _arms(evidence: CellEvidence) -> list[tuple[str, Mapping[str, Trial]]]:
    """Every arm's trials with its label ("A", "A_repeat", "B", "C[k]"), in a fixed order."""
    arms: list[tuple[str, Mapping[str, Trial]]] = [(ARM_A, evidence.a)]
    if evidence.a_repeat is not None:
        arms.append((ARM_A_REPEAT, evidence.a_repeat))
    arms.append((ARM_B, evidence.b))
    for p in sorted(evidence.c_passes, key=lambda q: q.index):
        arms.append((f"{ARM_C}[{p.index}]", p.trials))
    return arms


def transport_gate(evidence: CellEvidence) -> TransportGate:
    """No transport failure anywhere. They are never divergence, but they make GREEN
    impossible: a comparison that could not be made is not a clean one."""
    arms = _arms(evidence)
    counts: dict[str, int] = {}
    ids: set[str] = set()
    modes: set[str] = set()
    for label, trials in arms:
        failed = transport_ids(trials)
        if failed:
            counts[label] = len(failed)
            ids |= failed
            modes.update(trials[test_id].failure_mode for test_id in failed)
    if not counts:
        return TransportGate(True, {}, (), "transport: no transport failures in any arm")
    where = _per_arm(counts)
    return TransportGate(
        False,
        counts,
        tuple(sorted(ids)),
        f"transport failures ({', '.join(sorted(modes))}) in {where}; they are not divergence "
        "but leave comparisons unmade, so GREEN is impossible",
    )


# --------------------------------------------------------------------------- prompt cache


@dataclass(frozen=True)
class PromptCacheGate:
    ok: bool
    #: Trials per arm label whose server reported ``timings.cache_n > 0``.
    counts: Mapping[str, int]
    ids: tuple[str, ...]
    reason: str
    #: Answered trials per arm label whose server reported no ``cache_n`` at all.
    unreported: Mapping[str, int] = field(default_factory=dict)


def _per_arm(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items())


def prompt_cache_gate(evidence: CellEvidence) -> PromptCacheGate:
    """Every answered request must have evaluated its whole prompt: the server reported
    ``cache_n == 0``. A reused KV prefix means the arms did not compute the same thing, and a
    server that does not report ``cache_n`` leaves that unproven; either makes GREEN
    impossible. Transport failures are left to the transport gate."""
    counts: dict[str, int] = {}
    unreported: dict[str, int] = {}
    ids: set[str] = set()
    for label, trials in _arms(evidence):
        keys = list(trials.keys())
        cached = list(map(_CACHE_N, map(_TIMINGS, trials.values())))
        answered = set(keys) - transport_ids(trials)
        silent = answered.intersection(compress(keys, map(is_, cached, repeat(None))))
        # ``ne`` also selects None; those are the silent ones, counted apart.
        reused = answered.intersection(compress(keys, map(ne, cached, repeat(0)))) - silent
        if silent:
            unreported[label] = len(silent)
        if reused:
            counts[label] = len(reused)
        ids |= silent | reused
    if not counts and not unreported:
        return PromptCacheGate(
            True, {}, (), "prompt cache: every trial reported cache_n 0 (whole prompts evaluated)"
        )
    if counts:
        reason = (
            f"prompt cache: the server reused cached prompt tokens (cache_n > 0) in "
            f"{_per_arm(counts)} despite cache_prompt=false, so the arms did not compute the "
            "same thing; GREEN is impossible"
        )
    else:
        reason = (
            f"prompt cache: the server did not report timings.cache_n for "
            f"{_per_arm(unreported)} trial(s), so a reused prompt cache cannot be ruled out; "
            "GREEN is impossible"
        )
    return PromptCacheGate(False, counts, tuple(sorted(ids)), reason, unreported)
