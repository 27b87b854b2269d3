"""What invariance costs: throughput of the serial arm A against the concurrent C passes.

Pure. The input is the per-arm records the driver writes into the cert's provenance
(``provenance.arms``: one record per arm or C pass with ``arm``, ``wall_s``, ``n_requests``,
``server_predicted_ms`` and ``server_predicted_n``), so :func:`throughput_of_arms` gives the
same block when the cert is built and when it is re-derived from its own JSON.

* Tokens are counted as the server reported them (``timings.predicted_n``).
* ``serial_tokens_per_s``: arm A's tokens over arm A's wall-clock time: what one request at a
  time delivers (``--parallel 1``).
* ``concurrent_tokens_per_s``: the C passes' tokens over their wall-clock time: what N
  requests at once deliver. Per-request server times overlap there, so wall-clock is the
  only fair denominator, and it is used for both sides.
* ``serial_decode_tokens_per_s``: arm A's tokens over the server's own decode time
  (``predicted_ms``), the rate without HTTP and prompt processing.
* ``speedup``: concurrent over serial tokens/s, what N buys; for a RED cell, what staying
  serial costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batch_invariance.core.evidence import ARM_A, ARM_C

__all__ = [
    "Throughput",
    "throughput_of_arms",
]


@dataclass(frozen=True)
class Throughput:
    """The cert's ``throughput`` block (``None`` where the arm reported nothing usable)."""

    serial_tokens_per_s: float | None
    concurrent_tokens_per_s: float | None
    speedup: float | None
    serial_requests_per_s: float | None
    concurrent_requests_per_s: float | None
    serial_decode_tokens_per_s: float | None
    serial_tokens: int
    concurrent_tokens: int


@dataclass(frozen=True)
class _Totals:
    wall_s: float
    n_requests: int
    tokens: int
    predicted_ms: float


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if value == value and value >= 0 else 0.0


def _totals(records: Sequence[Mapping[str, Any]], arm: str) -> _Totals:
    mine = [r for r in records if r.get("arm") == arm]
    return _Totals(
        wall_s=sum(_number(r.get("wall_s")) for r in mine),
        n_requests=int(sum(_number(r.get("n_requests")) for r in mine)),
        tokens=int(sum(_number(r.get("server_predicted_n")) for r in mine)),
        predicted_ms=sum(_number(r.get("server_predicted_ms")) for r in mine),
    )


def _rate(amount: float, seconds: float) -> float | None:
    return round(amount / seconds, 3) if amount > 0 and seconds > 0 else None


def throughput_of_arms(records: Any) -> Throughput | None:
    """The throughput block for the arm records, or ``None`` when they are not a list of
    records (a cert written without them)."""
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        return None
    rows = [r for r in records if isinstance(r, Mapping)]
    serial = _totals(rows, ARM_A)
    concurrent = _totals(rows, ARM_C)
    serial_tps = _rate(serial.tokens, serial.wall_s)
    concurrent_tps = _rate(concurrent.tokens, concurrent.wall_s)
    speedup = (
        round(concurrent_tps / serial_tps, 3)
        if serial_tps is not None and concurrent_tps is not None
        else None
    )
    return Throughput(
        serial_tokens_per_s=serial_tps,
        concurrent_tokens_per_s=concurrent_tps,
        speedup=speedup,
        serial_requests_per_s=_rate(serial.n_requests, serial.wall_s),
        concurrent_requests_per_s=_rate(concurrent.n_requests, concurrent.wall_s),
        serial_decode_tokens_per_s=_rate(serial.tokens, serial.predicted_ms / 1000.0),
        serial_tokens=serial.tokens,
        concurrent_tokens=concurrent.tokens,
    )
