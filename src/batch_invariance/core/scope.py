"""Which sequence lengths a cell measured, and whether they cover its slot (pure).

A cert is for a (model, ctx, N) cell, and the deploy it covers serves prompts of any length
up to the slot. Batch variance can start at a fixed sequence position (on llama-server's CPU
build with ``-ub 1``: every row bitwise equal up to position 256, drift from 257 on), so a
GREEN measured on 100-token sequences says nothing about a 1024-token slot.

* The **sequence** of one A/C comparison is the prompt, as the server counted it
  (``prompt_tokens_measured``), plus the shorter of the two generated lengths: beyond that,
  nothing was compared.
* The **scope gate**: the longest sequence among the hot comparisons (co-batched, scored in A
  and the pass) must reach :data:`SLOT_FILL_REQUIRED` (3/4) of the slot; an unknown length
  counts as not measured. Otherwise the cell cannot be GREEN for that slot.
* The **bands** (quarters of the slot) say, per length, how many rows were compared, how
  many drifted and how many changed their answer, and where drift began: the length of the
  sequence the model had read when it gave the first logprob or margin that differed
  (prompt tokens + the index of that generated token; the last position it attended to).

The rule applies to cells that record their slot (``CellEvidence.slot_ctx``); a cert written
before it was recorded keeps its verdict and says "sequence length: not recorded".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from fractions import Fraction

from batch_invariance.core.evidence import DEFAULT_MIN_SLOT_FILL, CellEvidence, Trial
from batch_invariance.core.numerics import PairNumerics
from batch_invariance.core.pair_report import PairReport

__all__ = [
    "NOT_RECORDED",
    "N_BANDS",
    "SLOT_FILL_REQUIRED",
    "UNRECORDED_GATE",
    "LengthBand",
    "ScopeGate",
    "SequenceScope",
    "band_edges",
    "required_length",
    "scope_gate",
    "scope_words",
    "sequence_scope",
    "smallest_filled_slot",
]

#: A cell's measured sequences must reach this share of its slot to cover it (the policy's
#: default; the deploy gate always holds certs to it).
SLOT_FILL_REQUIRED = Fraction(DEFAULT_MIN_SLOT_FILL)
#: The slot is reported in this many equal bands (quarters).
N_BANDS = 4
#: What every reader says of a cert that records no sequence scope.
NOT_RECORDED = "sequence length: not recorded"


def required_length(slot_ctx: int, fill: float | None = None) -> int:
    """The shortest sequence that covers a slot of ``slot_ctx`` tokens: ``fill`` of it (by
    default 3/4), rounded up (a whole token short is short)."""
    share = SLOT_FILL_REQUIRED if fill is None else Fraction(fill)
    return math.ceil(share * slot_ctx)


def smallest_filled_slot(longest: int) -> int:
    """The largest slot that sequences up to ``longest`` tokens cover (the cell a short
    measurement could still speak for)."""
    return math.floor(Fraction(longest) / SLOT_FILL_REQUIRED)


def band_edges(slot_ctx: int) -> tuple[tuple[int, int], ...]:
    """``(low, high)`` token bounds of each band, both inclusive: ``1..C/4``, ``C/4+1..C/2``,
    ... up to the slot."""
    cuts = [math.ceil(Fraction(k * slot_ctx, N_BANDS)) for k in range(N_BANDS + 1)]
    return tuple((cuts[k] + 1 if k else 1, cuts[k + 1]) for k in range(N_BANDS))


@dataclass(frozen=True)
class LengthBand:
    """The AC rows (id x pass, both sides answered) whose sequence falls in one band."""

    low: int
    high: int
    rows_compared: int
    #: Distinct ids among them.
    n_ids: int
    #: Rows whose logprobs or margins differed from A at some compared position.
    rows_with_drift: int
    #: Rows whose answer changed (a scored field, or the tokens alone).
    rows_with_changed_answer: int
    #: Smallest sequence position (see the module docstring) of a first drift in this band.
    first_drift_position: int | None


@dataclass(frozen=True)
class SequenceScope:
    """The cert's ``sequence_scope`` block: the lengths measured against the slot."""

    slot_ctx: int
    #: The policy's share of the slot (3/4 by default), rounded up: what the longest hot
    #: sequence must reach.
    required: int
    #: The longest hot sequence (prompt + compared answer); ``None`` when none is known.
    longest: int | None
    shortest: int | None
    #: Hot comparisons with a known sequence length, and those without one.
    n_measured: int
    n_unknown: int
    bands: tuple[LengthBand, ...]
    #: Smallest sequence position of a first drift over every AC row: the sequence length
    #: the model had read when it gave the first differing logprob.
    first_drift_position: int | None
    #: Rows whose drift began exactly at ``first_drift_position`` with prompts shorter than
    #: it: two prompts or more there mean drift starts at a fixed position, not with a prompt.
    rows_drifting_at_first: int
    #: The longest sequence compared without any drift in the cell when drift started at a
    #: fixed position (every drift at or after it); ``None`` otherwise.
    bitwise_equal_up_to: int | None
    statement: str

    @property
    def covered(self) -> bool:
        """The measured sequences reach 3/4 of the slot."""
        return self.longest is not None and self.longest >= self.required


