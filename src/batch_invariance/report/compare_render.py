"""The comparison of two certs for people: terminal text and the job summary's Markdown (pure)."""

from __future__ import annotations

from batch_invariance.cert.compare_view import CertRef, Comparison
from batch_invariance.core.compare import CellComparison, FailOn, PromptChange
from batch_invariance.report.escape import md_cell, md_code, one_line

__all__ = ["MAX_ROWS", "comparison_markdown", "comparison_text", "worst_words"]

#: Changed prompts listed per cell (the JSON output lists every one).
MAX_ROWS = 20

_WORST_WORDS = {
    "identical": "identical: every prompt's tokens, scored fields and logprobs bitwise equal",
    "unchecked": "tokens and scored fields equal; logprobs missing on a side, drift not checked",
    "drift": "logprobs drifted, tokens and scored fields equal",
    "tokens": "tokens changed, scored fields equal",
    "scored": "a scored field changed",
    "uncompared": "a prompt had no answer to judge (transport failure): it may hide a change",
}


def worst_words(worst: str | None) -> str:
    return "nothing compared" if worst is None else f"{worst} ({_WORST_WORDS[worst]})"


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def _change_line(change: PromptChange) -> str:
    c = change
    if c.prompt_class == "scored":
        more = f" (+{len(c.fields) - 1} more)" if len(c.fields) > 1 else ""
        what = f"{c.field}{more}: {one_line(repr(c.old), 50)} -> {one_line(repr(c.new), 50)}"
    elif c.prompt_class == "tokens":
        what = "tokens changed, scored fields equal"
    elif c.prompt_class == "drift":
        return (
            f"drift      {c.test_id}: first drift at token {c.first_drift}, "
            f"max |delta| {_num(c.max_abs_delta)}"
        )
    else:
        return f"{c.prompt_class:<10} {c.test_id}: {c.reason}"
    at = (
        ""
        if c.first_divergent_token is None
        else f"; first divergent token {c.first_divergent_token} (margin "
        f"{_num(c.old_margin)} -> {_num(c.new_margin)})"
    )
    return f"{c.prompt_class:<10} {c.test_id}: {what}{at}"


def _counts_line(cell: CellComparison) -> str:
    k = cell.counts
    parts = [f"{k.identical} identical", f"{k.drift} drift", f"{k.tokens} tokens changed"]
    parts.append(f"{k.scored} scored changed")
    if k.unchecked:
        parts.append(f"{k.unchecked} unchecked (no logprobs)")
    if k.uncompared:
        parts.append(f"{k.uncompared} uncompared")
    return f"  arm A, {k.total} prompts: {', '.join(parts)}"


def _ref(ref: CertRef) -> str:
    return f"{ref.path} ({ref.build}, {ref.ts_utc})"


def comparison_text(comparison: Comparison, fail_on: FailOn | None = None) -> str:
    """What ``batch-invariance compare`` prints."""
    lines = [
        f"compare: baseline {comparison.baseline}",
        f"         new      {comparison.new}",
        f"signatures: {comparison.signatures}",
    ]
    for old, new, cell in comparison.cells:
        lines += [
            "",
            f"cell {cell.model} ctx {cell.ctx} N {cell.dispatch_n}: verdict "
            f"{cell.old_verdict} -> {cell.new_verdict}",
            f"  baseline {_ref(old)}",
            f"  new      {_ref(new)}",
        ]
        if old.rules_note is not None:
            lines.append(f"  {old.rules_note}")
        if cell.not_comparable:
            lines.append("  NOT COMPARABLE, nothing compared:")
            lines += [f"    - {why}" for why in cell.not_comparable]
            continue
        lines.append(_counts_line(cell))
        lines += [f"  {_change_line(c)}" for c in cell.changes[:MAX_ROWS]]
        if len(cell.changes) > MAX_ROWS:
            lines.append(f"  ... and {len(cell.changes) - MAX_ROWS} more (--json lists all)")
    for label, refs in (("baseline", comparison.baseline_only), ("new", comparison.new_only)):
        for ref in refs:
            lines.append(
                f"\nonly in {label}: {ref.model} ctx {ref.ctx} N {ref.dispatch_n} ({ref.path}), "
                "nothing to compare it with"
            )
    lines += ["", f"worst: {worst_words(comparison.worst())}"]
    if not comparison.comparable:
        lines.append("not comparable: see above; a cell that is not comparable compares nothing")
    if fail_on is not None:
        failures = comparison.policy_failures(fail_on)
        verdict = "FAIL" if failures else "pass"
        lines.append(
            f"policy fail-on {fail_on}: {verdict}" + (f" ({failures[0]})" if failures else "")
        )
    return "\n".join(lines) + "\n"


def comparison_markdown(comparison: Comparison, fail_on: FailOn) -> str:
    """The job summary's section: one row per cell, then the changed prompts."""
    failures = comparison.policy_failures(fail_on)
    lines = [
        f"### Against the baseline: {'FAIL' if failures else 'pass'} (fail on `{fail_on}`)",
        "",
        f"Baseline `{md_code(comparison.baseline, 1000)}`; signatures: "
        f"{md_cell(comparison.signatures, 200)}",
        "",
        "| cell | verdict | identical | drift | tokens changed | scored changed | worst |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, _, cell in comparison.cells:
        name = f"`{md_code(cell.model, 60, table=True)}` ctx {cell.ctx} N {cell.dispatch_n}"
        verdict = f"{md_cell(cell.old_verdict)} → {md_cell(cell.new_verdict)}"
        if cell.not_comparable:
            why = md_cell("; ".join(cell.not_comparable), 300)
            lines.append(f"| {name} | {verdict} | not comparable: {why} | | | | |")
            continue
        k = cell.counts
        lines.append(
            f"| {name} | {verdict} | {k.identical} | {k.drift} | {k.tokens} | {k.scored} | "
            f"{cell.worst} |"
        )
    notes = [(cell, old.rules_note) for old, _, cell in comparison.cells if old.rules_note]
    if notes:
        lines.append("")
        lines += [
            f"- `{md_code(c.model, 60)}` ctx {c.ctx} N {c.dispatch_n}: {md_cell(note, 300)}"
            for c, note in notes
        ]
    changed = [(cell, c) for _, _, cell in comparison.cells for c in cell.changes]
    if changed:
        lines += ["", "| prompt | class | what changed |", "| --- | --- | --- |"]
        for _, c in changed[:MAX_ROWS]:
            what = _change_line(c).split(": ", 1)[-1]
            lines.append(
                f"| `{md_code(c.test_id, 60, table=True)}` | {c.prompt_class} | "
                f"{md_cell(what, 200)} |"
            )
        if len(changed) > MAX_ROWS:
            lines.append(f"\n…and {len(changed) - MAX_ROWS} more in the comparison JSON.")
    if failures:
        lines += ["", *[f"- {md_cell(f, 300)}" for f in failures]]
    return "\n".join(lines) + "\n"
