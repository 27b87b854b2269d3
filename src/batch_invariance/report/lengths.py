"""The report's view of a cert's ``sequence_scope`` block: verdict and drift against sequence
length, as a small SVG (one bar per quarter band of the slot: rows compared, rows whose
logprobs drifted, rows whose answer changed; a mark at 3/4 of the slot, where a cell is
covered from, and one at the first drift position).

Pure. Reads only documented JSON fields of an already verified cert; a cert without the
block gets ``None`` and the view says "sequence length: not recorded".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from batch_invariance.report.fields import integer

__all__ = ["BandView", "LengthView", "length_view", "lengths_html"]

_W, _H, _PAD, _BAR = 360, 120, 28, 0.7
_COLOURS = {"rows": "#b0b7c0", "drift": "#e0a100", "changed": "#c62828"}


@dataclass(frozen=True)
class BandView:
    low: int
    high: int
    rows: int
    drift: int
    changed: int
    first_drift: int | None


@dataclass(frozen=True)
class LengthView:
    slot: int
    required: int
    longest: int | None
    first_drift: int | None
    statement: str
    bands: tuple[BandView, ...]


def length_view(data: Mapping[str, Any]) -> LengthView | None:
    """The ``sequence_scope`` block of cert JSON ``data``; ``None`` when absent or unreadable."""
    block = data.get("sequence_scope")
    if not isinstance(block, Mapping):
        return None
    slot, required = integer(block.get("slot_ctx")), integer(block.get("required"))
    bands_raw = block.get("bands")
    if slot is None or required is None or not isinstance(bands_raw, list):
        return None
    bands: list[BandView] = []
    for band in bands_raw:
        if not isinstance(band, Mapping):
            return None
        low, high = integer(band.get("low")), integer(band.get("high"))
        rows, drift = integer(band.get("rows_compared")), integer(band.get("rows_with_drift"))
        changed = integer(band.get("rows_with_changed_answer"))
        if None in (low, high, rows, drift, changed):
            return None
        assert low is not None and high is not None and rows is not None
        assert drift is not None and changed is not None
        bands.append(
            BandView(low, high, rows, drift, changed, integer(band.get("first_drift_position")))
        )
    statement = block.get("statement")
    return LengthView(
        slot=slot,
        required=required,
        longest=integer(block.get("longest")),
        first_drift=integer(block.get("first_drift_position")),
        statement=statement if isinstance(statement, str) else "",
        bands=tuple(bands),
    )


def _x(tokens: int, slot: int) -> float:
    return _PAD + (_W - 2 * _PAD) * min(tokens, slot) / max(slot, 1)


def _line(
    cls: str, x1: float, y1: float, x2: float | None, y2: float, style: str, title: str
) -> str:
    """One marked line with its tooltip (``x2`` ``None``: vertical at ``x1``)."""
    end = x1 if x2 is None else x2
    return (
        f'<line class="{cls}" x1="{x1:.1f}" y1="{y1}" x2="{end:.1f}" y2="{y2}" {style}>'
        f"<title>{title}</title></line>"
    )


def _svg(view: LengthView, verdict: str) -> str:
    top = max((b.rows for b in view.bands), default=0) or 1
    span = _H - 2 * _PAD
    parts = [
        f'<svg class="lengths" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{escape(verdict)}: drift against sequence length">',
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#555"/>',
    ]
    for band in view.bands:
        left, right = _x(band.low - 1, view.slot), _x(band.high, view.slot)
        width = (right - left) * _BAR
        x = left + (right - left) * (1 - _BAR) / 2
        for key, count in (("rows", band.rows), ("drift", band.drift), ("changed", band.changed)):
            height = span * count / top
            parts.append(
                f'<rect class="band-{key}" x="{x:.1f}" y="{_H - _PAD - height:.1f}" '
                f'width="{width:.1f}" height="{height:.1f}" fill="{_COLOURS[key]}">'
                f"<title>{band.low}-{band.high} tokens: {count} {key}</title></rect>"
            )
            x += width / 6  # each series a little to the right, so all three stay visible
            width -= width / 3
        parts.append(f'<text x="{left:.1f}" y="{_H - 8}" font-size="9">{band.low}</text>')
    parts.append(f'<text x="{_W - _PAD:.1f}" y="{_H - 8}" font-size="9">{view.slot}</text>')
    top_y, base_y = _PAD - 10, _H - _PAD
    parts.append(
        _line("required", _x(view.required, view.slot), top_y, None, base_y,
              'stroke="#1b7f3b" stroke-dasharray="3,2"',
              f"3/4 of the slot: {view.required} tokens")
    )  # fmt: skip
    if view.longest is not None:
        parts.append(
            _line("longest", _PAD, _PAD - 14, _x(view.longest, view.slot), _PAD - 14,
                  'stroke="#333" stroke-width="2"', f"measured up to {view.longest} tokens")
        )  # fmt: skip
    if view.first_drift is not None:
        parts.append(
            _line("first-drift", _x(view.first_drift, view.slot), top_y, None, base_y,
                  f'stroke="{_COLOURS["drift"]}" stroke-width="2"',
                  f"first drift at position {view.first_drift}")
        )  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def lengths_html(view: LengthView | None, verdict: str) -> str:
    """The cell's "Sequence lengths" section: the statement, the plot and the band table."""
    if view is None:
        return (
            '<h4>Sequence lengths</h4><p class="muted">sequence length: not recorded (a cert '
            "written before the sequence scope: it covers no slot at the deploy gate)</p>"
        )
    rows = "".join(
        f"<tr><td>{b.low}-{b.high}</td><td>{b.rows}</td><td>{b.drift}</td><td>{b.changed}</td>"
        f"<td>{'-' if b.first_drift is None else b.first_drift}</td></tr>"
        for b in view.bands
    )
    return (
        f"<h4>Sequence lengths ({escape(verdict)})</h4><p>{escape(view.statement)}</p>"
        f'<div class="numerics">{_svg(view, verdict)}<table class="gates"><tr><th>band '
        "(tokens)</th><th>AC rows</th><th>drift</th><th>changed</th><th>first drift at</th>"
        f"</tr>{rows}</table></div>"
    )
