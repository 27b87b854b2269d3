"""The KV budget of a unified pool (pure): what each request may hold, who goes with whom.

A server with one unified KV pool (llama-server ``-kvu``) lets any slot fill the whole pool,
so a cell that covers it must measure sequences up to 3/4 of the POOL, co-batched. N such
sequences cannot be in flight at once: asked for more KV than the pool holds, the server
fails the batch (or shifts the context), and the measurement would be of that, not of
batching. So a concurrent pass on a unified pool keeps the requests in flight within the
pool (:func:`admits`), counting each at its worst case (:func:`kv_costs`: the prompt as
counted, a frame allowance and the whole answer budget), and orders its queue so every long
request is followed by a short companion that fits beside it (:func:`pool_order`): the long
one is then co-batched with the companion (or with whatever was still in flight when it
went out), which the witness and the request intervals judge as for any row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from batch_invariance.core.plan import WorkItem

__all__ = ["KV_FRAME_ALLOWANCE", "admits", "item_kv_cost", "kv_costs", "pool_order"]

#: Tokens a request may hold beyond its counted prompt and answer: BOS and a chat template's
#: frame (Gemma's turn markers are about ten), with room to spare.
KV_FRAME_ALLOWANCE = 16


def item_kv_cost(item: WorkItem, n_predict: int, pool: int, parallel: int) -> int:
    """The most KV cells ``item`` can hold: its prompt as fitted (``calibrated_tokens``, as
    the ladder and profiles record it), the frame allowance and the answer budget; an item
    that records no count is taken at a slot's share of the pool (work sized for a split
    cache fits one)."""
    tokens = item.meta.get("calibrated_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return tokens + KV_FRAME_ALLOWANCE + n_predict
    return pool // max(1, parallel)


def kv_costs(items: Sequence[WorkItem], n_predict: int, pool: int, parallel: int) -> dict[str, int]:
    """:func:`item_kv_cost` of every item, by id."""
    return {item.test_id: item_kv_cost(item, n_predict, pool, parallel) for item in items}


def admits(cost: int, in_flight: int, n_in_flight: int, pool: int) -> bool:
    """Whether a request of ``cost`` may go out beside ``n_in_flight`` requests holding
    ``in_flight`` cells: it fits what is left of the pool, or nothing is in flight (a request
    larger than the pool then runs alone, as it would on a serial server)."""
    return n_in_flight == 0 or in_flight + cost <= pool


def _companion(
    long_cost: int, order: Sequence[str], costs: Mapping[str, int], pool: int, taken: set[str]
) -> str | None:
    """The first id of ``order`` not yet taken that fits beside a request of ``long_cost``."""
    for test_id in order:
        if test_id not in taken and long_cost + costs[test_id] <= pool:
            return test_id
    return None


def pool_order(
    order: Sequence[str], costs: Mapping[str, int], pool: int, parallel: int
) -> tuple[str, ...]:
    """``order`` (a pass's seeded shuffle) with every long request (more than a slot's share
    of the pool) moved to just before a short companion that fits beside it, a distinct one
    each, the longest request first served; the others keep their order. A long request with
    no companion left keeps its place (the intervals then show whether it was co-batched).

    Dispatch is first in, first out, so the companion goes out right after its long request,
    as soon as the pool has room for both."""
    share = pool // max(1, parallel)
    place = {test_id: k for k, test_id in enumerate(order)}
    longs = sorted((i for i in order if costs[i] > share), key=lambda i: (-costs[i], place[i]))
    if not longs:
        return tuple(order)
    shorts = [i for i in order if costs[i] <= share]
    taken: set[str] = set()
    before: dict[str, list[str]] = {}
    unpaired: list[str] = []
    for long_id in longs:
        mate = _companion(costs[long_id], shorts, costs, pool, taken)
        if mate is None:
            unpaired.append(long_id)
            continue
        taken.add(mate)
        before.setdefault(mate, []).append(long_id)
    out: list[str] = []
    for test_id in order:
        if test_id in unpaired:
            out.append(test_id)
        elif test_id in shorts:
            out += [*before.get(test_id, ()), test_id]
    return tuple(out)
