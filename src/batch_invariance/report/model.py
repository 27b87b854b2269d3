"""The report model: certs (already read and checked by the shell) -> typed rows to render.

Pure. It reads only the JSON fields documented in ``docs/output-contract.md`` and tolerates
blocks a cert may lack (``throughput``, ``promotion_scope.answer_tokens_*``, recorded tokens
or margins): an absent block becomes ``None`` and the views say "not measured". A cert whose
fields cannot be read is listed as invalid, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from batch_invariance.cert.certificate import display_verdict
from batch_invariance.core.compare import CellSide
from batch_invariance.report.divergence import DivergentId, divergent_ids
from batch_invariance.report.fields import dig, integer, num
from batch_invariance.report.history import CellHistory, histories
from batch_invariance.report.lengths import LengthView, length_view
from batch_invariance.report.numerics import NumericsView, numerics_view

__all__ = [
    "AnswerLength",
    "Cell",
    "CellGroup",
    "GateRow",
    "InvalidCert",
    "LoadedCert",
    "RateFigure",
    "Report",
    "Signature",
    "SignatureState",
    "Throughput",
    "answer_length_of",
    "build_report",
    "gate_rows",
    "rate_figure",
    "throughput_of",
]

SignatureState = Literal["unsigned", "present", "verified", "failed", "error"]


@dataclass(frozen=True)
class Signature:
    """What is known about the sigstore bundle beside a cert."""

    state: SignatureState
    detail: str


@dataclass(frozen=True)
class LoadedCert:
    """One input as the shell found it: the cert JSON when it verified, else the problem."""

    origin: str
    data: Mapping[str, Any] | None
    problem: str | None
    promotable: bool
    signature: Signature
    #: Its arm A and what makes it comparable, for the history over builds (``None``: invalid).
    side: CellSide | None = None


@dataclass(frozen=True)
class RateFigure:
    """The divergence rate of a cell: a bound (nothing diverged) or an observed rate.

    ``low``..``high`` is the 95% interval the plot draws (``0``..bound for a bound).
    """

    kind: Literal["bound", "observed"]
    value: float
    low: float
    high: float
    n: int | None
    text: str


@dataclass(frozen=True)
class Throughput:
    """The cert's ``throughput`` block, when it has one (tokens per second)."""

    serial_tokens_per_s: float | None
    concurrent_tokens_per_s: float | None
    speedup: float | None


@dataclass(frozen=True)
class AnswerLength:
    """``promotion_scope.answer_tokens_*``: answer lengths the cell actually measured."""

    min: int | None
    median: int | None
    max: int | None
    share_cut_by_budget: float | None


@dataclass(frozen=True)
class GateRow:
    name: str
    ok: bool | None
    reason: str


@dataclass(frozen=True)
class Cell:
    origin: str
    model: str
    ctx: int
    n: int
    status: str
    verdict: str
    source: str
    promotable: bool
    n_passes: int
    rate: RateFigure | None
    throughput: Throughput | None
    answer_length: AnswerLength | None
    signature: Signature
    scope: str
    decision_reasons: tuple[str, ...]
    gates: tuple[GateRow, ...]
    divergent: tuple[DivergentId, ...]
    duplicate: bool
    #: The cert's ``numerics`` block as drawn (``None`` when it has none).
    numerics: NumericsView | None = None
    #: The cert's ``sequence_scope`` block as drawn (``None``: not recorded).
    lengths: LengthView | None = None


@dataclass(frozen=True)
class CellGroup:
    """Every cell of one model at one ctx, ordered by N."""

    model: str
    ctx: int
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class InvalidCert:
    origin: str
    problem: str


@dataclass(frozen=True)
class Report:
    groups: tuple[CellGroup, ...]
    invalid: tuple[InvalidCert, ...]
    #: Cells measured more than once (several builds), each build against the one before.
    histories: tuple[CellHistory, ...] = ()
    #: ``search.json`` records found in the folders given, with where each was read.
    searches: tuple[tuple[Mapping[str, Any], str], ...] = ()

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(cell for group in self.groups for cell in group.cells)

    @property
    def signature_problems(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.signature.state in ("failed", "error"))


class _Unreadable(Exception):
    """A field the report needs is absent or of the wrong type."""


def _need_int(data: Mapping[str, Any], key: str) -> int:
    value = integer(data.get(key))
    if value is None:
        raise _Unreadable(f"field {key!r} is missing or not an integer")
    return value


