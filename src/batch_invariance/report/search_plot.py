"""The search's configurations on one plot: what N buys against how far the answers held.

Pure, hand-written SVG like :mod:`batch_invariance.report.plot`. One point per configuration
of a ``search.json`` record: x is the sequence length it held for (the position before its
first drift, or the longest sequence its evidence compared with no drift), y is what N buys
there (its full cert's concurrent over serial tokens/s); the colour is its verdict. A
configuration with no full cert (a probe's reject) has no throughput: it is drawn hollow on
the bottom line. The dashed line is 1.0x: below it, concurrent is not faster than serial.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from batch_invariance.report.plot import VERDICT_COLOURS, nice_ceiling

__all__ = ["search_plot", "search_section"]

WIDTH, HEIGHT = 620, 320
LEFT, RIGHT, TOP, BOTTOM = 60, 30, 30, 50


def _point(row: Mapping[str, Any]) -> tuple[float, float | None, str] | None:
    seen = row.get("cert") or row.get("probe")
    if not isinstance(seen, Mapping):
        return None
    drift = seen.get("first_drift_position")
    # Drift at position p: the sequences held up to p - 1 (or the longest seen equal).
    held = seen.get("longest") if drift is None else seen.get("bitwise_equal_up_to")
    if held is None and isinstance(drift, int):
        held = drift - 1
    if not isinstance(held, (int, float)):
        return None
    cert = row.get("cert")
    speedup = cert.get("speedup") if isinstance(cert, Mapping) else None
    verdict = str(row.get("verdict", "UNVERIFIED")).split(" ")[0]
    return float(held), speedup if isinstance(speedup, (int, float)) else None, verdict


def search_plot(record: Mapping[str, Any]) -> str:
    """The SVG (``class="search-plot"``), one ``<circle class="config">`` per configuration."""
    points = [(r, p) for r in record.get("rows", ()) if (p := _point(r)) is not None]
    slot = float(record.get("ctx") or 1)
    top = nice_ceiling(max([2.0, *(p[1] for _, p in points if p[1] is not None)]))
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + w * min(v, slot) / slot

    def y(v: float) -> float:
        return TOP + h * (1 - v / top)

    parts = [
        f'<svg class="search-plot" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">',
        f'<line x1="{LEFT}" y1="{TOP + h}" x2="{LEFT + w}" y2="{TOP + h}" stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + h}" stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{y(1.0):.1f}" x2="{LEFT + w}" y2="{y(1.0):.1f}" '
        'stroke="#888" stroke-dasharray="4 3"/>',
        f'<text x="{LEFT + 4}" y="{y(1.0) - 4:.1f}" font-size="11">1.0x: serial</text>',
        f'<text x="{LEFT + w / 2}" y="{HEIGHT - 12}" text-anchor="middle" font-size="12">'
        f"sequence length the answers held for (tokens; slot {int(slot)})</text>",
        f'<text x="{LEFT}" y="{TOP - 12}" font-size="12">'
        "what N buys (concurrent / serial tokens/s at N)</text>",
        f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end" font-size="11">{top:g}x</text>',
        f'<text x="{LEFT - 6}" y="{TOP + h}" text-anchor="end" font-size="11">0</text>',
        f'<text x="{LEFT + w}" y="{TOP + h + 16}" text-anchor="end" font-size="11">'
        f"{int(slot)}</text>",
    ]
    for row, (held, speedup, verdict) in points:
        colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["UNVERIFIED"])
        cy = y(speedup) if speedup is not None else TOP + h
        fill = colour if speedup is not None else "none"
        name = escape(str(row.get("config")))
        parts.append(
            f'<circle class="config" data-config="{name}" data-verdict="{escape(verdict)}" '
            f'cx="{x(held):.1f}" cy="{cy:.1f}" r="6" fill="{fill}" stroke="{colour}" '
            f'stroke-width="2"><title>{name}: {escape(str(row.get("verdict")))}</title></circle>'
        )
        # A label near the right edge goes on the point's left, inside the plot.
        right = x(held) > LEFT + 0.75 * w
        lx, anchor = (x(held) - 8, "end") if right else (x(held) + 8, "start")
        parts.append(
            f'<text x="{lx:.1f}" y="{cy - 8:.1f}" text-anchor="{anchor}" font-size="11">'
            f"{name}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def search_section(record: Mapping[str, Any], origin: str) -> str:
    """The report's section for one search: the plot and the answer's lines."""
    head = (
        f"Search: {record.get('model')} ctx={record.get('ctx')} N={record.get('parallel')} "
        f"({len(record.get('rows', ()))} configurations)"
    )
    said = "".join(f"<li>{escape(str(w))}</li>" for w in record.get("answer", ()))
    return (
        f'<section class="search"><h2>{escape(head)}</h2>{search_plot(record)}'
        f"<ul>{said}</ul><p>from <code>{escape(origin)}</code></p></section>"
    )
