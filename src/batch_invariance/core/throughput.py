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

:func:`n_buys_words` says what N buys in words, for every view of a verdict (the banner, the
job summary, ``verify-cert``, the report): a GREEN whose concurrent throughput is not above
serial says that N buys nothing here. :func:`verdict_words` puts the verdict in front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batch_invariance.core.evidence import ARM_A, ARM_C

__all__ = [
    "NOT_MEASURED",
    "Throughput",
    "n_buys_words",
    "throughput_of_arms",
    "verdict_words",
]

#: The words for a cell without a throughput ratio.
NOT_MEASURED = "throughput not measured"


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


def n_buys_words(verdict: str, parallel: int, speedup: float | None) -> str:
    """What N buys, in words: ``N=4 buys 1.72x here``; a ratio of 1.0 or less says plainly
    that N buys nothing. A RED N is not safe: what it would buy is what staying serial costs.
    AMBER and UNVERIFIED have not shown N safe: what it would buy once shown."""
    if speedup is None:
        return NOT_MEASURED
    ratio = f"{speedup:.2f}x"
    n = f"N={parallel}"
    slower = speedup <= 1.0
    not_faster = "concurrent is not faster than serial, so"
    if verdict == "GREEN":
        if slower:
            return f"{n} buys {ratio} here: {not_faster} {n} buys nothing here"
        return f"{n} buys {ratio} here"
    if verdict == "RED":
        if slower:
            return f"{n} would buy {ratio} here: {not_faster} staying serial costs nothing"
        return f"{n} would buy {ratio} here; staying serial costs this"
    if slower:
        return f"{n} would buy {ratio} here if shown safe: {not_faster} it would buy nothing"
    return f"{n} would buy {ratio} here if shown safe"


def verdict_words(verdict: str, parallel: int, speedup: float | None) -> str:
    """The verdict and what N buys: ``GREEN: N=4 buys 0.90x here: concurrent is not faster
    than serial, so N=4 buys nothing here``."""
    return f"{verdict}: {n_buys_words(verdict, parallel, speedup)}"
