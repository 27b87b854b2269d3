"""Reading engines' Prometheus text: the busy witnesses and cache counters they expose.

vLLM and SGLang report how many requests they are running as gauges on ``/metrics``; that is
the server-side evidence F1 needs that requests were co-batched. The text is read by the one
Prometheus parser (:mod:`batch_invariance.engines.prometheus`). Several series of one metric
(one per engine or model label set) are summed: the server as a whole was running that many.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from batch_invariance.engines.probes import BusyProbe
from batch_invariance.engines.prometheus import MetricSample, metric_total, parse_prometheus

#: The parser's names stay importable here, where engine code has always read them.
__all__ = [
    "Histogram",
    "MetricSample",
    "counters",
    "gauge_probe",
    "gauge_reader",
    "histogram",
    "metric_total",
    "parse_prometheus",
    "step_totals_reader",
]


def gauge_reader(name: str) -> Callable[[Any], int | None]:
    """A :class:`BusyProbe` reader: the summed value of gauge ``name`` in a ``/metrics`` body."""

    def read(body: Any) -> int | None:
        if not isinstance(body, str):
            return None
        total = metric_total(parse_prometheus(body), name)
        return None if total is None else int(total)

    return read


def gauge_probe(label: str, metrics_url: str, name: str) -> BusyProbe:
    """A busy witness polling gauge ``name`` at ``metrics_url``."""
    return BusyProbe(label, metrics_url, "text", gauge_reader(name))


def counters(text: str, names: Iterable[str]) -> dict[str, float]:
    """The totals of those of ``names`` present in ``text`` (cache counters for the cert)."""
    samples = parse_prometheus(text)
    out: dict[str, float] = {}
    for name in names:
        total = metric_total(samples, name)
        if total is not None:
            out[name] = total
    return out


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over its series: cumulative bucket counts by ``le``."""

    buckets: Mapping[float, float]
    count: float
    total: float

    def share_above(self, bound: float) -> float | None:
        """The share of observations larger than ``bound`` (``None`` with no observations)."""
        if self.count <= 0:
            return None
        at_or_below = max((c for le, c in self.buckets.items() if le <= bound), default=0.0)
        return (self.count - at_or_below) / self.count


def histogram(text: str, name: str) -> Histogram | None:
    """Histogram ``name`` (its ``_bucket``/``_count``/``_sum`` series); ``None`` when absent."""
    samples = parse_prometheus(text)
    count = metric_total(samples, name + "_count")
    if count is None:
        return None
    buckets: dict[float, float] = {}
    for s in samples:
        if s.name == name + "_bucket" and "le" in s.labels:
            try:
                le = float(s.labels["le"])
            except ValueError:
                continue
            buckets[le] = buckets.get(le, 0.0) + s.value
    return Histogram(buckets, count, metric_total(samples, name + "_sum") or 0.0)


def step_totals_reader(name: str) -> Callable[[str], dict[str, float] | None]:
    """A ``PassCounter`` reader for a tokens-per-step histogram such as
    ``vllm:iteration_tokens_total``: engine ``steps`` (observations), the ``tokens`` they
    carried (the sum) and ``steps_over_1_token`` (observations above the ``le="1"`` bucket,
    i.e. steps that did more than one sequence's single decode token). ``None`` when the
    histogram is not exported."""

    def read(body: str) -> dict[str, float] | None:
        found = histogram(body, name)
        if found is None:
            return None
        over = found.share_above(1.0)
        return {
            "steps": found.count,
            "tokens": found.total,
            "steps_over_1_token": 0.0 if over is None else over * found.count,
        }

    return read
