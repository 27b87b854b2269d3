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

#: A flip whose top-1 minus top-2 logprob margin (on either side) is below this many nats is
#: a near-tie: a tiny numerical change in the batched kernels is enough to swap the argmax.
TIE_FLIP_MARGIN = 0.1

#: Characters of context kept on each side of the first divergent token in the text views.
CONTEXT_CHARS = 240

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
class TextSide:
    """One side of a divergent answer split at the first divergent token.

    ``token`` is ``None`` when tokens were not recorded (then ``before`` holds the excerpt).
    """

    before: str
    token: str | None
    after: str
    margin: float | None


@dataclass(frozen=True)
class DivergentId:
    test_id: str
    kind: str
    field: str
    passes: tuple[int, ...]
    shown_pass: int | None
    first_token: int | None
    a: TextSide
    c: TextSide
    flip: str


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

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(cell for group in self.groups for cell in group.cells)

    @property
    def signature_problems(self) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.signature.state in ("failed", "error"))


class _Unreadable(Exception):
    """A field the report needs is absent or of the wrong type."""


def _dig(data: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = data
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _need_int(data: Mapping[str, Any], key: str) -> int:
    value = _int(data.get(key))
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
    bound = _num(sens.get("rate_upper_bound_95"))
    observed = _num(sens.get("observed_rate"))
    distinct = _int(sens.get("n_distinct_prompts"))
    if bound is not None:
        n = distinct if distinct is not None else _int(sens.get("n_hot_trials"))
        over = "distinct prompts" if distinct is not None else "hot comparisons"
        count = f", {n} {over}" if n is not None else ""
        return RateFigure("bound", bound, 0.0, bound, n, f"<= {_fmt(bound)} (95% bound{count})")
    if observed is not None:
        low = _num(sens.get("ci95_low"))
        high = _num(sens.get("ci95_high"))
        n = _int(sens.get("n_scored_comparisons"))
        low_v = observed if low is None else low
        high_v = observed if high is None else high
        interval = "" if low is None or high is None else f" [{_fmt(low_v)}, {_fmt(high_v)}]"
        k = _int(sens.get("n_ac_divergent"))
        of = f" ({k} of {n} comparisons)" if k is not None and n is not None else ""
        return RateFigure("observed", observed, low_v, high_v, n, f"{_fmt(observed)}{interval}{of}")
    return None


def throughput_of(data: Mapping[str, Any]) -> Throughput | None:
    block = data.get("throughput")
    if not isinstance(block, Mapping):
        return None
    return Throughput(
        serial_tokens_per_s=_num(block.get("serial_tokens_per_s")),
        concurrent_tokens_per_s=_num(block.get("concurrent_tokens_per_s")),
        speedup=_num(block.get("speedup")),
    )


def answer_length_of(data: Mapping[str, Any]) -> AnswerLength | None:
    scope = data.get("promotion_scope")
    if not isinstance(scope, Mapping):
        return None
    found = AnswerLength(
        min=_int(scope.get("answer_tokens_min")),
        median=_int(scope.get("answer_tokens_median")),
        max=_int(scope.get("answer_tokens_max")),
        share_cut_by_budget=_num(scope.get("share_cut_by_budget")),
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
        ok = _dig(gate, "ok") if isinstance(gate, Mapping) else None
        reason = _dig(gate, "reason") if isinstance(gate, Mapping) else None
        rows.append(
            GateRow(
                name=str(name),
                ok=ok if isinstance(ok, bool) else None,
                reason=reason if isinstance(reason, str) else "(no reason recorded)",
            )
        )
    return tuple(rows)


def _trial(data: Mapping[str, Any], arm: str, pass_index: int | None) -> Mapping[str, Any] | None:
    evidence = data.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    if arm == "a":
        found = evidence.get("a")
        return found if isinstance(found, Mapping) else None
    for record in evidence.get("c_passes") or ():
        if isinstance(record, Mapping) and record.get("index") == pass_index:
            trials = record.get("trials")
            return trials if isinstance(trials, Mapping) else None
    return None


def _clip_left(text: str) -> str:
    return text if len(text) <= CONTEXT_CHARS else "…" + text[-CONTEXT_CHARS:]


def _clip_right(text: str) -> str:
    return text if len(text) <= CONTEXT_CHARS else text[:CONTEXT_CHARS] + "…"


def _side(
    trial: Mapping[str, Any] | None, position: int | None, margin: Any, fallback: Any
) -> TextSide:
    """Split a trial's recorded tokens at ``position``; without tokens show the excerpt."""
    shown_margin = _num(margin)
    tokens = trial.get("tokens") if isinstance(trial, Mapping) else None
    if trial is None:
        return TextSide("(no answer in this arm)", None, "", shown_margin)
    if (
        position is None
        or not isinstance(tokens, list)
        or not all(isinstance(t, str) for t in tokens)
    ):
        text = trial.get("completion_excerpt")
        if not isinstance(text, str):
            text = fallback if isinstance(fallback, str) else ""
        return TextSide(_clip_right(text), None, "", shown_margin)
    if shown_margin is None:
        margins = trial.get("top_margins")
        if isinstance(margins, list) and position < len(margins):
            shown_margin = _num(margins[position])
    before = "".join(tokens[:position])
    token = tokens[position] if position < len(tokens) else ""
    after = "".join(tokens[position + 1 :])
    return TextSide(_clip_left(before), token, _clip_right(after), shown_margin)


def flip_kind(a_margin: float | None, c_margin: float | None) -> str:
    """``tie flip`` when either recorded margin is below :data:`TIE_FLIP_MARGIN`."""
    known = [m for m in (a_margin, c_margin) if m is not None]
    if not known:
        return "margin not recorded"
    smallest = min(known)
    if smallest < TIE_FLIP_MARGIN:
        return f"tie flip (top1-top2 margin {smallest:.3g} < {TIE_FLIP_MARGIN})"
    return f"confident flip (top1-top2 margin {smallest:.3g} >= {TIE_FLIP_MARGIN})"


def divergent_ids(data: Mapping[str, Any]) -> tuple[DivergentId, ...]:
    """One entry per id that differed between A and C, shown at its first divergent pass."""
    ac = _dig(data, "divergence_report", "AC")
    if not isinstance(ac, Mapping):
        return ()
    rows = [r for r in ac.get("per_id") or () if isinstance(r, Mapping)]
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        test_id = row.get("test_id")
        if isinstance(test_id, str):
            by_id.setdefault(test_id, []).append(row)
    out = []
    for test_id in sorted(by_id):
        id_rows = by_id[test_id]
        # Invariant differences first: an id that also had token-only passes is divergent.
        ranked = sorted(
            id_rows,
            key=lambda r: (r.get("kind") == "token_only", _int(r.get("pass_index")) or 0),
        )
        first = ranked[0]
        kind = str(first.get("kind"))
        passes = tuple(
            sorted(
                {
                    p
                    for r in id_rows
                    if (p := _int(r.get("pass_index"))) is not None
                    and (kind == "token_only" or r.get("kind") != "token_only")
                }
            )
        )
        shown_pass = _int(first.get("pass_index"))
        position = _int(first.get("first_divergent_token"))
        a_trials = _trial(data, "a", None)
        c_trials = _trial(data, "c", shown_pass)
        a_side = _side(
            a_trials.get(test_id) if a_trials else None,
            position,
            first.get("x_top_margin"),
            first.get("x_excerpt"),
        )
        c_side = _side(
            c_trials.get(test_id) if c_trials else None,
            position,
            first.get("y_top_margin"),
            first.get("y_excerpt"),
        )
        out.append(
            DivergentId(
                test_id=test_id,
                kind=kind,
                field=str(first.get("field")),
                passes=passes,
                shown_pass=shown_pass,
                first_token=position,
                a=a_side,
                c=c_side,
                flip=flip_kind(a_side.margin, c_side.margin),
            )
        )
    return tuple(out)


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
        promotable=item.promotable,
        n_passes=_int(data.get("n_passes")) or 0,
        rate=rate_figure(data),
        throughput=throughput_of(data),
        answer_length=answer_length_of(data),
        signature=item.signature,
        scope=str(_dig(data, "promotion_scope", "valid_for") or "(scope not recorded)"),
        decision_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        gates=gate_rows(data),
        divergent=divergent_ids(data),
        duplicate=False,
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
    return Report(groups=groups, invalid=tuple(invalid))