@dataclass(frozen=True)
class ScopeGate:
    """Whether the measured sequences cover the slot; met when the slot is not recorded."""

    ok: bool
    recorded: bool
    reason: str


#: A cell that records no slot: the rule is not applied (certs written before it was).
UNRECORDED_GATE = ScopeGate(True, False, NOT_RECORDED)


@dataclass(frozen=True)
class _Row:
    test_id: str
    pass_index: int
    length: int | None
    prompt: int | None


def _length(a: Trial, c: Trial) -> int | None:
    prompt = a.prompt_tokens_measured
    if prompt is None or a.completion_tokens is None or c.completion_tokens is None:
        return None
    return prompt + min(a.completion_tokens, c.completion_tokens)


def _rows(evidence: CellEvidence) -> list[_Row]:
    """Every AC comparison with both sides answered (a transport failure compares nothing)."""
    rows: list[_Row] = []
    for p in evidence.c_passes:
        for test_id, c in p.trials.items():
            a = evidence.a.get(test_id)
            if a is None or a.is_transport_failure or c.is_transport_failure:
                continue
            rows.append(_Row(test_id, p.index, _length(a, c), a.prompt_tokens_measured))
    return rows


def _band_of(length: int, edges: Sequence[tuple[int, int]]) -> int:
    for k, (_, high) in enumerate(edges):
        if length <= high:
            return k
    return len(edges) - 1  # past the slot (the server shifted context): the top band


def scope_words(scope: SequenceScope | None) -> str:
    """The one line every reader prints: ``over sequences up to L of the slot's C tokens``,
    or :data:`NOT_RECORDED`."""
    if scope is None:
        return NOT_RECORDED
    if scope.longest is None:
        return (
            f"sequence length unknown (no hot comparison reported its lengths) in a "
            f"{scope.slot_ctx}-token slot"
        )
    return f"over sequences up to {scope.longest} of the slot's {scope.slot_ctx} tokens"


def _statement(scope: SequenceScope) -> str:
    said = [scope_words(scope)]
    if scope.first_drift_position is not None:
        said.append(f"drift first seen at sequence position {scope.first_drift_position}")
    if scope.bitwise_equal_up_to is not None:
        slot = _power_of_two_at_most(scope.bitwise_equal_up_to)
        said.append(
            f"drift starts at a fixed position ({scope.rows_drifting_at_first} rows begin "
            f"drifting exactly at {scope.first_drift_position}): sequences up to "
            f"{scope.bitwise_equal_up_to} tokens stayed bitwise equal, so a slot of {slot} "
            f"tokens is the cell to measure next"
        )
    return "; ".join(said)


def _power_of_two_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


_Key = tuple[int, str]  # (pass index, test id)


def _measured(
    by_key: Mapping[_Key, _Row], hot: Mapping[int, Iterable[str]]
) -> tuple[list[int], int]:
    """The hot comparisons' sequence lengths, and how many of them have none."""
    hot_lengths: list[int] = []
    unknown = 0
    for index, ids in hot.items():
        for test_id in ids:
            row = by_key.get((index, test_id))
            if row is None or row.length is None:
                unknown += 1
            else:
                hot_lengths.append(row.length)
    return hot_lengths, unknown


def _drift_positions(by_key: Mapping[_Key, _Row], numerics: PairNumerics) -> dict[_Key, int]:
    """Where each drifting row's first drift sits in its sequence (prompt + answer token)."""
    drift_at: dict[_Key, int] = {}
    for r in numerics.rows:
        if r.pass_index is None or r.first_drift is None:
            continue
        row = by_key.get((r.pass_index, r.test_id))
        if row is not None and row.prompt is not None:
            drift_at[(row.pass_index, row.test_id)] = row.prompt + r.first_drift
    return drift_at


