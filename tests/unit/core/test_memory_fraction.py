"""Sizing vLLM's reserved share of its memory node: the projection with margin over the node's
total, rounded up; a user's value wins but is refused when it cannot hold the cell or cannot
be reserved on what is available (the server would exit at start)."""

from __future__ import annotations

import math

from batch_invariance.core.memory_fraction import MARGIN, size_fraction

GIB = 1024**3
TOTAL = 16 * GIB


def test_sized_value_is_the_projection_with_margin_over_the_total_rounded_up() -> None:
    d = size_fraction(3 * GIB, TOTAL, 12 * GIB)
    assert d.sized == math.ceil(3 * MARGIN / 16 * 100) / 100 == 0.24
    assert d.fraction == d.sized and not d.given and d.refusal is None
    assert d.reserved_bytes >= 3 * GIB * MARGIN  # rounding only ever adds room


def test_a_cell_bigger_than_the_node_is_refused_before_launch() -> None:
    d = size_fraction(15 * GIB, TOTAL, 15 * GIB, need_text="weights 14 + KV 1")
    assert d.refusal is not None and "lower --parallel/--ctx" in d.refusal
    assert "weights 14 + KV 1" in d.refusal


def test_a_sized_value_over_what_is_available_is_refused_with_the_fix() -> None:
    # 0.24 of 16 GiB is 3.84 GiB; only 3 GiB free as vLLM counts it.
    d = size_fraction(3 * GIB, TOTAL, 3 * GIB)
    assert d.refusal is not None and "only 3.00 GiB is available" in d.refusal
    assert "exit at start" in d.refusal and "free memory" in d.refusal
    assert size_fraction(3 * GIB, TOTAL, 4 * GIB).refusal is None


def test_a_given_value_too_small_for_weights_and_kv_is_refused_naming_the_sized_one() -> None:
    d = size_fraction(3 * GIB, TOTAL, 12 * GIB, given=0.1)
    assert d.given and d.fraction == 0.1
    assert d.refusal is not None
    assert "--gpu-memory-utilization 0.1 reserves 1.60 GiB" in d.refusal
    assert "at least 0.24" in d.refusal


def test_a_given_value_that_holds_the_cell_wins_even_without_the_margin() -> None:
    # 0.19 reserves 3.04 GiB: enough for 3 GiB, below the sized 0.24.
    d = size_fraction(3 * GIB, TOTAL, 12 * GIB, given=0.19)
    assert d.refusal is None and d.fraction == 0.19 and d.sized == 0.24


def test_a_given_value_larger_than_what_is_free_is_refused_with_the_largest_that_fits() -> None:
    # vLLM's own default on a node whose page cache is counted as used (in a cgroup).
    d = size_fraction(3 * GIB, TOTAL, 10 * GIB, given=0.92)
    assert d.refusal is not None
    assert "lower --gpu-memory-utilization to at most 0.62" in d.refusal
    assert size_fraction(3 * GIB, TOTAL, 10 * GIB, given=0.62).refusal is None
