"""Every arm's trials read once into the columns the comparisons and gates read (pure).

A cell holds about ``ids x (passes + 2)`` trials and every gate and report looks at each of
them; reading the same attributes from every trial in each gate would be most of the cost of
:func:`batch_invariance.core.verdict.decide`. :func:`arm_columns` reads an arm once, with
C-level maps (no per-trial Python step), into an :class:`ArmColumns`; :func:`evidence_columns`
does it for every arm of a cell. The gates and :func:`batch_invariance.core.diff.compare_columns`
only read these columns; the slow reference definitions they are tested against read the
trials themselves (tests/test_core_fast_paths.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import compress, filterfalse, repeat
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
from batch_invariance.core.intervals import SortedIntervals, by_start

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
_FAILURE_MODE = attrgetter("failure_mode")
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
    #: The ids and trials in map order.
    ids: Sequence[str]
    values: Sequence[Trial]
    #: :func:`agreement_key` by id, for an arm others are compared against (``keyed=True``);
    #: else ``None``, and :func:`agreement_keys` computes them where they are compared.
    keys: Mapping[str, tuple[Any, ...]] | None
    #: Ids not genuinely scored (``failure_mode != "ok"``): few in a real run, so the ids
    #: scored are "all but these" rather than a set of every id.
    not_ok: frozenset[str]
    #: Ids whose trial is a transport failure.
    transport: frozenset[str]
    #: The trials with both request timestamps, in map order: ids, dispatch and completion.
    timed_ids: Sequence[str]
    starts: Sequence[float]
    ends: Sequence[float]
    #: Trials missing either timestamp.
    n_untimed: int
    #: Answered (not transport-failed) ids whose server reported no ``timings.cache_n``
    #: (the arm's own keys when that is every id).
    cache_unreported: AbstractSet[str]
    #: Answered ids with a reported ``cache_n`` other than 0.
    cache_reused: AbstractSet[str]
    #: Server-reported generated-token count of each id in ``ids`` (``None`` when unreported).
    answer_tokens: Sequence[int | None]
    #: Ids whose answer the token budget cut (``finish_reason == "length"``).
    cut_by_budget: frozenset[str]


def arm_columns(trials: Mapping[str, Trial], keyed: bool = True) -> ArmColumns:
    """The :class:`ArmColumns` of a map of trials: one C-level map per attribute. ``keyed``
    also maps the agreement keys by id (the reference side of a comparison needs it)."""
    # Lists, not tuples: a tuple built from a map grows by repeated resizing.
    ids = list(trials.keys())
    values = list(trials.values())
    keys = list(map(_AGREEMENT_FIELDS, values)) if keyed else None
    modes = list(map(_KEY_FAILURE_MODE, keys) if keys is not None else map(_FAILURE_MODE, values))
    # Each set below is of the few exceptions; a count or a membership test (C speed, no
    # per-trial call) first tells whether there are any, and most arms have none.
    all_ok = modes.count(OK) == len(modes)
    transport = _EMPTY if all_ok else frozenset(compress(ids, map(_is_transport, modes)))
    starts = list(map(_DISPATCH, values))
    ends = list(map(_COMPLETE, values))
    n_untimed = 0
    if None in starts or None in ends:
        timed = list(map(and_, map(is_not, starts, repeat(None)), map(is_not, ends, repeat(None))))
        n_untimed = timed.count(False)
    cached = _cache_counts(values)
    unreported: AbstractSet[str] = _EMPTY
    reused: AbstractSet[str] = _EMPTY
    if cached.count(0) != len(cached):  # some reported no cache_n, or one other than 0
        if cached.count(None) == len(cached):  # a server that reports none: every id
            unreported = trials.keys()
        elif None in cached:
            unreported = frozenset(compress(ids, map(is_, cached, repeat(None))))
        reported = map(is_not, cached, repeat(None))
        reused = frozenset(compress(ids, map(and_, reported, map(ne, cached, repeat(0)))))
    if transport:  # answered trials only: transport failures are the transport gate's
        unreported, reused = unreported - transport, reused - transport
    finish = list(map(_FINISH, values))
    return ArmColumns(
        trials=trials,
        ids=ids,
        values=values,
        keys=None if keys is None else dict(zip(ids, keys, strict=True)),
        not_ok=_EMPTY if all_ok else frozenset(compress(ids, map(ne, modes, repeat(OK)))),
        transport=transport,
        timed_ids=list(compress(ids, timed)) if n_untimed else ids,
        starts=list(compress(starts, timed)) if n_untimed else starts,
        ends=list(compress(ends, timed)) if n_untimed else ends,
        n_untimed=n_untimed,
        cache_unreported=unreported,
        cache_reused=reused,
        answer_tokens=list(map(_COMPLETION_TOKENS, values)),
        cut_by_budget=frozenset(compress(ids, map(eq, finish, repeat(FINISH_LENGTH))))
        if FINISH_LENGTH in finish
        else _EMPTY,
    )


_EMPTY: frozenset[str] = frozenset()
_is_transport = TRANSPORT_MODES.__contains__


def _cache_counts(values: Sequence[Trial]) -> list[Any]:
    """Each trial's ``timings.get("cache_n")``. ``dict.get`` unbound is twice as fast as a
    method call per trial; a timings mapping that is not a dict takes the general path."""
    timings = list(map(_TIMINGS, values))
    try:
        return list(map(dict.get, timings, repeat("cache_n")))
    except TypeError:
        return list(map(_CACHE_N, timings))


def same_order(x: Sequence[str], y: Sequence[str]) -> bool:
    """Whether two id lists are the same ids in the same order. A live run's arms and passes
    always are (trials follow the work-set), and then they can be compared position by
    position; the check itself runs at C speed (equal strings are mostly the same object)."""
    return x == y


def key_map(arm: ArmColumns) -> Mapping[str, tuple[Any, ...]]:
    """The arm's agreement keys by id."""
    if arm.keys is not None:
        return arm.keys
    return dict(zip(arm.ids, agreement_keys(arm), strict=True))


