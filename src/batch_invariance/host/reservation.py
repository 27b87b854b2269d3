"""The memory guard for an engine that reserves a share of its memory node at start (vLLM's
CPU backend, :class:`~batch_invariance.engines.base.MemoryReservation`).

The projection is the model folder's weights, the KV cache for ``N x ctx`` tokens and the
engine's measured runtime; the fraction passed to the server is sized from it
(:func:`~batch_invariance.core.memory_fraction.size_fraction`), or the user's own value is
checked against it, and both against what the node has available as the engine counts it
(:mod:`batch_invariance.host.node_memory`). Where the KV size is set explicitly the engine
reads no fraction: the explicit size is checked instead.
"""

from __future__ import annotations

from batch_invariance.core.memory_fraction import size_fraction
from batch_invariance.engines.base import MemoryReservation
from batch_invariance.host.hf_model import HfModelInfo
from batch_invariance.host.memory import GIB, GuardDecision, HostMemory, Projection, evaluate

__all__ = ["evaluate_reservation", "passed_fraction", "project_reserved"]


def project_reserved(
    info: HfModelInfo, ctx: int, parallel: int, reservation: MemoryReservation
) -> Projection:
    """Weights + KV for ``parallel`` sequences of ``ctx`` tokens + the engine's runtime."""
    kv_per_token = info.kv_bytes_per_token(reservation.dtype)
    asked = reservation.dtype
    shown = info.dtype if asked in (None, "auto") else f"max({info.dtype}, {asked})"
    return Projection(
        parallel=parallel,
        ctx=ctx,
        weights_bytes=info.weights_bytes,
        kv_bytes=kv_per_token * ctx * parallel,
        overhead_bytes=reservation.runtime_bytes,
        cache_type_k=shown,
        cache_type_v=shown,
    )


def _explicit_kv_refusal(
    projection: Projection, host: HostMemory, reservation: MemoryReservation
) -> str | None:
    explicit = reservation.explicit_kv_bytes
    assert explicit is not None
    source = reservation.explicit_kv_source
    label = f"{projection.parallel} x ctx {projection.ctx}"
    if explicit < projection.kv_bytes:
        return (
            f"memory guard: {source} gives the KV cache {explicit / GIB:.2f} GiB, less than "
            f"{label} needs ({projection.kv_bytes / GIB:.2f} GiB); raise it, or unset it and "
            f"the tool sizes {reservation.flag}"
        )
    node = host.node
    if node is not None and explicit > node.available_bytes:
        return (
            f"memory guard: {source} asks for {explicit / GIB:.2f} GiB of KV cache but only "
            f"{node.available_bytes / GIB:.2f} GiB is available on the memory node (the "
            "server would exit at start); lower it or free memory"
        )
    return None


def evaluate_reservation(
    projection: Projection,
    host: HostMemory,
    cap_gb: float | None,
    reservation: MemoryReservation,
) -> GuardDecision:
    """The guard's decision on a server that reserves memory at start (pure): the cap and
    host memory as for any server, then the reserved share of its memory node."""
    base = evaluate(projection, host, cap_gb)
    if reservation.explicit_kv_bytes is not None:
        # The engine reads no fraction: nothing is sized or passed.
        refusal = base.refusal or _explicit_kv_refusal(projection, host, reservation)
        return GuardDecision(projection, host, base.cap_bytes, refusal)
    node = host.node
    if node is None:
        refusal = base.refusal or (
            "memory guard: the memory node the server reserves from could not be read, so "
            f"{reservation.flag} cannot be sized or checked (nothing was launched)"
        )
        return GuardDecision(projection, host, base.cap_bytes, refusal)
    fraction = size_fraction(
        projection.total_bytes,
        node.total_bytes,
        node.available_bytes,
        reservation.given,
        flag=reservation.flag,
        need_text=f"{projection.breakdown()} for {projection.parallel} x ctx {projection.ctx}",
    )
    refusal = base.refusal or fraction.refusal
    return GuardDecision(projection, host, base.cap_bytes, refusal, reservation=fraction)


def passed_fraction(decision: GuardDecision | None) -> float | None:
    """The fraction the tool itself passes to the server: the sized one (``None`` where the
    engine reserves nothing, the KV size is explicit, or the user's own flag carries it)."""
    if decision is None or decision.reservation is None or decision.reservation.given:
        return None
    return decision.reservation.fraction
