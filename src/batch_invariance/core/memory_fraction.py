"""The share of a memory node an engine that reserves memory up front must be given (pure).

vLLM's CPU backend reserves ``ceil(total x fraction)`` bytes of its memory node at start
(``--gpu-memory-utilization``, default 0.92), refuses to start when that is more than the
node has available, and gives the KV cache whatever the reservation leaves after its own
resident set (see :mod:`batch_invariance.engines.vllm` for the source). So the fraction must
be at least what the cell needs (weights, KV for N x ctx, runtime) over the node's total, and
at most what is available over the total. :func:`size_fraction` sizes it, or checks the value
the user gave, and names the problem before anything is launched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MARGIN", "FractionDecision", "size_fraction"]

#: Headroom over the projection: the runtime allowance is measured on one host and the
#: per-token KV size is already an upper bound, so 25% more keeps the sized value from
#: failing on a host whose runtime is a little larger, while still reserving far less
#: than vLLM's 0.92.
MARGIN = 1.25
_GIB = 1024**3


def _hundredths_up(x: float) -> float:
    """``x`` rounded up to 0.01 (the value written on the command line)."""
    return math.ceil(round(x * 100, 6)) / 100


def _hundredths_down(x: float) -> float:
    return math.floor(round(x * 100, 6)) / 100


def _gib(n: float) -> str:
    return f"{n / _GIB:.2f} GiB"


@dataclass(frozen=True)
class FractionDecision:
    """The fraction a server is launched with, and the guard's refusal (``None``: it fits)."""

    #: What the server gets: the user's value where given, else the sized one.
    fraction: float
    #: Whether the fraction came from the user's own flag (then it is checked, not sized).
    given: bool
    #: The sized value: the projection with :data:`MARGIN`, over the node's total.
    sized: float
    need_bytes: int
    total_bytes: int
    available_bytes: int
    refusal: str | None

    @property
    def reserved_bytes(self) -> int:
        """What the engine reserves with :attr:`fraction` (its own rounding: up)."""
        return math.ceil(self.total_bytes * self.fraction)


def size_fraction(
    need_bytes: int,
    total_bytes: int,
    available_bytes: int,
    given: float | None = None,
    *,
    flag: str = "--gpu-memory-utilization",
    need_text: str = "",
) -> FractionDecision:
    """The fraction of a node of ``total_bytes`` (``available_bytes`` free as the engine
    counts it) that holds ``need_bytes``; ``given`` (the user's value) wins but is checked.

    Refused: a sized value over 1 (the node is too small), a given value that reserves less
    than ``need_bytes``, and any value that reserves more than is available (the engine
    would exit at start). ``need_text`` says what ``need_bytes`` is made of."""
    sized = _hundredths_up(need_bytes * MARGIN / total_bytes) if total_bytes > 0 else math.inf
    fraction = given if given is not None else min(sized, 1.0)
    need = f"{_gib(need_bytes)}{f' ({need_text})' if need_text else ''}"
    ceiling = _hundredths_down(available_bytes / total_bytes) if total_bytes > 0 else 0.0
    reserved = math.ceil(total_bytes * fraction)
    refusal: str | None = None
    if given is None and sized > 1.0:
        refusal = (
            f"memory guard: the cell needs {need}, with margin more than the memory node's "
            f"{_gib(total_bytes)}; lower --parallel/--ctx"
        )
    elif given is not None and reserved < need_bytes:
        refusal = (
            f"memory guard: {flag} {given:g} reserves {_gib(reserved)} of the node's "
            f"{_gib(total_bytes)}, less than the cell needs: {need}; drop the flag (the tool "
            f"sizes it: {sized:g}) or raise it to at least {sized:g}"
        )
    elif reserved > available_bytes:
        fix = (
            f"lower {flag} to at most {ceiling:g}, or free memory"
            if given is not None and ceiling * total_bytes >= need_bytes
            else "free memory or lower --parallel/--ctx"
        )
        refusal = (
            f"memory guard: {flag} {fraction:g} reserves {_gib(reserved)} of the node's "
            f"{_gib(total_bytes)} but only {_gib(available_bytes)} is available there (the "
            f"server would exit at start; the cell needs {need}); {fix}"
        )
    return FractionDecision(
        fraction=fraction,
        given=given is not None,
        sized=sized,
        need_bytes=need_bytes,
        total_bytes=total_bytes,
        available_bytes=available_bytes,
        refusal=refusal,
    )