def agreement_keys(arm: ArmColumns) -> Iterable[tuple[Any, ...]]:
    """The agreement key of each trial, in ``ids`` order. An arm not keyed computes them
    afresh at each comparison: a key that lives only for its comparison costs no garbage
    collector work, which a million stored keys did (more than computing them twice)."""
    if arm.keys is not None:
        return arm.keys.values()
    return map(_AGREEMENT_FIELDS, arm.values)


#: Stands for an id missing from the reference arm; equal to no agreement key.
_ABSENT: tuple[Any, ...] = (object(),)


def unequal_ids(x: ArmColumns, y: ArmColumns) -> list[str]:
    """Ids of ``y`` whose agreement key differs from ``x``'s, or that ``x`` lacks."""
    if same_order(x.ids, y.ids):
        return list(compress(y.ids, map(ne, agreement_keys(x), agreement_keys(y))))
    xk = key_map(x)
    return list(compress(y.ids, map(ne, map(xk.get, y.ids, repeat(_ABSENT)), agreement_keys(y))))


def unequal_via(
    ref_unequal: Iterable[str], agree: AbstractSet[str], x: ArmColumns, y: ArmColumns
) -> list[str]:
    """:func:`unequal_ids` of ``x`` and ``y``, given ``ref_unequal`` (those of a reference arm
    and ``y``) and ``agree``: the ids present in the reference and in ``x`` with equal keys.
    On those, ``y`` differs from ``x`` iff it differs from the reference (B is compared with
    each C pass through A this way); every other id of ``y`` is compared directly."""
    xk = key_map(x)
    others = list(filterfalse(agree.__contains__, y.ids))
    y_keys = map(_AGREEMENT_FIELDS, map(y.trials.__getitem__, others))
    direct = compress(others, map(ne, map(xk.get, others, repeat(_ABSENT)), y_keys))
    return [*filter(agree.__contains__, ref_unequal), *direct]


@dataclass(frozen=True, slots=True)
class PassColumns:
    """One C pass: its record (index, server signal), the columns of its trials, and its
    request intervals sorted by start (read by F1 and F3)."""

    record: PassRecord
    arm: ArmColumns
    intervals: SortedIntervals


def pass_columns(record: PassRecord) -> PassColumns:
    """The :class:`PassColumns` of one pass."""
    arm = arm_columns(record.trials, keyed=False)
    return PassColumns(record, arm, by_start(arm.starts, arm.ends))


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
        a_repeat=None if a_repeat is None else arm_columns(a_repeat, keyed=False),
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
    columns = (p if isinstance(p, PassColumns) else pass_columns(p) for p in passes)
    return tuple(sorted(columns, key=lambda pc: pc.record.index))


def as_evidence_columns(evidence: CellEvidence | EvidenceColumns) -> EvidenceColumns:
    """``evidence`` read into columns, unless it already is."""
    return evidence if isinstance(evidence, EvidenceColumns) else evidence_columns(evidence)


@dataclass(frozen=True, slots=True)
class GroupLabels:
    """The family and fill-bucket label of each work-set id, and the ids under each label,
    for the per-group counts."""

    family: Mapping[str, str]
    fill: Mapping[str, str]
    family_ids: Mapping[str, frozenset[str]]
    fill_ids: Mapping[str, frozenset[str]]


def fill_label(fill: float | None) -> str:
    """The fill bucket an id is counted under (``"unknown"`` without a fill)."""
    return "unknown" if fill is None else f"{fill:.2f}"


def group_labels(items: Iterable[ItemMeta]) -> GroupLabels:
    """Labels of every item (computed once per cell, shared by the AC, AB and BC reports)."""
    metas = list(items)
    ids = [m.test_id for m in metas]
    family = dict(zip(ids, [m.family or "unknown" for m in metas], strict=True))
    fills = [m.fill for m in metas]
    # Each distinct nonzero fill formatted once; zero and None each time (0.0 and -0.0 are
    # equal as keys but are shown differently).
    shown = {value: fill_label(value) for value in set(fills) if value}
    fill = dict(zip(ids, [shown[v] if v else fill_label(v) for v in fills], strict=True))
    return GroupLabels(family, fill, _members(family), _members(fill))


#: Up to this many labels, each label's ids are picked out by one C-level scan.
_FEW_LABELS = 16


def _members(label_of: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """The ids under each label."""
    labels = set(label_of.values())
    if len(labels) == 1:
        return {label: frozenset(label_of) for label in labels}
    if len(labels) <= _FEW_LABELS:
        ids, values = list(label_of), list(label_of.values())
        return {label: frozenset(compress(ids, map(eq, values, repeat(label)))) for label in labels}
    grouped: dict[str, list[str]] = {label: [] for label in labels}
    for test_id, label in label_of.items():
        grouped[label].append(test_id)
    return {label: frozenset(ids) for label, ids in grouped.items()}
