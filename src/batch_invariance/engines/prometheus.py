"""The one Prometheus text parser (pure): a ``/metrics`` body in, typed samples out.

llama-server's busy gauge (:mod:`batch_invariance.engines.llama_server.probes`) and other engines'
gauges, counters and histograms (:mod:`batch_invariance.engines.witness`) are all read through it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["MetricSample", "metric_total", "parse_prometheus"]

# name{labels} value [timestamp]; label values may hold escaped quotes and spaces.
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class MetricSample:
    """One sample line of Prometheus text."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_prometheus(text: str) -> tuple[MetricSample, ...]:
    """Every finite sample in ``text``; comments, blank and malformed lines are skipped."""
    out: list[MetricSample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append(MetricSample(m.group("name"), labels, value))
    return tuple(out)


def metric_total(samples: Iterable[MetricSample], name: str) -> float | None:
    """The sum of every series of ``name``; ``None`` when the metric is absent."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None
