"""What a clean comparison covers (pure): enough independent prompts, long enough answers.

* sample size - at least ``min_hot_trials`` id x pass comparisons genuinely scored in both A
  and the pass, and co-batched in that pass (the "hot" comparisons).
* per-prompt bound - the 95% upper bound on the divergence rate over DISTINCT prompts
  (distinct request contents, :func:`distinct_prompts`: repetitions of one prompt, and ids
  that send the same prompt up to whitespace, are not independent) at most ``max_bound``.
* answer length - the median server-reported generated length of the hot comparisons at
  least ``min_answer_tokens``; an unknown length fails. A GREEN holds only for the answer
  length it was measured at.

Each gate returns a frozen record with ``ok`` and a one-line ``reason``, like
:mod:`batch_invariance.core.gates`, and fails closed on missing evidence.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, compress, repeat

import numpy as np
import numpy.typing as npt

from batch_invariance.core.columns import (
    ArmColumns,
    PassColumns,
    PassesLike,
    as_arm_columns,
    as_pass_columns,
    same_order,
)
from batch_invariance.core.evidence import GatePolicy, ItemMeta, Trial
from batch_invariance.core.gates import IdSet, cobatched_by_pass, exact_fraction
from batch_invariance.core.plan import row_id

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

# --------------------------------------------------------------------------- sample size


@dataclass(frozen=True)
class SampleGate:
    ok: bool
    n_hot_trials: int
    min_hot_trials: int
    reason: str


#: Hot comparisons as the ids of each pass, keyed by pass index: the counts and the length
#: gate read them without a (pass, id) pair per comparison.
HotByPass = Mapping[int, Collection[str]]


def hot_by_pass(
    a: ArmColumns, passes: Sequence[PassColumns], cobatched: Mapping[int, IdSet]
) -> dict[int, Collection[str]]:
    """Per pass, the ids scored ``ok`` in A and in the pass and co-batched in it (two passes
    recorded under one index count both, as their (pass, id) pairs would)."""
    hot: dict[int, Collection[str]] = {}
    a_ids = a.trials.keys()
    for pc in passes:
        index = pc.record.index
        ids = cobatched[index]  # ids of this pass
        every = len(ids) == len(pc.arm.ids) and same_order(pc.arm.ids, a.ids)  # all, all in A
        if not every and not a_ids >= ids:  # co-batched ids A lacks: not comparisons
            ids = frozenset(filter(a_ids.__contains__, ids))
        unscored = a.not_ok | pc.arm.not_ok
        if unscored:
            ids = ids - unscored
        hot[index] = [*hot[index], *ids] if index in hot else ids
    return hot


def hot_trials(
    a: Mapping[str, Trial],
    passes: PassesLike,
    margin: float,
    cobatched: Mapping[int, IdSet] | None = None,
) -> tuple[tuple[int, str], ...]:
    """(pass, id) comparisons scored ``ok`` in A and in the pass and co-batched in it,
    sorted by (pass, id)."""
    columns = as_pass_columns(passes)
    co_sets = cobatched if cobatched is not None else cobatched_by_pass(columns, margin)
    hot = hot_by_pass(as_arm_columns(a), columns, co_sets)
    per_pass = (zip(repeat(index), sorted(hot[index])) for index in sorted(hot))
    return tuple(chain.from_iterable(per_pass))


def sample_gate(n_hot: int, policy: GatePolicy) -> SampleGate:
    """At least ``min_hot_trials`` hot comparisons."""
    ok = n_hot >= policy.min_hot_trials and n_hot > 0
    verb = "met" if ok else "not met"
    return SampleGate(
        ok,
        n_hot,
        policy.min_hot_trials,
        f"sample size {verb}: {n_hot} co-batched id x pass comparisons scored in both A and C "
        f"(need >= {policy.min_hot_trials})",
    )


# --------------------------------------------------------------------------- answer length


@dataclass(frozen=True)
class LengthGate:
    """How long the compared answers were: a GREEN holds only for the length measured.

    Each hot comparison counts the shorter of its two server-reported generated-token counts
    (A and the C pass): beyond that, nothing was compared.
    """

    ok: bool
    min_answer_tokens: int
    n_measured: int
    #: Hot comparisons where A or C reported no generated-token count.
    n_unknown: int
    answer_tokens_min: int | None
    #: The lower median (an integer, never rounded up).
    answer_tokens_median: int | None
    answer_tokens_max: int | None
    #: Share of hot comparisons where the token budget cut A or C (finish_reason "length").
    share_cut_by_budget: float | None
    reason: str


def _as_floats(counts: Sequence[int | None]) -> Floats:
    """Token counts as float64 (exact below 2**53), an unreported one (``None``) as NaN."""
    if counts.count(None) == len(counts):  # none reported (no per-item conversion needed)
        return np.full(len(counts), np.nan)
    return np.array(counts, dtype=np.float64)


def _by_pass(hot: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for index, test_id in hot:
        grouped.setdefault(index, []).append(test_id)
    return grouped


def _hot_lengths(
    ids: Collection[str], c: ArmColumns, index: int
) -> tuple[Sequence[str], Sequence[int | None]]:
    """A pass's hot ids and C's lengths of them: a set in C's own order (each id once), a
    sequence in its order."""
    if isinstance(ids, AbstractSet):  # each id once: read C's lengths in C's own order
        listed: Sequence[str]
        c_len: Sequence[int | None]
        if len(ids) == len(c.ids) and c.trials.keys() <= ids:  # every id of the pass
            listed, c_len = c.ids, c.answer_tokens
        else:
            mask = list(map(ids.__contains__, c.ids))
            listed = list(compress(c.ids, mask))
            c_len = list(compress(c.answer_tokens, mask))
        if len(listed) != len(ids):
            raise KeyError(f"hot id not in pass {index}")
        return listed, c_len
    listed = list(ids)
    c_tokens = dict(zip(c.ids, c.answer_tokens, strict=True))
    return listed, list(map(c_tokens.__getitem__, listed))


def _length_outcome(measured: Ints, unknown: int, share: float | None, floor: int) -> LengthGate:
    """The gate on the hot comparisons' measured lengths (``unknown`` of them unmeasured)."""
    if not measured.size:
        return LengthGate(
            False, floor, 0, unknown, None, None, None, share,
            f"answer length not met: no hot comparison has a server-reported generated-token "
            f"count, so the length measured is unknown (need a median >= {floor} tokens)",
        )  # fmt: skip
    mid = (measured.size - 1) // 2  # the lower median
    low, high = int(measured.min()), int(measured.max())
    median = int(np.partition(measured, mid)[mid])
    n_measured = int(measured.size)
    cut_text = f"{share:.0%} cut by the token budget" if share is not None else ""
    if unknown:
        return LengthGate(
            False, floor, n_measured, unknown, low, median, high, share,
            f"answer length not met: {unknown} hot comparison(s) have no server-reported "
            "generated-token count, so the length measured is unknown",
        )  # fmt: skip
    ok = median >= floor
    verb = "met" if ok else "not met"
    return LengthGate(
        ok, floor, n_measured, 0, low, median, high, share,
        f"answer length {verb}: median {median} generated tokens over {n_measured} hot "
        f"comparisons (min {low}, max {high}, {cut_text}; need a median >= {floor})",
    )  # fmt: skip


