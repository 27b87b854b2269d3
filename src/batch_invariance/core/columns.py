"""Every arm's trials read once into the columns the comparisons and gates read (pure).

A cell holds about ``ids x (passes + 2)`` trials and every gate and report looks at each of
them; reading the same attributes from every trial again in each gate was most of the cost of
:func:`batch_invariance.core.verdict.decide`. :func:`arm_columns` reads an arm once, with
C-level maps (no per-trial Python step), into an :class:`ArmColumns`; :func:`evidence_columns`
does it for every arm of a cell. The gates and :func:`batch_invariance.core.diff.compare_columns`
only read these columns, so what each of them counts is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, attrgetter, eq, is_, is_not, itemgetter, methodcaller, ne
from typing import Any

from batch_invariance.core.evidence import (
    FINISH_LENGTH,
    OK,
    TRANSPORT_MODES,
    CellEvidence,
    ItemMeta,
    PassRecord,
    Trial,
)

#: Everything :func:`batch_invariance.core.diff.classify` reads from one trial, as one
#: comparable tuple, fetched in C. The ``__class__`` entries keep ``1``, ``1.0`` and ``True``
#: apart (stricter than :func:`~batch_invariance.core.diff.same_value`, which is fine: unequal
#: keys only mean "check field by field").
_AGREEMENT_FIELDS = attrgetter(
    "score",
    "score.__class__",
    "passed",
    "passed.__class__",
    "extracted_answer",
    "expected_answer",
    "prompt_tokens_measured",
    "prompt_tokens_measured.__class__",
    "failure_mode",
    "content_sha256",
    "completion",
    "tokens",
)
#: ``failure_mode`` within an agreement key.
_KEY_FAILURE_MODE = itemgetter(8)
_LOGPROBS = attrgetter("token_logprobs")
_DISPATCH = attrgetter("dispatch_ts")
_COMPLETE = attrgetter("complete_ts")
_TIMINGS = attrgetter("timings")
_CACHE_N = methodcaller("get", "cache_n")
_COMPLETION_TOKENS = attrgetter("completion_tokens")
_FINISH = attrgetter("finish_reason")


def agreement_key(t: Trial) -> tuple[Any, ...]:
    """Two trials with equal keys compare ``clean`` (or ``skipped`` when both are transport
    failures: the failure mode is in the key). Unequal keys (NaN included) prove nothing and
    go through the field-by-field check."""
    key: tuple[Any, ...] = _AGREEMENT_FIELDS(t)
    return key


@dataclass(frozen=True, slots=True)
class ArmColumns:
    """One map of trials (an arm, or one C pass) with its per-trial facts read once."""

    trials: Mapping[str, Trial]
    #: :func:`agreement_key` per id.
    keys: Mapping[str, tuple[Any, ...]]
    #: Ids genuinely scored (``failure_mode == "ok"``).
    ok: frozenset[str]
    #: Ids whose trial is a transport failure.
    transport: frozenset[str]
    #: Ids whose trial carries chosen-token logprobs.
    with_logprobs: frozenset[str]
    #: The trials with both request timestamps, in map order: ids, dispatch and completion.
    timed_ids: tuple[str, ...]
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    #: Trials missing either timestamp.
    n_untimed: int
    #: Answered (not transport-failed) ids whose server reported no ``timings.cache_n``.
    cache_unreported: frozenset[str]
    #: Answered ids with a reported ``cache_n`` other than 0.
    cache_reused: frozenset[str]
    #: Server-reported generated-token count per id (``None`` when unreported).
    answer_tokens: Mapping[str, int | None]
    #: Ids whose answer the token budget cut (``finish_reason == "length"``).
    cut_by_budget: frozenset[str]


def arm_columns(trials: Mapping[str, Trial]) -> ArmColumns:
    """The :class:`ArmColumns` of a map of trials: one C-level map per attribute."""
    ids = tuple(trials.keys())
    values = tuple(trials.values())
    keys = list(map(_AGREEMENT_FIELDS, values))
    modes = list(map(_KEY_FAILURE_MODE, keys))
    transport = frozenset(compress(ids, map(TRANSPORT_MODES.__contains__, modes)))
    starts = list(map(_DISPATCH, values))
    ends = list(map(_COMPLETE, values))
    timed = list(map(is_not, starts, repeat(None)))
    if None in ends:
        timed = list(map(and_, timed, map(is_not, ends, repeat(None))))
    n_untimed = timed.count(False)
    cached = list(map(_CACHE_N, map(_TIMINGS, values)))
    unreported = frozenset(compress(ids, map(is_, cached, repeat(None)))) - transport
    # ``ne`` also selects None; those are the unreported ones, counted apart.
    reused = frozenset(compress(ids, map(ne, cached, repeat(0)))) - transport - unreported
    finish = map(_FINISH, values)
    return ArmColumns(
        trials=trials,
        keys=dict(zip(ids, keys, strict=True)),
        ok=frozenset(compress(ids, map(eq, modes, repeat(OK)))),
        transport=transport,
        with_logprobs=frozenset(compress(ids, map(is_not, map(_LOGPROBS, values), repeat(None)))),
        timed_ids=tuple(compress(ids, timed)) if n_untimed else ids,
        starts=tuple(compress(starts, timed)) if n_untimed else tuple(starts),
        ends=tuple(compress(ends, timed)) if n_untimed else tuple(ends),
        n_untimed=n_untimed,
        cache_unreported=unreported,
        cache_reused=reused,
        answer_tokens=dict(zip(ids, map(_COMPLETION_TOKENS, values), strict=True)),
        cut_by_budget=frozenset(compress(ids, map(eq, finish, repeat(FINISH_LENGTH)))),
    )


@dataclass(frozen=True, slots=True)
class PassColumns:
    """One C pass: its record (index, server signal) and the columns of its trials."""

    record: PassRecord
    arm: ArmColumns


@dataclass(frozen=True, slots=True)
class EvidenceColumns:
    """Every arm of a cell read once; ``passes`` sorted by pass index."""

    a: ArmColumns
    a_repeat: ArmColumns | None
    b: ArmColumns
    passes: tuple[PassColumns, ...]


def evidence_columns(evidence: CellEvidence) -> EvidenceColumns:
    """Every arm of ``evidence`` read once (the one scan of its trials)."""
    a_repeat = evidence.a_repeat
    return EvidenceColumns(
        a=arm_columns(evidence.a),
        a_repeat=None if a_repeat is None else arm_columns(a_repeat),
        b=arm_columns(evidence.b),
        passes=as_pass_columns(evidence.c_passes),
    )


#: Passes as records or as columns already read: every gate takes either.
PassesLike = Sequence[PassRecord] | Sequence[PassColumns]


def as_arm_columns(trials: Mapping[str, Trial] | ArmColumns) -> ArmColumns:
    """``trials`` read into columns, unless they already are."""
    return trials if isinstance(trials, ArmColumns) else arm_columns(trials)


def as_pass_columns(passes: PassesLike) -> tuple[PassColumns, ...]:
    """The columns of each pass (read now where given as records), sorted by pass index."""
    columns = (
        p if isinstance(p, PassColumns) else PassColumns(p, arm_columns(p.trials)) for p in passes
    )
    return tuple(sorted(columns, key=lambda pc: pc.record.index))


def as_evidence_columns(evidence: CellEvidence | EvidenceColumns) -> EvidenceColumns:
    """``evidence`` read into columns, unless it already is."""
    return evidence if isinstance(evidence, EvidenceColumns) else evidence_columns(evidence)


@dataclass(frozen=True, slots=True)
class GroupLabels:
    """The family and fill-bucket label of each work-set id, for the per-group counts."""

    family: Mapping[str, str]
    fill: Mapping[str, str]


def fill_label(fill: float | None) -> str:
    """The fill bucket an id is counted under (``"unknown"`` without a fill)."""
    return "unknown" if fill is None else f"{fill:.2f}"


def group_labels(items: Iterable[ItemMeta]) -> GroupLabels:
    """Labels of every item (computed once per cell, shared by the AC, AB and BC reports)."""
    family: dict[str, str] = {}
    fill: dict[str, str] = {}
    for m in items:
        family[m.test_id] = m.family or "unknown"
        fill[m.test_id] = fill_label(m.fill)
    return GroupLabels(family, fill)
