"""Request intervals of one pass (pure): how many were open at once, which were co-batched.

Both work on columns (the starts and the ends), O(n log n), with the per-interval work in
C-level maps; the ``(start, end)`` pair forms are kept for callers that hold pairs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import and_, ge, gt, le, not_, sub


@dataclass(frozen=True, slots=True)
class SortedIntervals:
    """Intervals sorted by start: their positions in the caller's order, starts and ends."""

    order: list[int]
    starts: list[float]
    ends: list[float]


def by_start(starts: Sequence[float], ends: Sequence[float]) -> SortedIntervals:
    """``starts`` and ``ends`` (one interval per position) sorted by start."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    return SortedIntervals(
        order, list(map(starts.__getitem__, order)), list(map(ends.__getitem__, order))
    )


def depth(intervals: SortedIntervals) -> int:
    """Most intervals open at once. Touching intervals (one ends as the next starts) do not
    overlap: at equal times, ends are processed before starts. Empty intervals never count."""
    s, e = intervals.starts, intervals.ends
    empty = list(map(le, e, s))
    if True in empty:
        real = list(map(not_, empty))
        s, e = list(compress(s, real)), list(compress(e, real))
    e = sorted(e)
    # Just after the k-th start (0-based, sorted), k + 1 intervals have started and those
    # ending at or before it (ends first at equal times) have closed; the peak follows a start.
    closed = map(bisect_right, repeat(e), s)
    return max(map(sub, range(1, len(s) + 1), closed), default=0)


def max_overlap_depth(intervals: Sequence[tuple[float, float]]) -> int:
    """:func:`depth` of ``(start, end)`` pairs."""
    return depth(by_start([s for s, _ in intervals], [e for _, e in intervals]))


def _reaches(overlaps: Sequence[float], margin: float) -> list[bool]:
    """Whether each overlap is at least ``margin`` and more than zero."""
    if margin > 0:  # then at least the margin is more than zero
        return list(map(ge, overlaps, repeat(margin)))
    return list(map(and_, map(ge, overlaps, repeat(margin)), map(gt, overlaps, repeat(0))))


def cobatched(intervals: SortedIntervals, margin: float) -> list[bool]:
    """For each interval, in start order, whether it overlaps some OTHER interval by at least
    ``margin`` (and by more than zero). With the intervals sorted by start:

    * an earlier-started partner exists iff ``min(e_i, prefix_max_end) - s_i >= margin``;
    * a later-started partner exists iff the next-started interval (in sort order) whose
      duration is at least ``margin`` starts at or before ``e_i - margin``: among later
      intervals long enough, the earliest start gives the largest overlap with ``i``.

    Any order among equal starts serves: such ties cannot change either test. Intervals
    shorter than ``margin`` can never count, as either side of a pair. The first test runs for
    all intervals at once; only those it leaves out get the second, one by one.
    """
    s, e = intervals.starts, intervals.ends
    n = len(s)
    long_enough = _reaches(list(map(sub, e, s)), margin)
    # The latest end among the intervals sorted before each one (-inf for the first). For a
    # long-enough interval, min(e_i, that end) - s_i reaches the margin iff that end - s_i
    # does (subtracting s_i keeps the order of floats), so the min is left out.
    before = accumulate(e, max, initial=-math.inf)
    flags = list(map(and_, long_enough, _reaches(list(map(sub, before, s)), margin)))
    pending = list(compress(range(n), map(gt, long_enough, flags)))  # long, no earlier partner
    if pending:
        long_positions = list(compress(range(n), long_enough))
        for k in pending:
            at = bisect_right(long_positions, k)
            if at < len(long_positions):
                j = long_positions[at]
                overlap = min(e[k], e[j]) - s[j]
                flags[k] = overlap >= margin and overlap > 0
    return flags


def cobatched_flags(intervals: Sequence[tuple[float, float]], margin: float) -> list[bool]:
    """For each ``(start, end)`` interval, whether :func:`cobatched` counts it."""
    ordered = by_start([s for s, _ in intervals], [e for _, e in intervals])
    flags = [False] * len(intervals)
    for position in compress(ordered.order, cobatched(ordered, margin)):
        flags[position] = True
    return flags
