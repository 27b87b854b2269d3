"""The report as one self-contained HTML file: inline CSS and SVG, no script, no network.

Pure. Every value from a cert is escaped; nothing is loaded from anywhere (no ``src``, no
``href`` to another host, no ``url()``), so the file opens the same offline and in CI
artifact viewers.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from batch_invariance.report.divergence import DivergentId, TextSide
from batch_invariance.report.history import CellHistory
from batch_invariance.report.lengths import lengths_html
from batch_invariance.report.model import Cell, CellGroup, GateRow, Report
from batch_invariance.report.numerics import grid_svg, pass_table_rows, risk_svg
from batch_invariance.report.plot import VERDICT_COLOURS, rate_plot
from batch_invariance.report.search_plot import search_section
from batch_invariance.report.views import (
    answer_length_text,
    cell_anchor,
    cell_verdict_text,
    history_changed_text,
    history_drift_text,
    history_title,
    n_buys_text,
    promotable_text,
    signature_text,
    verdict_counts,
)

__all__ = ["render_html"]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px;
  color: #1d232b; background: #fff; max-width: 1200px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; } h4 { font-size: 14px; margin: 12px 0 4px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #d5d9de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; font-weight: 600; }
.verdict { font-weight: 700; padding: 1px 8px; border-radius: 3px; color: #fff; }
.met { color: #1b7f3b; font-weight: 600; } .unmet { color: #c62828; font-weight: 700; }
.muted { color: #5f6b7a; } code { font-size: 12px; }
.invalid-cert { color: #c62828; }
.signature-failed, .signature-error { color: #c62828; font-weight: 700; }
.signature-verified { color: #1b7f3b; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
.side pre { white-space: pre-wrap; word-break: break-word; background: #f7f8fa;
  border: 1px solid #d5d9de; padding: 8px; margin: 0; font-size: 12px; }
mark.first-divergent-token { background: #ffd54f; outline: 2px solid #c62828;
  color: #000; padding: 0 1px; }
details.cell { border-top: 1px solid #d5d9de; margin-top: 12px; }
details.cell > summary { cursor: pointer; font-weight: 600; padding: 6px 0; }
.numerics { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; }
"""


def _verdict_badge(verdict: str) -> str:
    colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["UNVERIFIED"])
    return (
        f'<span class="verdict verdict-{escape(verdict)}" style="background:{colour}">'
        f"{escape(verdict)}</span>"
    )


def _gate_row(row: GateRow) -> str:
    if row.ok is None:
        met = '<span class="muted">unknown</span>'
    else:
        met = '<span class="met">met</span>' if row.ok else '<span class="unmet">NOT met</span>'
    return (
        f'<tr class="gate" data-gate="{escape(row.name)}"><td><code>{escape(row.name)}</code>'
        f"</td><td>{met}</td><td>{escape(row.reason)}</td></tr>"
    )


def _side(label: str, side: TextSide, cls: str) -> str:
    if side.token is None:
        body = escape(side.before) + '<span class="muted"> (tokens not recorded)</span>'
    else:
        shown = side.token if side.token else "⟨end of answer⟩"
        body = (
            escape(side.before)
            + f'<mark class="first-divergent-token">{escape(shown)}</mark>'
            + escape(side.after)
        )
    margin = "not recorded" if side.margin is None else f"{side.margin:.3g}"
    return (
        f'<div class="side {cls}"><h5>{escape(label)} <span class="muted">'
        f"(top1-top2 margin here: {escape(margin)})</span></h5><pre>{body}</pre></div>"
    )


def _divergent(entry: DivergentId, n_passes: int) -> str:
    passes = ", ".join(str(p) for p in entry.passes) or "n/a"
    position = "unknown" if entry.first_token is None else str(entry.first_token)
    shown = "" if entry.shown_pass is None else f" (shown: pass {entry.shown_pass})"
    return (
        f'<div class="divergent" data-test-id="{escape(entry.test_id)}">'
        f'<h4><code>{escape(entry.test_id)}</code> <span class="muted">{escape(entry.kind)}'
        f" in field {escape(entry.field)}</span></h4>"
        f"<p>Diverged in C pass(es) {escape(passes)} of {n_passes}{escape(shown)}; first "
        f"divergent token at position {escape(position)}; "
        f'<span class="flip">{escape(entry.flip)}</span>.</p>'
        '<div class="pair">'
        + _side("A (serial, --parallel 1)", entry.a, "side-a")
        + _side("C (co-batched)", entry.c, "side-c")
        + "</div></div>"
    )


def _rate(cell: Cell) -> str:
    return (
        '<span class="muted">not recorded</span>' if cell.rate is None else escape(cell.rate.text)
    )


