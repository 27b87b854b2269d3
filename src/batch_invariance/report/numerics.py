"""The report's view of a cert's ``numerics`` block, and its two small SVG drawings: a rows x
passes grid (bitwise equal / logprob drift / token flip / no logprobs) and the risk curve.

Pure. Reads only documented JSON fields of an already verified cert; a cert without the
block (or with one that cannot be read) gets ``None`` and the views say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Literal

from batch_invariance.report.fields import dig, integer, num

RowState = Literal["equal", "drift", "flip", "missing"]
STATE_COLOURS: dict[str, str] = {
    "equal": "#1b7f3b",
    "drift": "#e0a100",
    "flip": "#c62828",
    "missing": "#b0b7c0",
}
_CELL = 9
_GAP = 1
_LABEL = 44


@dataclass(frozen=True)
class PassDrift:
    """AC in one pass: rows compared, rows whose logprobs drifted, rows with a token flip."""

    index: int
    rows_compared: int
    rows_with_drift: int
    rows_with_token_flip: int
    max_abs_delta: float | None


@dataclass(frozen=True)
class NumericsView:
    statement: str
    passes: tuple[PassDrift, ...]
    #: One entry per id (sorted): its state in each pass, in ``passes`` order.
    grid: tuple[tuple[str, tuple[RowState, ...]], ...]
    flip_probability: float | None
    #: (tokens, implied share of answers whose tokens change).
    curve: tuple[tuple[int, float], ...]


def _state(row: Mapping[str, Any] | None, missing: bool) -> RowState:
    if missing:
        return "missing"
    if row is None:
        return "equal"
    if row.get("token_flip") is not None:
        return "flip"
    return "drift" if row.get("first_drift") is not None else "equal"


def numerics_view(data: Mapping[str, Any]) -> NumericsView | None:
    """The view of ``data["numerics"]``; ``None`` when the cert has no readable block."""
    block = data.get("numerics")
    ac = dig(data, "numerics", "AC")
    if not isinstance(block, Mapping) or not isinstance(ac, Mapping):
        return None
    passes: list[PassDrift] = []
    for p in ac.get("per_pass") or []:
        index = integer(p.get("pass_index"))
        if index is None:
            return None
        passes.append(
            PassDrift(
                index,
                integer(p.get("rows_compared")) or 0,
                integer(p.get("rows_with_drift")) or 0,
                integer(p.get("rows_with_token_flip")) or 0,
                num(p.get("max_abs_delta")),
            )
        )
    rows = {(r.get("test_id"), r.get("pass_index")): r for r in ac.get("rows") or []}
    missing = set(ac.get("ids_without_logprobs") or [])
    a_ids = sorted(dig(data, "evidence", "a") or {})
    grid = tuple(
        (tid, tuple(_state(rows.get((tid, p.index)), tid in missing) for p in passes))
        for tid in a_ids
    )
    found = block.get("risk")
    risk: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    curve = tuple(
        (integer(pt.get("tokens")) or 0, num(pt.get("answer_change_share")) or 0.0)
        for pt in risk.get("curve") or []
    )
    return NumericsView(
        statement=str(block.get("statement") or ""),
        passes=tuple(passes),
        grid=grid,
        flip_probability=num(risk.get("per_token_flip_probability")),
        curve=curve,
    )


def grid_svg(view: NumericsView) -> str:
    """Rows (ids, down) x C passes (across): which rows drifted and which flipped a token."""
    n_rows, n_cols = len(view.grid), len(view.passes)
    width = _LABEL + n_cols * (_CELL + _GAP) + 150
    height = 24 + n_rows * (_CELL + _GAP) + 8
    parts = [
        f'<svg class="numerics-grid" width="{width}" '
        f'height="{height}" role="img" aria-label="rows x passes: logprob drift and token '
        f'flips"><text x="0" y="12" font-size="11">rows x passes</text>'
    ]
    for k, p in enumerate(view.passes):
        x = _LABEL + k * (_CELL + _GAP)
        parts.append(f'<text x="{x}" y="22" font-size="9">C{p.index}</text>')
    for r, (tid, states) in enumerate(view.grid):
        y = 24 + r * (_CELL + _GAP)
        for k, state in enumerate(states):
            x = _LABEL + k * (_CELL + _GAP)
            parts.append(
                f'<rect class="cell-{state}" x="{x}" y="{y}" width="{_CELL}" height="{_CELL}" '
                f'fill="{STATE_COLOURS[state]}"><title>{escape(tid)} C{view.passes[k].index}: '
                f"{state}</title></rect>"
            )
    legend_x = _LABEL + n_cols * (_CELL + _GAP) + 12
    for k, name in enumerate(STATE_COLOURS):
        y = 24 + k * 14
        parts.append(
            f'<rect x="{legend_x}" y="{y}" width="9" height="9" fill="{STATE_COLOURS[name]}"/>'
            f'<text x="{legend_x + 14}" y="{y + 8}" font-size="10">{name}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def risk_svg(view: NumericsView, width: int = 320, height: int = 160) -> str:
    """The implied share of answers changing vs answer length (log x), 0..100%."""
    if not view.curve:
        return '<p class="muted">risk not estimated (no logprobs to compare)</p>'
    left, right, top, bottom = 40, 12, 14, 28
    lo, hi = math.log2(view.curve[0][0]), math.log2(view.curve[-1][0])
    span = (hi - lo) or 1.0

    def xy(tokens: int, share: float) -> tuple[float, float]:
        x = left + (math.log2(tokens) - lo) / span * (width - left - right)
        return x, top + (1.0 - share) * (height - top - bottom)

    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, s) for t, s in view.curve))
    ticks = "".join(
        f'<text x="{xy(t, 0.0)[0]:.1f}" y="{height - 12}" font-size="9" '
        f'text-anchor="middle">{t}</text>'
        for t, _ in view.curve
    )
    return (
        f'<svg class="risk-curve" width="{width}" '
        f'height="{height}" role="img" aria-label="estimated share of answers changing vs '
        f'answer length"><line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
        f'y2="{height - bottom}" stroke="#888"/><line x1="{left}" y1="{top}" x2="{left}" '
        f'y2="{height - bottom}" stroke="#888"/><text x="{left - 4}" y="{top + 4}" '
        f'font-size="9" text-anchor="end">100%</text><text x="{left - 4}" '
        f'y="{height - bottom}" font-size="9" text-anchor="end">0%</text>'
        f'<polyline fill="none" stroke="#b86e00" stroke-width="2" points="{points}"/>{ticks}'
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 3}" font-size="9" '
        'text-anchor="middle">answer tokens (estimate, never a gate)</text></svg>'
    )


def pass_table_rows(view: NumericsView) -> Sequence[str]:
    """One plain-text line per pass: rows with drift and token flips, max |delta|."""
    return [
        f"C{p.index}: drift on {p.rows_with_drift}/{p.rows_compared} rows, token flip on "
        f"{p.rows_with_token_flip}, max |delta| "
        f"{'-' if p.max_abs_delta is None else f'{p.max_abs_delta:.3g}'}"
        for p in view.passes
    ]
