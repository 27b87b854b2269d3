"""The cert's ``numerics`` block in words: console lines and a Markdown section (pure); and
the power of its own sample, beside the rule-of-three bound.

Shared by the banner, the job summary and the report, so every view says the same thing.
"""

from __future__ import annotations

from batch_invariance.core.findings import Sensitivity
from batch_invariance.core.numerics import Numerics, PairNumerics, PassNumerics
from batch_invariance.core.power import power_words
from batch_invariance.core.scope import NOT_RECORDED, LengthBand, SequenceScope
from batch_invariance.report.escape import md_cell


def _delta(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _pass_label(p: PassNumerics) -> str:
    return "serial" if p.pass_index is None else f"C{p.pass_index}"


def drift_per_pass(pair: PairNumerics) -> str:
    """``"16/16, 15/16"``: rows with drift over rows compared, per pass."""
    return ", ".join(f"{p.rows_with_drift}/{p.rows_compared}" for p in pair.per_pass) or "-"


def risk_text(numerics: Numerics) -> str:
    """The divergence-risk estimate on one line (never a gate)."""
    risk = numerics.risk
    if risk.per_token_flip_probability is None:
        return "risk (estimate, never a gate): not estimated (no logprobs to compare)"
    curve = "/".join(str(p.tokens) for p in risk.curve)
    shares = "/".join(f"{100 * p.answer_change_share:.0f}%" for p in risk.curve)
    return (
        f"risk (estimate, never a gate): per-token flip p={risk.per_token_flip_probability:.2g}"
        f"; answers whose tokens would change at {curve} tokens: {shares} (observed here: "
        f"{risk.observed_token_flips} of {risk.observed_rows} rows x passes flipped a token)"
    )


def numerics_lines(numerics: Numerics) -> list[str]:
    """The banner's numerics lines: AC per pass, the serial pairs, the risk estimate."""
    ac = numerics.ac
    flips = ", ".join(str(p.rows_with_token_flip) for p in ac.per_pass) or "-"
    first = min(
        (p.first_drift_position for p in ac.per_pass if p.first_drift_position is not None),
        default=None,
    )
    at = "" if first is None else f", first at token {first}"
    lines = [
        f"numerics: AC rows with logprob drift per pass {drift_per_pass(ac)} "
        f"(max |delta| {_delta(ac.max_abs_delta)}{at}); rows with a token flip {flips}",
    ]
    serial = [f"AB {drift_per_pass(numerics.ab)}", f"BC {drift_per_pass(numerics.bc)}"]
    if numerics.aa is not None:
        serial.append(f"AA' {drift_per_pass(numerics.aa)}")
    lines.append(f"numerics: rows with drift {'; '.join(serial)}")
    if not numerics.evidence.ok:
        lines.append(numerics.evidence.reason)
    lines.append(risk_text(numerics))
    return lines


def numerics_markdown(numerics: Numerics) -> list[str]:
    """The job summary's ``Numerics`` section."""
    lines = [
        "### Numerics (pre-sampling logprobs, bitwise)",
        "",
        f"{numerics.statement}",
        "",
        "| pair | pass | rows compared | rows with drift | token flips | first drift "
        "| max abs delta |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    pairs = [numerics.ac, numerics.ab, numerics.bc]
    if numerics.aa is not None:
        pairs.append(numerics.aa)
    for pair in pairs:
        for p in pair.per_pass:
            first = "-" if p.first_drift_position is None else str(p.first_drift_position)
            lines.append(
                f"| {pair.pair} | {_pass_label(p)} | {p.rows_compared} | {p.rows_with_drift} | "
                f"{p.rows_with_token_flip} | {first} | {_delta(p.max_abs_delta)} |"
            )
    lines += ["", risk_text(numerics)]
    return lines


def power_lines(sensitivity: Sensitivity) -> list[str]:
    """What the cert's own sample could catch (:mod:`batch_invariance.core.power`): its
    distinct co-batched prompts and co-batched runs, said where no answer changed (a cell
    that changed one has shown it); empty otherwise."""
    s = sensitivity
    if s.n_ac_divergent or s.n_distinct_prompts < 1 or s.n_hot_trials < 1:
        return []
    return [f"power: {power_words(s.n_distinct_prompts, s.n_hot_trials)}"]


def sensitivity_markdown(rule_of_three: str, sensitivity: Sensitivity) -> list[str]:
    """The job summary's ``Sensitivity`` section: the cert's rule-of-three statement, and the
    power of its sample where no answer changed."""
    lines = ["### Sensitivity", "", md_cell(rule_of_three, 400)]
    for line in power_lines(sensitivity):
        lines += ["", md_cell(line, 400)]
    return lines


def _band_label(band: LengthBand) -> str:
    return f"{band.low}-{band.high}"


def scope_lines(scope: SequenceScope | None) -> list[str]:
    """The banner's sequence lines: what lengths the cell covers, and drift per length band."""
    if scope is None:
        return [f"sequences: {NOT_RECORDED}"]
    lines = [f"sequences: {scope.statement}"]
    bands = "; ".join(
        f"{_band_label(b)}: {b.rows_compared} rows, drift {b.rows_with_drift}, changed "
        f"{b.rows_with_changed_answer}"
        + ("" if b.first_drift_position is None else f" (from position {b.first_drift_position})")
        for b in scope.bands
    )
    lines.append(f"sequences by length band (AC rows x passes): {bands}")
    return lines


def scope_markdown(scope: SequenceScope | None) -> list[str]:
    """The job summary's and report's ``Sequence lengths`` section."""
    lines = ["### Sequence lengths (prompt + compared answer)", ""]
    if scope is None:
        return [*lines, f"{NOT_RECORDED}: this cert covers no slot at the deploy gate."]
    lines += [
        f"{scope.statement} (the slot is covered from {scope.required} tokens, 3/4 of it).",
        "",
        "| band (tokens) | AC rows | ids | rows with drift | changed answers | first drift at |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for b in scope.bands:
        first = "-" if b.first_drift_position is None else str(b.first_drift_position)
        lines.append(
            f"| {_band_label(b)} | {b.rows_compared} | {b.n_ids} | {b.rows_with_drift} | "
            f"{b.rows_with_changed_answer} | {first} |"
        )
    return lines
