"""The report as a Markdown job summary (``$GITHUB_STEP_SUMMARY``). Pure.

One table per model/ctx and one line per divergent id; the texts side by side and the plot
are in the HTML report.
"""

from __future__ import annotations

from batch_invariance.report.history import CellHistory
from batch_invariance.report.model import Cell, CellGroup, Report
from batch_invariance.report.views import (
    answer_length_text,
    history_changed_text,
    history_drift_text,
    history_title,
    n_buys_text,
    promotable_text,
    signature_text,
    verdict_counts,
)

__all__ = ["render_markdown"]

_MARK = {"GREEN": "🟢", "AMBER": "🟠", "RED": "🔴", "UNVERIFIED": "⚪"}


def _cell_text(text: str) -> str:
    """A value safe inside a Markdown table cell."""
    return " ".join(text.replace("|", "\\|").split())


def _row(cell: Cell) -> str:
    rate = cell.rate.text if cell.rate is not None else "not recorded"
    dup = " (duplicate cell)" if cell.duplicate else ""
    values = (
        str(cell.n),
        f"{_MARK.get(cell.verdict, '⚪')} **{cell.verdict}**",
        rate,
        n_buys_text(cell),
        answer_length_text(cell),
        signature_text(cell),
        promotable_text(cell),
        f"`{cell.origin}`{dup}",
    )
    return "| " + " | ".join(_cell_text(v) for v in values) + " |"


def _unmet_gates(cell: Cell) -> list[str]:
    return [
        f"  - gate `{g.name}` not met: {_cell_text(g.reason)}"
        for g in cell.gates
        if g.ok is False and g.name not in ("F0", "F5")
    ]


def _divergent_lines(cell: Cell) -> list[str]:
    lines = []
    for entry in cell.divergent:
        passes = ", ".join(str(p) for p in entry.passes) or "n/a"
        token = "?" if entry.first_token is None else str(entry.first_token)
        lines.append(
            f"  - `{entry.test_id}` ({entry.kind}, {entry.field}): C pass(es) {passes} of "
            f"{cell.n_passes}, first divergent token {token}, {entry.flip}"
        )
    return lines


def _group(group: CellGroup) -> list[str]:
    lines = [
        f"### {group.model} at ctx {group.ctx}",
        "",
        "| N | verdict | divergence rate (95%) | what N buys | answer tokens | signature "
        "| promotable | cert |",
        "|---|---|---|---|---|---|---|---|",
        *(_row(c) for c in group.cells),
        "",
    ]
    for cell in group.cells:
        numerics = [f"  - numerics: {_cell_text(cell.numerics.statement)}"] if cell.numerics else []
        details = _unmet_gates(cell) + numerics + _divergent_lines(cell)
        if details:
            lines += [f"- N={cell.n} {cell.verdict}:", *details]
    if lines[-1] != "":
        lines.append("")
    return lines


def _history(history: CellHistory) -> list[str]:
    lines = [
        f"### History over builds: {_cell_text(history_title(history))}",
        "",
        "| date | build | verdict | answers changed vs previous | drift vs previous | cert "
        "| note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in history.rows:
        values = (
            row.ts_utc,
            f"`{row.build}`",
            f"{_MARK.get(row.verdict, '⚪')} **{row.verdict}**",
            history_changed_text(row),
            history_drift_text(row),
            f"`{row.origin}`",
            row.note,
        )
        lines.append("| " + " | ".join(_cell_text(v) for v in values) + " |")
    return [*lines, ""]


def render_markdown(report: Report) -> str:
    counts = ", ".join(f"{count} {verdict}" for count, verdict in verdict_counts(report))
    lines = [
        "## batch-invariance report",
        "",
        f"{len(report.cells)} cert(s): {counts or 'none valid'}; {len(report.invalid)} invalid.",
        "",
    ]
    if report.invalid:
        lines += ["**Invalid certs** (not reported, never promotable):", ""]
        lines += [f"- `{bad.origin}`: {_cell_text(bad.problem)}" for bad in report.invalid]
        lines.append("")
    for group in report.groups:
        lines += _group(group)
    for history in report.histories:
        lines += _history(history)
    return "\n".join(lines).rstrip("\n") + "\n"
