"""A small hand-written SVG: divergence rate vs N with 95% interval bars, throughput on a
second axis. Pure; a plotting library would bring a large dependency for two series.

Each N gets an evenly spaced slot (N values are few and far apart: 2, 4, 8, 16). A cell with
no divergence is drawn at rate 0 with its bar up to the bound; a divergent cell at its observed
rate with its exact interval. Throughput (``throughput.concurrent_tokens_per_s``) is a line
against the right axis, drawn only for cells that measured it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from batch_invariance.report.model import Cell

VERDICT_COLOURS: dict[str, str] = {
    "GREEN": "#1b7f3b",
    "AMBER": "#b86e00",
    "RED": "#c62828",
    "UNVERIFIED": "#5f6b7a",
}
THROUGHPUT_COLOUR = "#2458a6"

WIDTH = 560
HEIGHT = 280
LEFT = 60
RIGHT = 70
TOP = 30
BOTTOM = 46

_RATE_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class Frame:
    """Where the plot area lies and the two axis maxima."""

    slots: tuple[int, ...]
    rate_max: float
    throughput_max: float | None

    def x(self, n: int) -> float:
        k = self.slots.index(n)
        width = WIDTH - LEFT - RIGHT
        return LEFT + (k + 0.5) * width / len(self.slots)

    def y_rate(self, rate: float) -> float:
        return TOP + (1.0 - min(rate, self.rate_max) / self.rate_max) * (HEIGHT - TOP - BOTTOM)

    def y_throughput(self, value: float) -> float:
        top = self.throughput_max or 1.0
        return TOP + (1.0 - min(value, top) / top) * (HEIGHT - TOP - BOTTOM)


def nice_rate_max(highest: float) -> float:
    """The smallest of 0.01, 0.02, 0.05, ... 1.0 at or above ``highest``."""
    for step in _RATE_STEPS:
        if highest <= step:
            return step
    return 1.0


def nice_ceiling(value: float) -> float:
    """``value`` rounded up to 1, 2 or 5 times a power of ten (for the throughput axis)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for mult in (1, 2, 5, 10):
        if value <= mult * power:
            return float(mult * power)
    return float(10 * power)


def _concurrent(cell: Cell) -> float | None:
    return cell.throughput.concurrent_tokens_per_s if cell.throughput else None


def frame_for(cells: Sequence[Cell]) -> Frame:
    highs = [c.rate.high for c in cells if c.rate is not None]
    rates = [v for v in (_concurrent(c) for c in cells) if v is not None]
    return Frame(
        slots=tuple(sorted({c.n for c in cells})),
        rate_max=nice_rate_max(max(highs, default=0.0)),
        throughput_max=nice_ceiling(max(rates)) if rates else None,
    )


def _text(x: float, y: float, body: str, anchor: str = "middle", cls: str = "") -> str:
    extra = f' class="{cls}"' if cls else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="11"{extra}>'
        f"{escape(body)}</text>"
    )


def _axes(frame: Frame) -> list[str]:
    bottom = HEIGHT - BOTTOM
    right = WIDTH - RIGHT
    parts = [
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
    ]
    for k in range(5):
        value = frame.rate_max * k / 4
        y = frame.y_rate(value)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        parts.append(_text(LEFT - 6, y + 4, f"{value:.3g}", "end"))
    for n in frame.slots:
        parts.append(_text(frame.x(n), bottom + 16, f"N={n}"))
    parts.append(_text(LEFT - 44, TOP - 12, "divergence rate (95% interval)", "start"))
    if frame.throughput_max is not None:
        parts.append(f'<line x1="{right}" y1="{TOP}" x2="{right}" y2="{bottom}" stroke="#333"/>')
        for k in range(5):
            value = frame.throughput_max * k / 4
            parts.append(_text(right + 6, frame.y_throughput(value) + 4, f"{value:.4g}", "start"))
        # Anchored at the frame's right edge: started at the axis, the label ran out of the frame.
        parts.append(_text(WIDTH - 2, TOP - 12, "tokens/s (C)", "end"))
    else:
        parts.append(
            _text(right, bottom + 34, "throughput not measured", "end", "throughput-missing")
        )
    return parts


def _rate_marks(frame: Frame, cells: Sequence[Cell]) -> list[str]:
    parts = []
    for cell in cells:
        if cell.rate is None:
            continue
        x = frame.x(cell.n)
        colour = VERDICT_COLOURS.get(cell.verdict, VERDICT_COLOURS["UNVERIFIED"])
        y_low, y_high = frame.y_rate(cell.rate.low), frame.y_rate(cell.rate.high)
        label = escape(f"N={cell.n} {cell.verdict}: {cell.rate.text}")
        parts.append(
            f'<line class="interval-bar" data-n="{cell.n}" x1="{x:.1f}" y1="{y_low:.1f}" '
            f'x2="{x:.1f}" y2="{y_high:.1f}" stroke="{colour}" stroke-width="2"/>'
        )
        for y in (y_low, y_high):
            parts.append(
                f'<line x1="{x - 6:.1f}" y1="{y:.1f}" x2="{x + 6:.1f}" y2="{y:.1f}" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
        centre = frame.y_rate(cell.rate.value)
        parts.append(
            f'<circle class="rate-point" data-n="{cell.n}" data-verdict="{cell.verdict}" '
            f'cx="{x:.1f}" cy="{centre:.1f}" r="5" fill="{colour}"><title>{label}</title>'
            "</circle>"
        )
    return parts


def _throughput_marks(frame: Frame, cells: Sequence[Cell]) -> list[str]:
    points = [(c.n, v) for c in cells if (v := _concurrent(c)) is not None]
    if not points:
        return []
    coords = [(frame.x(n), frame.y_throughput(v)) for n, v in sorted(points)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    parts = [
        f'<polyline class="throughput-line" points="{path}" fill="none" '
        f'stroke="{THROUGHPUT_COLOUR}" stroke-dasharray="5 3" stroke-width="1.5"/>'
    ]
    for (n, value), (x, y) in zip(sorted(points), coords, strict=True):
        parts.append(
            f'<rect class="throughput-point" data-n="{n}" x="{x - 4:.1f}" y="{y - 4:.1f}" '
            f'width="8" height="8" fill="{THROUGHPUT_COLOUR}">'
            f"<title>N={n}: {value:.4g} tokens/s</title></rect>"
        )
    return parts


def rate_plot(cells: Sequence[Cell], title: str) -> str:
    """The SVG element (inline, no external references) for one model/ctx group."""
    frame = frame_for(cells)
    body = [
        *_axes(frame),
        *_rate_marks(frame, cells),
        *_throughput_marks(frame, cells),
    ]
    return (
        f'<svg class="rate-plot" role="img" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}"><title>{escape(title)}</title>' + "".join(body) + "</svg>"
    )