def _need_str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise _Unreadable(f"field {key!r} is missing or not a string")
    return value


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def rate_figure(data: Mapping[str, Any]) -> RateFigure | None:
    """The bound (no divergence) or observed rate with its interval, from ``sensitivity``."""
    sens = data.get("sensitivity")
    if not isinstance(sens, Mapping):
        return None
    bound = num(sens.get("rate_upper_bound_95"))
    observed = num(sens.get("observed_rate"))
    distinct = integer(sens.get("n_distinct_prompts"))
    if bound is not None:
        n = distinct if distinct is not None else integer(sens.get("n_hot_trials"))
        over = "distinct prompts" if distinct is not None else "hot comparisons"
        count = f", {n} {over}" if n is not None else ""
        return RateFigure("bound", bound, 0.0, bound, n, f"<= {_fmt(bound)} (95% bound{count})")
    if observed is not None:
        low = num(sens.get("ci95_low"))
        high = num(sens.get("ci95_high"))
        n = integer(sens.get("n_scored_comparisons"))
        low_v = observed if low is None else low
        high_v = observed if high is None else high
        interval = "" if low is None or high is None else f" [{_fmt(low_v)}, {_fmt(high_v)}]"
        k = integer(sens.get("n_ac_divergent"))
        of = f" ({k} of {n} comparisons)" if k is not None and n is not None else ""
        return RateFigure("observed", observed, low_v, high_v, n, f"{_fmt(observed)}{interval}{of}")
    return None


def throughput_of(data: Mapping[str, Any]) -> Throughput | None:
    block = data.get("throughput")
    if not isinstance(block, Mapping):
        return None
    return Throughput(
        serial_tokens_per_s=num(block.get("serial_tokens_per_s")),
        concurrent_tokens_per_s=num(block.get("concurrent_tokens_per_s")),
        speedup=num(block.get("speedup")),
    )


def answer_length_of(data: Mapping[str, Any]) -> AnswerLength | None:
    scope = data.get("promotion_scope")
    if not isinstance(scope, Mapping):
        return None
    found = AnswerLength(
        min=integer(scope.get("answer_tokens_min")),
        median=integer(scope.get("answer_tokens_median")),
        max=integer(scope.get("answer_tokens_max")),
        share_cut_by_budget=num(scope.get("share_cut_by_budget")),
    )
    if found.min is None and found.median is None and found.max is None:
        return None
    return found


def gate_rows(data: Mapping[str, Any]) -> tuple[GateRow, ...]:
    gates = data.get("gates")
    if not isinstance(gates, Mapping):
        raise _Unreadable("field 'gates' is missing")
    rows = []
    for name in sorted(gates):
        gate = gates[name]
        ok = dig(gate, "ok") if isinstance(gate, Mapping) else None
        reason = dig(gate, "reason") if isinstance(gate, Mapping) else None
        rows.append(
            GateRow(
                name=str(name),
                ok=ok if isinstance(ok, bool) else None,
                reason=reason if isinstance(reason, str) else "(no reason recorded)",
            )
        )
    return tuple(rows)


def _cell(item: LoadedCert, data: Mapping[str, Any]) -> Cell:
    status = _need_str(data, "status")
    reasons = data.get("decision_reasons")
    return Cell(
        origin=item.origin,
        model=_need_str(data, "model"),
        ctx=_need_int(data, "ctx"),
        n=_need_int(data, "dispatch_n"),
        status=status,
        verdict=display_verdict(status),
        source=_need_str(data, "source"),
        # A bundle that does not verify for the asked identity takes promotion away.
        promotable=item.promotable and item.signature.state != "failed",
        n_passes=integer(data.get("n_passes")) or 0,
        rate=rate_figure(data),
        throughput=throughput_of(data),
        answer_length=answer_length_of(data),
        signature=item.signature,
        scope=str(dig(data, "promotion_scope", "valid_for") or "(scope not recorded)"),
        decision_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        gates=gate_rows(data),
        divergent=divergent_ids(data),
        duplicate=False,
        numerics=numerics_view(data),
        lengths=length_view(data),
    )


def build_report(items: Sequence[LoadedCert]) -> Report:
    """Group the valid certs by (model, ctx), order each group by N; name the invalid ones."""
    cells: list[Cell] = []
    invalid: list[InvalidCert] = []
    for item in items:
        if item.data is None:
            # CertInvalid messages start with the path; the report shows it beside them.
            problem = (item.problem or "not a valid cert").removeprefix(f"{item.origin}: ")
            invalid.append(InvalidCert(item.origin, problem))
            continue
        try:
            cells.append(_cell(item, item.data))
        except (_Unreadable, TypeError, ValueError, AttributeError) as exc:
            invalid.append(InvalidCert(item.origin, f"cannot be reported: {exc}"))
    seen: dict[tuple[str, int, int], int] = {}
    for cell in cells:
        key = (cell.model, cell.ctx, cell.n)
        seen[key] = seen.get(key, 0) + 1
    grouped: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        dup = seen[(cell.model, cell.ctx, cell.n)] > 1
        marked = replace(cell, duplicate=True) if dup else cell
        grouped.setdefault((cell.model, cell.ctx), []).append(marked)
    groups = tuple(
        CellGroup(model, ctx, tuple(sorted(group, key=lambda c: (c.n, c.origin))))
        for (model, ctx), group in sorted(grouped.items())
    )
    sides = [item.side for item in items if item.data is not None and item.side is not None]
    return Report(groups=groups, invalid=tuple(invalid), histories=histories(sides))