def length_gate(
    a: Mapping[str, Trial] | ArmColumns,
    passes: PassesLike,
    hot: Sequence[tuple[int, str]] | HotByPass,
    policy: GatePolicy,
) -> LengthGate:
    """The median generated length of the hot comparisons must reach ``min_answer_tokens``;
    an unknown length (the server reported no count) fails closed. ``hot`` is the (pass, id)
    comparisons, or their ids per pass."""
    by_index = {pc.record.index: pc.arm for pc in as_pass_columns(passes)}
    a_cols = as_arm_columns(a)
    a_tokens: dict[str, int | None] | None = None  # A's lengths by id, built when needed
    a_all: Floats | None = None  # A's lengths in A's order, built when needed
    lengths: list[Ints] = []
    unknown = cut = n_hot = 0
    for index, ids in (hot if isinstance(hot, Mapping) else _by_pass(hot)).items():
        c = by_index[index]
        listed, c_len = _hot_lengths(ids, c, index)
        n_hot += len(listed)
        if a_cols.cut_by_budget or c.cut_by_budget:
            cut_ids = a_cols.cut_by_budget | c.cut_by_budget
            cut += sum(map(cut_ids.__contains__, listed))
        # A's side, in the order of ``listed``; an unreported count (None) becomes NaN.
        if same_order(listed, a_cols.ids):
            if a_all is None:
                a_all = _as_floats(a_cols.answer_tokens)
            a_floats = a_all
        else:
            if a_tokens is None:
                a_tokens = dict(zip(a_cols.ids, a_cols.answer_tokens, strict=True))
            a_floats = _as_floats(list(map(a_tokens.__getitem__, listed)))
        # The shorter side counts: beyond it, nothing was compared; a NaN side is unknown.
        shorter = np.minimum(a_floats, _as_floats(c_len))
        known = ~np.isnan(shorter)
        unknown += int(known.size - np.count_nonzero(known))
        lengths.append(shorter[known].astype(np.int64))
    share = cut / n_hot if n_hot else None
    measured = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return _length_outcome(measured, unknown, share, policy.min_answer_tokens)


# --------------------------------------------------------------------------- per-prompt bound


def distinct_prompts(test_ids: Iterable[str], items: Sequence[ItemMeta]) -> int:
    """How many distinct requests ``test_ids`` sent: ids whose items carry one
    ``request_key`` count once. An id without a key (a cert written before keys were
    recorded) counts by its work-set row, as such certs were judged."""
    keys = {m.test_id: m.request_key for m in items if m.request_key is not None}
    return len({keys.get(t) or "row:" + row_id(t) for t in test_ids})


@dataclass(frozen=True)
class BoundGate:
    """The 95% upper bound on the per-prompt divergence rate must be small enough."""

    ok: bool
    n_distinct_prompts: int
    bound: float | None
    max_bound: float
    reason: str


def bound_gate(n_distinct: int, bound: float | None, policy: GatePolicy) -> BoundGate:
    """``bound`` (over distinct prompts) at or below ``max_bound``; no bound fails."""
    limit = policy.max_bound
    ok = bound is not None and exact_fraction(bound) <= exact_fraction(limit)
    verb = "met" if ok else "not met"
    shown = "none" if bound is None else f"{bound:.4g}"
    needed = math.ceil(Fraction(3) / exact_fraction(limit)) if limit > 0 else "infinitely many"
    return BoundGate(
        ok,
        n_distinct,
        bound,
        limit,
        f"per-prompt bound {verb}: 95% upper bound {shown} on the divergence rate from "
        f"{n_distinct} distinct co-batched prompt(s) (need <= {limit:g}, i.e. >= "
        f"{needed} distinct prompts, "
        "none diverging; repetitions of a prompt are not independent)",
    )