def _table(group: CellGroup) -> str:
    head = (
        "<tr><th>N</th><th>verdict</th><th>divergence rate (95%)</th><th>what N buys</th>"
        "<th>answer tokens</th><th>signature</th><th>promotable</th><th>scope</th>"
        "<th>cert</th></tr>"
    )
    rows = []
    for cell in group.cells:
        dup = ' <span class="unmet">(duplicate cell)</span>' if cell.duplicate else ""
        rows.append(
            f'<tr class="cell-row" data-n="{cell.n}" data-verdict="{escape(cell.verdict)}">'
            f'<td><a href="#{cell_anchor(cell)}">{cell.n}</a></td>'
            f'<td>{_verdict_badge(cell.verdict)} <span class="muted">{escape(cell.status)}'
            f"</span></td><td>{_rate(cell)}</td><td>{escape(n_buys_text(cell))}</td>"
            f"<td>{escape(answer_length_text(cell))}</td>"
            f'<td class="signature signature-{cell.signature.state}">'
            f"{escape(signature_text(cell))}</td>"
            f"<td>{escape(promotable_text(cell))}</td><td>{escape(cell.scope)}</td>"
            f"<td><code>{escape(cell.origin)}</code>{dup}</td></tr>"
        )
    return f'<table class="cells">{head}{"".join(rows)}</table>'


def _numerics(cell: Cell) -> str:
    view = cell.numerics
    if view is None:
        return '<h4>Numerics</h4><p class="muted">not recorded in this cert</p>'
    passes = "".join(f"<li>{escape(line)}</li>" for line in pass_table_rows(view))
    p = view.flip_probability
    risk = "not estimated" if p is None else f"per-token flip probability {p:.2g}"
    return (
        f"<h4>Numerics (pre-sampling logprobs, bitwise)</h4><p>{escape(view.statement)}</p>"
        f'<ul class="numerics-passes">{passes}</ul><div class="numerics">{grid_svg(view)}'
        f"<div><p>Divergence risk ({escape(risk)}; an estimate, never a gate)</p>"
        f"{risk_svg(view)}</div></div>"
    )


def _cell_details(cell: Cell) -> str:
    reasons = "".join(f"<li>{escape(r)}</li>" for r in cell.decision_reasons)
    gates = "".join(_gate_row(g) for g in cell.gates)
    divergent = "".join(_divergent(d, cell.n_passes) for d in cell.divergent)
    if not divergent:
        divergent = '<p class="muted">No id differed between A and C.</p>'
    return (
        f'<details class="cell" id="{cell_anchor(cell)}" open><summary>N={cell.n} '
        f"{_verdict_badge(cell.verdict)} <code>{escape(cell.origin)}</code></summary>"
        f'<p class="n-buys">{escape(cell_verdict_text(cell))}</p>'
        f"<h4>Why</h4><ol>{reasons}</ol>"
        f'<h4>Gates</h4><table class="gates"><tr><th>gate</th><th>state</th><th>reason</th>'
        f"</tr>{gates}</table>{_numerics(cell)}{lengths_html(cell.lengths, cell.verdict)}"
        f"<h4>Divergent ids</h4>{divergent}</details>"
    )


def _group(group: CellGroup) -> str:
    title = f"{group.model} at ctx {group.ctx}"
    return (
        f'<section class="group" data-model="{escape(group.model)}" data-ctx="{group.ctx}">'
        f"<h2>{escape(title)}</h2>{_table(group)}"
        f"{rate_plot(group.cells, f'divergence rate and throughput vs N: {title}')}"
        + "".join(_cell_details(c) for c in group.cells)
        + "</section>"
    )


def _history(history: CellHistory) -> str:
    head = (
        "<tr><th>date</th><th>build</th><th>verdict</th><th>answers changed vs previous</th>"
        "<th>drift vs previous</th><th>cert</th><th>note</th></tr>"
    )
    rows = "".join(
        f'<tr class="history-row" data-build="{escape(r.build)}">'
        f"<td>{escape(r.ts_utc)}</td><td><code>{escape(r.build)}</code></td>"
        f"<td>{_verdict_badge(r.verdict)}</td><td>{escape(history_changed_text(r))}</td>"
        f"<td>{escape(history_drift_text(r))}</td><td><code>{escape(r.origin)}</code></td>"
        f'<td class="muted">{escape(r.note)}</td></tr>'
        for r in history.rows
    )
    return (
        f'<section class="history" data-model="{escape(history.model)}" '
        f'data-ctx="{history.ctx}" data-n="{history.n}"><h2>History over builds: '
        f"{escape(history_title(history))}</h2>"
        f'<table class="history">{head}{rows}</table></section>'
    )


def _invalid(report: Report) -> Iterable[str]:
    if not report.invalid:
        return
    yield '<section id="invalid"><h2>Invalid certs (not reported, never promotable)</h2><ul>'
    for bad in report.invalid:
        yield (
            f'<li class="invalid-cert"><code>{escape(bad.origin)}</code>: '
            f"{escape(bad.problem)}</li>"
        )
    yield "</ul></section>"


def render_html(report: Report) -> str:
    counts = (
        ", ".join(f"{count} {verdict}" for count, verdict in verdict_counts(report))
        or "no valid cert"
    )
    summary = (
        f"{len(report.cells)} cert(s) in {len(report.groups)} model/ctx group(s): {counts}; "
        f"{len(report.invalid)} invalid"
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>batch-invariance report</title><style>{_CSS}</style></head><body>"
        f'<h1>batch-invariance report</h1><p class="summary">{escape(summary)}</p>'
        + "".join(_invalid(report))
        + "".join(_group(g) for g in report.groups)
        + "".join(_history(h) for h in report.histories)
        + "".join(search_section(record, origin) for record, origin in report.searches)
        + "</body></html>\n"
    )
