"""Request intervals of one pass (pure): how many were open at once, which were co-batched.

Both work on columns (the starts and the ends) as numpy arrays, O(n log n): a pass of a large
cell holds 100,000 intervals, and a sort, a prefix maximum and a binary search over arrays
replace what would otherwise be a Python step per interval. The ``(start, end)`` pair forms are
kept for callers that hold pairs. Timestamps are float64 either way, so every comparison is
the one a Python float would make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Positions = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class SortedIntervals:
    """Intervals sorted by start: their positions in the caller's order, starts and ends."""

    order: Positions
    starts: Floats
    ends: Floats


def by_start(starts: Sequence[float], ends: Sequence[float]) -> SortedIntervals:
    """``starts`` and ``ends`` (one interval per position) sorted by start (stable: equal
    starts keep the caller's order)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    order = np.argsort(s, kind="stable")
    return SortedIntervals(order, s[order], e[order])


def depth(intervals: SortedIntervals) -> int:
    """Most intervals open at once. Touching intervals (one ends as the next starts) do not
    overlap: at equal times, ends are processed before starts. Empty intervals never count."""
    s, e = intervals.starts, intervals.ends
    real = e > s
    if not real.all():
        s, e = s[real], e[real]
    if s.size == 0:
        return 0
    # Just after the k-th start (0-based, sorted), k + 1 intervals have started and those
    # ending at or before it (ends first at equal times) have closed; the peak follows a start.
    closed = np.searchsorted(np.sort(e), s, side="right")
    return int((np.arange(1, s.size + 1) - closed).max())


def max_overlap_depth(intervals: Sequence[tuple[float, float]]) -> int:
    """:func:`depth` of ``(start, end)`` pairs."""
    return depth(by_start([s for s, _ in intervals], [e for _, e in intervals]))


def _reaches(overlaps: Floats, margin: float) -> Flags:
    """Whether each overlap is at least ``margin`` and more than zero."""
    reached: Flags = overlaps >= margin
    if margin <= 0:  # else at least the margin is more than zero already
        reached &= overlaps > 0
    return reached


def cobatched(intervals: SortedIntervals, margin: float) -> Flags:
    """For each interval, in start order, whether it overlaps some OTHER interval by at least
    ``margin`` (and by more than zero). With the intervals sorted by start:

    * an earlier-started partner exists iff ``min(e_i, prefix_max_end) - s_i >= margin``;
    * a later-started partner exists iff the next-started interval (in sort order) whose
      duration is at least ``margin`` starts at or before ``e_i - margin``: among later
      intervals long enough, the earliest start gives the largest overlap with ``i``.

    Any order among equal starts serves: such ties cannot change either test. Intervals
    shorter than ``margin`` can never count, as either side of a pair. The first test runs for
    all intervals; only those it leaves out get the second.
    """
    s, e = intervals.starts, intervals.ends
    long_enough = _reaches(e - s, margin)
    if s.size == 0:
        return long_enough
    # The latest end among the intervals sorted before each one (-inf for the first). For a
    # long-enough interval, min(e_i, that end) - s_i reaches the margin iff that end - s_i
    # does (subtracting s_i keeps the order of floats), so the min is left out.
    before = np.empty_like(e)
    before[0] = -np.inf
    np.maximum.accumulate(e[:-1], out=before[1:])
    flags = long_enough & _reaches(before - s, margin)
    pending = np.flatnonzero(long_enough & ~flags)  # long, no earlier partner
    if pending.size:
        # Each one's partner candidate: the next long-enough interval in start order.
        long_positions = np.flatnonzero(long_enough)
        at = np.searchsorted(long_positions, pending, side="right")
        has_next = at < long_positions.size
        pending, at = pending[has_next], at[has_next]
        j = long_positions[at]
        flags[pending] = _reaches(np.minimum(e[pending], e[j]) - s[j], margin)
    return flags


def cobatched_flags(intervals: Sequence[tuple[float, float]], margin: float) -> list[bool]:
    """For each ``(start, end)`` interval, whether :func:`cobatched` counts it."""
    ordered = by_start([s for s, _ in intervals], [e for _, e in intervals])
    flags = np.zeros(len(intervals), dtype=np.bool_)
    flags[ordered.order] = cobatched(ordered, margin)
    return [bool(f) for f in flags]