def _bands(
    rows: Sequence[_Row],
    slot_ctx: int,
    drift_at: Mapping[_Key, int],
    changed: AbstractSet[tuple[int | None, str]],
) -> tuple[LengthBand, ...]:
    """The rows in the slot's quarter bands: compared, drifting, changed answers."""
    edges = band_edges(slot_ctx)
    per_band: list[list[_Row]] = [[] for _ in edges]
    for row in rows:
        if row.length is not None:
            per_band[_band_of(row.length, edges)].append(row)
    bands = []
    for (low, high), members in zip(edges, per_band, strict=True):
        keys = [(r.pass_index, r.test_id) for r in members]
        drifts = [drift_at[k] for k in keys if k in drift_at]
        bands.append(
            LengthBand(
                low=low,
                high=high,
                rows_compared=len(members),
                n_ids=len({r.test_id for r in members}),
                rows_with_drift=len(drifts),
                rows_with_changed_answer=sum(k in changed for k in keys),
                first_drift_position=min(drifts, default=None),
            )
        )
    return tuple(bands)


def _first_drift(
    rows: Sequence[_Row], by_key: Mapping[_Key, _Row], drift_at: Mapping[_Key, int]
) -> tuple[int | None, int, int | None]:
    """The first drift position, the rows drifting exactly there (their prompt ended before
    it), and the position every row is bitwise equal up to when that is a position."""
    first = min(drift_at.values(), default=None)
    if first is None:
        return None, 0, None
    # Rows whose prompt ended before the first drift and that drifted exactly there.
    there = [
        key
        for key, pos in drift_at.items()
        if pos == first and (p := by_key[key].prompt) is not None and p < first
    ]
    shorter = [r.length for r in rows if r.length is not None and r.length < first]
    # Two prompts, not one prompt in two passes: a position, not a prompt's quirk.
    equal_up_to = first - 1 if len({test_id for _, test_id in there}) > 1 and shorter else None
    return first, len(there), equal_up_to


def sequence_scope(
    evidence: CellEvidence,
    slot_ctx: int,
    hot: Mapping[int, Iterable[str]],
    ac: PairReport,
    numerics: PairNumerics,
    fill: float | None = None,
) -> SequenceScope:
    """The sequence lengths the cell measured against its ``slot_ctx``-token slot.

    ``hot`` is the hot comparisons' ids per pass (:func:`.sample.hot_by_pass`),
    ``ac`` and ``numerics`` the AC report and AC numerics of the same evidence."""
    rows = _rows(evidence)
    by_key = {(r.pass_index, r.test_id): r for r in rows}
    hot_lengths, unknown = _measured(by_key, hot)
    drift_at = _drift_positions(by_key, numerics)
    changed = {(d.pass_index, d.test_id) for d in ac.per_id if d.kind != "missing"}
    first, at_first, equal_up_to = _first_drift(rows, by_key, drift_at)
    scope = SequenceScope(
        slot_ctx=slot_ctx,
        required=required_length(slot_ctx, fill),
        longest=max(hot_lengths, default=None),
        shortest=min(hot_lengths, default=None),
        n_measured=len(hot_lengths),
        n_unknown=unknown,
        bands=_bands(rows, slot_ctx, drift_at, changed),
        first_drift_position=first,
        rows_drifting_at_first=at_first,
        bitwise_equal_up_to=equal_up_to,
        statement="",
    )
    return replace(scope, statement=_statement(scope))


def _share(scope: SequenceScope) -> str:
    if scope.required == required_length(scope.slot_ctx):
        return "3/4"
    return f"{scope.required / scope.slot_ctx:.2g}"


def scope_gate(scope: SequenceScope) -> ScopeGate:
    """Met when the longest hot sequence reaches 3/4 of the slot (an unknown length fails)."""
    need = f"need >= {scope.required}, {_share(scope)} of the slot"
    if scope.longest is None:
        return ScopeGate(
            False,
            True,
            f"sequence length not met: no hot comparison reported its prompt and answer "
            f"lengths, so the cell covers no part of its {scope.slot_ctx}-token slot ({need})",
        )
    if scope.covered:
        return ScopeGate(
            True,
            True,
            f"sequence length met: sequences up to {scope.longest} of the slot's "
            f"{scope.slot_ctx} tokens ({need})",
        )
    return ScopeGate(
        False,
        True,
        f"sequence length not met: the longest co-batched sequence measured is "
        f"{scope.longest} of the slot's {scope.slot_ctx} tokens ({need}); measure a work-set "
        f"that fills the slot (the default length ladder: run without --workset) or certify "
        f"the smaller cell it did fill (--ctx {smallest_filled_slot(scope.longest)} or less)",
    )
