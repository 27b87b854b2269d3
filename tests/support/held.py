"""The most a pass held at once, from its requests' client intervals (the tests' own reading,
independent of ``core.intervals``)."""

from __future__ import annotations

from collections.abc import Iterable


def peak_held(spans: Iterable[tuple[float | None, float | None, int]]) -> int:
    """The largest sum of the weights of the (dispatch, complete, weight) spans open at once;
    at equal times an end comes before a start (touching spans do not overlap)."""
    events: list[tuple[float, int]] = []
    for start, end, weight in spans:
        assert start is not None and end is not None
        events += [(start, weight), (end, -weight)]
    held = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        held += step
        peak = max(peak, held)
    return peak
