"""Pairwise comparison of arms: the AC, AB and BC reports (pure).

A *comparison* sets one trial of the reference arm ``x`` against the trial with the same id in
one map of ``y`` (for AC and BC, each C pass is one map and the report is the union over
passes). Each comparison is exactly one of:

* **skipped** - either side is a transport failure: nothing was produced to judge, so it is
  neither a divergence nor a clean comparison;
* **divergent** - the id is present in only one of the two maps, or any invariant field
  differs (exact equality, never a tolerance);
* **token-only** - invariant fields equal but the content differs (sha256 of the completion,
  or the generated tokens);
* **clean** - otherwise.

An id is divergent in a union report when it diverged in ANY pass, token-only when it was
token-only in some pass and divergent in none.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batch_invariance.core.columns import (
    ArmColumns,
    GroupLabels,
    agreement_key,
    arm_columns,
    fill_label,
    group_labels,
    key_map,
    unequal_ids,
)
from batch_invariance.core.evidence import INVARIANT_FIELDS, TRANSPORT_MODES, ItemMeta, Trial
from batch_invariance.core.pair_report import (
    DivergenceRow,
    GroupCount,
    Outcome,
    PassCount,
    RowKind,
    Scalar,
)
from batch_invariance.core.pair_report import PairReport as PairReport  # the report type

__all__ = [
    "EXCERPT_CHARS",
    "classify",
    "compare",
    "compare_columns",
    "content_key",
    "diff_pair",
    "differing_fields",
    "excerpt",
    "first_divergent_token",
    "same_value",
]


#: Length of the completion excerpts carried in per-id rows (first characters, no marker, so
#: that an excerpt of an excerpt is the excerpt itself).
EXCERPT_CHARS = 80


def content_key(trial: Trial) -> str | None:
    """The sha256 of the completion: the recorded one, else computed from the text."""
    if trial.content_sha256 is not None:
        return trial.content_sha256
    if trial.completion is not None:
        return hashlib.sha256(trial.completion.encode("utf-8")).hexdigest()
    return None


def excerpt(trial: Trial | None) -> str | None:
    """The first :data:`EXCERPT_CHARS` characters of the completion, when known."""
    if trial is None or trial.completion is None:
        return None
    return trial.completion[:EXCERPT_CHARS]


def same_value(a: Any, b: Any) -> bool:
    """Exact equality that also tells ``1`` from ``True`` and treats NaN as equal to itself."""
    if type(a) is not type(b) and (isinstance(a, bool) or isinstance(b, bool)):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _fast_key(t: Trial) -> tuple[Any, ...]:
    """The invariant record with a bool marker on the fields where ``1 == True`` could hide
    a change. Equal keys imply no differing field; unequal keys (NaN included) fall back to
    the field-by-field check. Spelled out for speed: this runs once per comparison."""
    s, p, n = t.score, t.passed, t.prompt_tokens_measured
    return (
        s,
        s.__class__ is bool,
        p,
        p.__class__ is bool,
        t.extracted_answer,
        t.expected_answer,
        n,
        n.__class__ is bool,
        t.failure_mode,
    )


def differing_fields(x: Trial, y: Trial) -> tuple[str, ...]:
    """The invariant fields on which ``x`` and ``y`` differ."""
    if _fast_key(x) == _fast_key(y):
        return ()
    return tuple(
        name for name in INVARIANT_FIELDS if not same_value(getattr(x, name), getattr(y, name))
    )


def first_divergent_token(x: Sequence[str], y: Sequence[str]) -> int | None:
    """First index where two token streams differ (a length difference counts); else None."""
    for i, (a, b) in enumerate(zip(x, y, strict=False)):
        if a != b:
            return i
    if len(x) != len(y):
        return min(len(x), len(y))
    return None


def _margin_at(trial: Trial, index: int | None) -> float | None:
    if index is None or trial.top_margins is None or index >= len(trial.top_margins):
        return None
    return trial.top_margins[index]


def _content_differs(x: Trial, y: Trial) -> bool:
    kx, ky = content_key(x), content_key(y)
    if kx is not None and ky is not None and kx != ky:
        return True
    if x.tokens is not None and y.tokens is not None:
        return tuple(x.tokens) != tuple(y.tokens)
    return False


def _row(
    test_id: str, pass_index: int | None, x: Trial | None, y: Trial | None, kind: RowKind
) -> DivergenceRow:
    fields: tuple[str, ...] = ()
    xv: Scalar
    yv: Scalar
    if kind == "missing":
        field = "presence"
        xv = "present" if x is not None else "absent"
        yv = "present" if y is not None else "absent"
    elif kind == "invariant":
        assert x is not None and y is not None
        fields = differing_fields(x, y)
        field = fields[0]
        xv, yv = getattr(x, field), getattr(y, field)
    else:
        field = "content"
        assert x is not None and y is not None
        xv, yv = content_key(x), content_key(y)
    token_identical: bool | None = None
    fdt: int | None = None
    if x is not None and y is not None and x.tokens is not None and y.tokens is not None:
        fdt = first_divergent_token(x.tokens, y.tokens)
        token_identical = fdt is None
    return DivergenceRow(
        test_id=test_id,
        pass_index=pass_index,
        kind=kind,
        field=field,
        fields=fields,
        x=xv,
        y=yv,
        x_content_sha=None if x is None else content_key(x),
        y_content_sha=None if y is None else content_key(y),
        token_identical=token_identical,
        first_divergent_token=fdt,
        x_top_margin=None if x is None else _margin_at(x, fdt),
        y_top_margin=None if y is None else _margin_at(y, fdt),
        x_excerpt=excerpt(x),
        y_excerpt=excerpt(y),
    )


_Facts = tuple[Trial, tuple[Any, ...], "str | None", bool]


def _facts(t: Trial) -> _Facts:
    return (t, _fast_key(t), content_key(t), t.failure_mode in TRANSPORT_MODES)


def _outcome(xf: _Facts, yf: _Facts) -> Outcome:
    """:func:`classify` for two present trials, on precomputed facts."""
    if xf[3] or yf[3]:
        return "skipped"
    x, y = xf[0], yf[0]
    if xf[1] != yf[1] and differing_fields(x, y):
        return "divergent"
    kx, ky = xf[2], yf[2]
    if kx is not None and ky is not None and kx != ky:
        return "token_only"
    if x.tokens is not None and y.tokens is not None and tuple(x.tokens) != tuple(y.tokens):
        return "token_only"
    return "clean"


def classify(x: Trial | None, y: Trial | None) -> Outcome:
    """The outcome of one comparison (see the module docstring)."""
    if x is None or y is None:
        return "divergent"
    if x.is_transport_failure or y.is_transport_failure:
        return "skipped"
    if differing_fields(x, y):
        return "divergent"
    if _content_differs(x, y):
        return "token_only"
    return "clean"


def compare(
    pair: str,
    x: Mapping[str, Trial],
    ys: Sequence[tuple[int | None, Mapping[str, Trial]]],
    items: Iterable[ItemMeta] = (),
) -> PairReport:
    """Compare ``x`` with each map in ``ys`` (``(pass_index, map)``) and report the union.

    The result depends only on the contents of the maps, never on their iteration order:
    every id list in the report is sorted, rows are sorted by (id, pass).
    """
    columns = [(i, arm_columns(y, keyed=False)) for i, y in ys]
    return compare_columns(pair, arm_columns(x), columns, group_labels(items))


@dataclass
class _Tally:
    """What :func:`compare_columns` gathers over the passes (local to one call)."""

    divergent: set[str] = field(default_factory=set)
    token_only: set[str] = field(default_factory=set)
    compared: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    only_x: set[str] = field(default_factory=set)
    only_y: set[str] = field(default_factory=set)
    rows: list[DivergenceRow] = field(default_factory=list)
    per_pass: list[PassCount] = field(default_factory=list)
    x_compared: bool = False


def _visit_id(
    t: _Tally, test_id: str, pass_index: int | None, xt: Trial | None, yt: Trial | None
) -> Outcome:
    """One id whose keys differ (or that one side lacks): its outcome, its row recorded. A
    missing id is a divergence."""
    if xt is None or yt is None:
        (t.only_y if xt is None else t.only_x).add(test_id)
        t.rows.append(_row(test_id, pass_index, xt, yt, "missing"))
        return "divergent"
    outcome = _outcome(_facts(xt), _facts(yt))
    if outcome == "divergent":
        t.rows.append(_row(test_id, pass_index, xt, yt, "invariant"))
    elif outcome == "token_only":
        t.token_only.add(test_id)
        t.rows.append(_row(test_id, pass_index, xt, yt, "token_only"))
    return outcome


def _tally_pass(
    t: _Tally,
    xa: ArmColumns,
    xk: Mapping[str, tuple[Any, ...]],
    pass_index: int | None,
    ya: ArmColumns,
    pass_unequal: Sequence[str],
) -> None:
    """One pass of ``ya`` against ``xa``: only ids with unequal keys and missing ids are
    visited; ids with equal keys are clean (or the same transport failure: skipped)."""
    x, y = xa.trials, ya.trials
    counts = {"divergent": 0, "token_only": 0, "clean": 0, "skipped": 0}
    pass_skipped = {
        tid for tid in xa.transport if tid in y and xk[tid] == agreement_key(y[tid])
    }  # equal keys: both sides are the same transport failure
    pass_divergent: set[str] = set()
    pass_only_y = [tid for tid in pass_unequal if tid not in xk]
    # y holds len(y) - len(pass_only_y) of x's ids; look for the others only if some miss.
    missing_y = xk.keys() - y.keys() if len(y) - len(pass_only_y) < len(xk) else ()
    for test_id in (*pass_unequal, *missing_y):
        outcome = _visit_id(t, test_id, pass_index, x.get(test_id), y.get(test_id))
        counts[outcome] += 1
        if outcome == "skipped":
            pass_skipped.add(test_id)
        elif outcome == "divergent":
            pass_divergent.add(test_id)
    n_equal = len(ya.ids) - len(pass_unequal)
    n_equal_skipped = len(pass_skipped) - counts["skipped"]
    counts["skipped"] += n_equal_skipped
    counts["clean"] += n_equal - n_equal_skipped
    t.divergent |= pass_divergent
    t.skipped |= pass_skipped
    if pass_skipped:
        t.compared |= (xk.keys() | y.keys()) - pass_skipped
    else:
        # x's ids and y's ids are x's ids and those only in y: add x's once.
        if not t.x_compared:
            t.compared.update(xk.keys())
            t.x_compared = True
        t.compared.update(pass_only_y)
    if pass_index is not None:
        t.per_pass.append(
            PassCount(
                index=pass_index,
                n_compared=counts["divergent"] + counts["token_only"] + counts["clean"],
                n_divergent=counts["divergent"],
                n_token_only=counts["token_only"],
                n_skipped=counts["skipped"],
            )
        )


def compare_columns(
    pair: str,
    xa: ArmColumns,
    ys: Sequence[tuple[int | None, ArmColumns]],
    labels: GroupLabels,
    unequal: Sequence[Sequence[str]] | None = None,
) -> PairReport:
    """:func:`compare` on arms already read into columns, with the items' labels.

    Ids whose agreement keys are equal are clean (or skipped) without a per-id step; only
    ids with unequal keys and missing ids are visited (the logprobs are compared by
    :mod:`batch_invariance.core.numerics`).
    ``unequal``, when given, is :func:`~batch_invariance.core.columns.unequal_ids` of ``xa``
    and each map of ``ys``, already computed."""
    t = _Tally()
    xk = key_map(xa)
    for k, (pass_index, ya) in enumerate(ys):
        pass_unequal = unequal_ids(xa, ya) if unequal is None else unequal[k]
        _tally_pass(t, xa, xk, pass_index, ya, pass_unequal)
    divergent, token_only, compared = t.divergent, t.token_only - t.divergent, t.compared
    n_compared = len(compared)
    rows = sorted(t.rows, key=lambda r: (r.test_id, -1 if r.pass_index is None else r.pass_index))
    by_family, by_fill = _group_counts(compared, divergent, token_only, labels)
    return PairReport(
        pair=pair,
        n_compared=n_compared,
        n_divergent=len(divergent),
        divergence_rate=(len(divergent) / n_compared) if n_compared else 0.0,
        divergent_ids=tuple(sorted(divergent)),
        only_x=tuple(sorted(t.only_x)),
        only_y=tuple(sorted(t.only_y)),
        n_token_only=len(token_only),
        token_divergence_ids=tuple(sorted(token_only)),
        transport_skipped_ids=tuple(sorted(t.skipped)),
        per_id=tuple(rows),
        by_family=by_family,
        by_fill=by_fill,
        per_pass=tuple(sorted(t.per_pass, key=lambda p: p.index)),
    )


def _group_counts(
    compared: set[str], divergent: set[str], token_only: set[str], labels: GroupLabels
) -> tuple[dict[str, GroupCount], dict[str, GroupCount]]:
    """Compared, divergent and token-only ids per family and per fill bucket (divergent and
    token-only ids are among the compared ones). Ids without an item count as unknown."""
    tables = []
    # Every id compared and each one labelled (the usual case): the label counts are the
    # label sizes. Family and fill label the same ids, so one check serves both.
    everything = len(compared) == len(labels.family) and labels.family.keys() >= compared
    for label_of, members, default in (
        (labels.family, labels.family_ids, "unknown"),
        (labels.fill, labels.fill_ids, fill_label(None)),
    ):
        if everything:
            n = {label: len(ids) for label, ids in members.items() if ids}
        else:
            n = {label: k for label, ids in members.items() if (k := len(ids & compared))}
        unlabelled = len(compared) - sum(n.values())
        if unlabelled:
            n[default] = n.get(default, 0) + unlabelled
        get = label_of.get
        d = Counter(get(t, default) for t in divergent)
        o = Counter(get(t, default) for t in token_only)
        tables.append({k: GroupCount(n[k], d[k], o[k]) for k in sorted(n)})
    return tables[0], tables[1]


def diff_pair(
    pair: str,
    x: Mapping[str, Trial],
    y: Mapping[str, Trial],
    items: Iterable[ItemMeta] = (),
) -> PairReport:
    """Compare two single maps (AB, or A against its serial repeat)."""
    return compare(pair, x, [(None, y)], items)
