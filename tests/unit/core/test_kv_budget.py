"""The KV budget of a unified pool: what each request may hold, and who goes with whom."""

from __future__ import annotations

from batch_invariance.core.kv_budget import (
    KV_FRAME_ALLOWANCE,
    admits,
    item_kv_cost,
    kv_costs,
    pool_order,
)
from batch_invariance.core.plan import WorkItem


def _item(test_id: str, tokens: int | None) -> WorkItem:
    meta = {} if tokens is None else {"calibrated_tokens": tokens}
    return WorkItem(test_id, "p", None, meta=meta)


def test_a_request_holds_its_counted_prompt_the_frame_and_the_whole_answer() -> None:
    assert item_kv_cost(_item("a", 100), 32, 1024, 2) == 100 + KV_FRAME_ALLOWANCE + 32
    # Uncounted work is taken at a slot's share of the pool, never at nothing.
    assert item_kv_cost(_item("b", None), 32, 1024, 4) == 256
    assert kv_costs([_item("a", 10), _item("b", None)], 8, 512, 2) == {
        "a": 10 + KV_FRAME_ALLOWANCE + 8,
        "b": 256,
    }


def test_the_pool_admits_what_fits_and_anything_alone() -> None:
    assert admits(200, 800, 1, 1024)
    assert not admits(225, 800, 1, 1024)
    # A request larger than the pool runs alone rather than never.
    assert admits(5000, 0, 0, 1024)
    assert not admits(5000, 10, 1, 1024)


def test_each_long_request_goes_just_before_a_distinct_companion_that_fits_beside_it() -> None:
    costs = {"s1": 300, "L1": 800, "s2": 200, "s3": 150, "L2": 850, "s4": 400}
    order = ("s1", "L1", "s2", "s3", "L2", "s4")
    out = pool_order(order, costs, 1024, 2)
    assert sorted(out) == sorted(order)
    # The longest is served first: L2 (850) takes the first short that fits beside it (s3,
    # 150), then L1 (800) the first one left that fits (s2, 200); s1 and s4 keep their order.
    assert out == ("s1", "L1", "s2", "L2", "s3", "s4")
    for long_id in ("L1", "L2"):
        mate = out[out.index(long_id) + 1]
        assert costs[long_id] + costs[mate] <= 1024


def test_a_long_request_with_no_companion_keeps_its_place() -> None:
    costs = {"s1": 600, "L1": 900, "s2": 700}
    assert pool_order(("s1", "L1", "s2"), costs, 1024, 2) == ("s1", "L1", "s2")
    # Nothing long: the order is the shuffle's.
    assert pool_order(("a", "b"), {"a": 10, "b": 20}, 1024, 2) == ("a", "b")
