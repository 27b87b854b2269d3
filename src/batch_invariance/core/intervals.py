"""Request intervals of one pass (pure): how many were open at once, which were co-batched.

Both work on columns (the starts and the ends), O(n log n), with the per-interval work in
C-level maps; the ``(start, end)`` pair forms are kept for callers that hold pairs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, compress, repeat
from operator import and_, ge, gt, le, not_, sub


def overlap_depth(starts: Sequence[float], ends: Sequence[float]) -> int:
    """Most intervals open at once. Touching intervals (one ends as the next starts) do not
    overlap: at equal times, ends are processed before starts. Empty intervals never count."""
    real = list(map(not_, map(le, ends, starts)))
    if False in real:
        starts, ends = list(compress(starts, real)), list(compress(ends, real))
    s, e = sorted(starts), sorted(ends)
    # Just after the k-th start (0-based, sorted), k + 1 intervals have started and those
    # ending at or before it (ends first at equal times) have closed; the peak follows a start.
    closed = map(bisect_right, repeat(e), s)
    return max(map(sub, range(1, len(s) + 1), closed), default=0)


def max_overlap_depth(intervals: Sequence[tuple[float, float]]) -> int:
    """:func:`overlap_depth` of ``(start, end)`` pairs."""
    return overlap_depth([s for s, _ in intervals], [e for _, e in intervals])


def _reaches(overlaps: Sequence[float], margin: float) -> list[bool]:
    """Whether each overlap is at least ``margin`` and more than zero."""
    return list(map(and_, map(ge, overlaps, repeat(margin)), map(gt, overlaps, repeat(0))))


def cobatched_members(starts: Sequence[float], ends: Sequence[float], margin: float) -> list[int]:
    """Positions of the intervals that overlap some OTHER interval by at least ``margin``
    (and by more than zero). Sorted by start (ties by end, then position):

    * an earlier-started partner exists iff ``min(e_i, prefix_max_end) - s_i >= margin``;
    * a later-started partner exists iff the next-started interval (in sort order) whose
      duration is at least ``margin`` starts at or before ``e_i - margin``: among later
      intervals long enough, the earliest start gives the largest overlap with ``i``.

    Intervals shorter than ``margin`` can never count, as either side of a pair. The first
    test runs for all intervals at once; only those it leaves out get the second, one by one.
    """
    n = len(starts)
    spans = list(zip(starts, ends, strict=True))
    # A stable sort on (start, end) orders ties by position, as (start, end, position) would.
    order = sorted(range(n), key=spans.__getitem__)
    s = list(map(starts.__getitem__, order))
    e = list(map(ends.__getitem__, order))
    long_enough = _reaches(list(map(sub, e, s)), margin)
    # The latest end among the intervals sorted before each one (-inf for the first).
    before = accumulate(e, max, initial=-math.inf)
    flags = list(map(and_, long_enough, _reaches(list(map(sub, map(min, e, before), s)), margin)))
    pending = list(compress(range(n), map(gt, long_enough, flags)))  # long, no earlier partner
    if pending:
        long_positions = list(compress(range(n), long_enough))
        for k in pending:
            at = bisect_right(long_positions, k)
            if at < len(long_positions):
                j = long_positions[at]
                overlap = min(e[k], e[j]) - s[j]
                flags[k] = overlap >= margin and overlap > 0
    return list(compress(order, flags))


def cobatched_flags(intervals: Sequence[tuple[float, float]], margin: float) -> list[bool]:
    """For each ``(start, end)`` interval, whether :func:`cobatched_members` counts it."""
    flags = [False] * len(intervals)
    for position in cobatched_members([s for s, _ in intervals], [e for _, e in intervals], margin):
        flags[position] = True
    return flags
