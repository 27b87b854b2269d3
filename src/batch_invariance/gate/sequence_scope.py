"""The sequence-length rule of the deploy gate and of ``serve`` (a pure decision over what a
cert measured and the slot a deploy serves).

A deploy serves prompts of any length up to its context per slot, and a cert speaks only for
the sequence lengths it compared (:mod:`batch_invariance.core.scope`): it covers a slot only
when its longest co-batched sequence reaches 3/4 of it. A cert that records no sequence scope
(written before it was recorded) covers no slot. The message names both lengths.
"""

from __future__ import annotations

from batch_invariance.core.scope import NOT_RECORDED, SequenceScope, required_length

__all__ = ["sequence_problem"]


def sequence_problem(scope: SequenceScope | None, slot: int) -> str | None:
    """Why a cert's measured sequences do not cover a ``slot``-token slot (``None``: they
    reach 3/4 of it, :mod:`batch_invariance.core.scope`). The deploy serves prompts of any
    length up to its slot and a cert speaks only for the lengths it compared; one that
    records no sequence scope covers no slot. check-deploy and ``serve`` both ask this."""
    need = required_length(slot)
    if scope is None:
        return (
            f"{NOT_RECORDED} (the cert was written before the sequence scope was recorded): "
            f"it covers no {slot}-token slot; re-run the cell with this version"
        )
    if scope.longest is None or scope.longest < need:
        measured = "of unknown length" if scope.longest is None else f"up to {scope.longest}"
        return (
            f"sequences measured {measured} tokens, but the slot is {slot} tokens (need >= "
            f"{need}, 3/4 of it); measure a work-set that fills the slot"
        )
    return None
