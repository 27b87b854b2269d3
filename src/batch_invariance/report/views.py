"""Short texts shared by every view of the report (HTML, Markdown, JSON). Pure."""

from __future__ import annotations

import re

from batch_invariance.core.throughput import n_buys_words, verdict_words
from batch_invariance.report.history import CellHistory, HistoryRow
from batch_invariance.report.model import Cell, Report

#: Verdicts in the order the summaries count them.
VERDICT_ORDER = ("RED", "UNVERIFIED", "AMBER", "GREEN")

_ANCHOR_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def cell_anchor(cell: Cell) -> str:
    """A stable element id for a cell's details (model, ctx, N and its file)."""
    raw = f"cell-{cell.model}-ctx{cell.ctx}-N{cell.n}-{cell.origin}"
    return _ANCHOR_UNSAFE.sub("_", raw)


def _speedup(cell: Cell) -> float | None:
    return None if cell.throughput is None else cell.throughput.speedup


def n_buys_text(cell: Cell) -> str:
    """What the cell's N buys (``N=4 buys 1.72x here``), as every view of a verdict says it."""
    return n_buys_words(cell.verdict, cell.n, _speedup(cell))


def cell_verdict_text(cell: Cell) -> str:
    """The verdict and what N buys: ``GREEN: N=4 buys 1.72x here``."""
    return verdict_words(cell.verdict, cell.n, _speedup(cell))


def answer_length_text(cell: Cell) -> str:
    length = cell.answer_length
    if length is None:
        return "not measured"

    def show(value: int | None) -> str:
        return "?" if value is None else str(value)

    text = f"{show(length.min)} / {show(length.median)} / {show(length.max)} (min/median/max)"
    if length.share_cut_by_budget is not None:
        text += f", {length.share_cut_by_budget:.0%} cut by the token budget"
    return text


def signature_text(cell: Cell) -> str:
    state = cell.signature.state
    detail = cell.signature.detail
    return {
        "unsigned": "unsigned (no bundle)",
        "present": "bundle present, not verified",
        "verified": f"signed, verified ({detail})",
        "failed": f"signature FAILED: {detail}",
        "error": f"signature not checked: {detail}",
    }[state]


def verdict_counts(report: Report) -> tuple[tuple[int, str], ...]:
    """``(count, verdict)`` for each verdict present, in :data:`VERDICT_ORDER`."""
    cells = report.cells
    return tuple(
        (count, verdict)
        for verdict in VERDICT_ORDER
        if (count := sum(1 for c in cells if c.verdict == verdict))
    )


def promotable_text(cell: Cell) -> str:
    """``yes`` / ``no``; a mock cert says why it never can be."""
    if cell.promotable:
        return "yes"
    return "no" if cell.source == "live" else f"no (source {cell.source})"


def history_changed_text(row: HistoryRow) -> str:
    """Against the previous build: answers changed (a scored field), and tokens changed with
    equal answers."""
    if row.answers_changed is None:
        return "n/a" if row.note == "first build" else "not comparable"
    text = f"{row.answers_changed} of {row.compared}"
    return text + (f" (+{row.tokens_changed} tokens only)" if row.tokens_changed else "")


def history_drift_text(row: HistoryRow) -> str:
    """Against the previous build: prompts whose logprobs drifted with equal tokens."""
    if row.drift is None:
        return "n/a" if row.note == "first build" else "not comparable"
    return f"{row.drift} of {row.compared}"


def history_title(history: CellHistory) -> str:
    return f"{history.model} ctx {history.ctx} N {history.n}: {len(history.rows)} builds"
