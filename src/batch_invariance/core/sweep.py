"""The sweep's own rules (pure): the largest safe N, and where divergence starts.

* :func:`max_safe_parallel`: the largest N whose cert is promotable GREEN with every smaller
  N of the sweep promotable GREEN too; an N that was not run (refused by the memory guard)
  breaks the chain like any other non-GREEN cell. ``None`` when the smallest N is not GREEN.
* :func:`max_safe_faster_parallel`: the largest of those safe N whose concurrent throughput is
  above serial (``speedup`` > 1.0): the largest N that is both safe and faster than N=1.
  ``None`` when no safe N is faster (or none measured its throughput).
* :func:`median_first_divergence`: the median, over divergent ids, of the first token where
  an id's C answer left A's (its earliest over the passes).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "SweepPoint",
    "max_safe_faster_parallel",
    "max_safe_parallel",
    "median_first_divergence",
]


@dataclass(frozen=True)
class SweepPoint:
    """One N of a sweep as the rule reads it."""

    parallel: int
    #: The cert is GREEN and promotable (``False`` for an N that did not run).
    promotable_green: bool
    #: The cert's ``throughput.speedup`` (concurrent over serial), ``None`` when not measured.
    speedup: float | None = None


def _safe_chain(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The smallest N up, as long as each is promotable GREEN."""
    chain: list[SweepPoint] = []
    for point in sorted(points, key=lambda p: p.parallel):
        if not point.promotable_green:
            break
        chain.append(point)
    return chain


def max_safe_parallel(points: Sequence[SweepPoint]) -> int | None:
    """The largest N with itself and every smaller N promotable GREEN (see module text)."""
    chain = _safe_chain(points)
    return chain[-1].parallel if chain else None


def max_safe_faster_parallel(points: Sequence[SweepPoint]) -> int | None:
    """The largest safe N (as :func:`max_safe_parallel` decides) faster than serial."""
    faster = [p.parallel for p in _safe_chain(points) if p.speedup is not None and p.speedup > 1]
    return faster[-1] if faster else None


def median_first_divergence(rows: Iterable[tuple[str, int | None]]) -> float | None:
    """``rows`` are (test_id, first divergent token) per divergent comparison; ``None`` when no
    position is known."""
    earliest: dict[str, int] = {}
    for test_id, position in rows:
        if position is None:
            continue
        earliest[test_id] = min(position, earliest.get(test_id, position))
    if not earliest:
        return None
    return float(statistics.median(earliest.values()))
