"""Every human view of a cert, as text: the console banner of ``run-live`` / ``demo``, the
``run-mock`` report, the ``verify-cert`` text, and the Action's Markdown job summary and
workflow-command annotations.

Each function returns a string and prints nothing; the commands print it. Golden tests
(``tests/golden/``) pin every view byte for byte. The escapes the GitHub views use (workflow
commands, Markdown) are in :mod:`batch_invariance.report.escape`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from batch_invariance.cert.certificate import Cert, display_verdict
from batch_invariance.cert.verify import DIGEST_SCOPE, Verification
from batch_invariance.core.scope import scope_words
from batch_invariance.core.throughput import Throughput, verdict_words
from batch_invariance.report.divergence import divergent_ids_markdown
from batch_invariance.report.escape import (
    annotation,
    escape_data,
    escape_property,
    log_line,
    md_cell,
    md_code,
    one_line,
)
from batch_invariance.report.numerics_view import (
    numerics_lines,
    numerics_markdown,
    power_lines,
    scope_lines,
    scope_markdown,
    sensitivity_markdown,
)

__all__ = [
    "NO_BUNDLE",
    "TITLE",
    "Require",
    "annotation",
    "chat_template_warning",
    "escape_data",
    "escape_property",
    "failure_summary",
    "live_banner",
    "log_line",
    "md_cell",
    "md_code",
    "mock_expected_status",
    "mock_prediction",
    "mock_report",
    "one_line",
    "summary_markdown",
    "sweep_text",
    "throughput_text",
    "verdict_annotation",
    "verify_report_text",
]

#: ``none`` only with a baseline: the job checks the comparison with it, not the verdict.
#: ``cert``: the job checks that a live cert was written; its caller gates on the verdict.
Require = Literal["green", "promotable", "cert", "none"]

TITLE = "batch-invariance"
_BAR = "=" * 72
#: A path or a cell name in the job summary: long enough never to be cut in practice.
_PATH_CHARS = 1000


# --------------------------------------------------------------------------- console


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def throughput_text(block: Throughput | None, parallel: int, verdict: str) -> str:
    """The verdict and what N buys (for a RED cell: what staying serial costs), on one line,
    with the two rates it comes from."""
    speedup = None if block is None else block.speedup
    words = verdict_words(verdict, parallel, speedup)
    if block is None or speedup is None:
        return f"{words} (the server reported no token timings)"
    return (
        f"{words} (serial {block.serial_tokens_per_s} tok/s, N={parallel} concurrent "
        f"{block.concurrent_tokens_per_s} tok/s)"
    )


def _cert_throughput(cert: Cert) -> str:
    return throughput_text(cert.throughput, cert.dispatch_n, display_verdict(cert.status))


def prompt_cache_text(cert: Cert) -> str:
    """What the cert says about the prompt cache: which traffic it covers."""
    block = cert.prompt_cache
    if block is None:
        return (
            "prompt cache: not measured (every arm sent cache_prompt false to a --cache-ram 0 "
            "server): covers traffic with the prompt cache off only"
        )
    reuse = block.reuse
    return (
        f"prompt cache: measured, {block.status}: {reuse.n_reused}/{reuse.n_answered} "
        f"requests reused {reuse.tokens_reused} cached prompt tokens over {block.n_passes} "
        "pass(es)"
    )


def live_banner(cert: Cert, path: Path, superseded: Path | None, label: str) -> str:
    """The verdict banner, gates and reasons of a live cell (``run-live``, ``demo``)."""
    klass = f" / {cert.divergence_class}" if cert.divergence_class else ""
    gates = (
        f"overlap {_met(cert.overlap.ok)}, "
        f"floor {_met(cert.completion_floor.ok)}, "
        f"coverage {_met(cert.cobatch_coverage.ok)}, "
        f"transport {'clean' if cert.transport.ok else 'failures'}"
    )
    ac = cert.divergence_report.ac
    lines = [
        _BAR,
        f"  {display_verdict(cert.status)}{klass}  {label} ctx={cert.ctx} N={cert.dispatch_n}",
        _BAR,
        f"  {_cert_throughput(cert)}",
        f"  gates: {gates}",
        f"  AC divergent ids: {ac.n_divergent}/{ac.n_compared} over {cert.n_passes} passes",
        *(f"  {line}" for line in power_lines(cert.sensitivity)),
        *(f"  {line}" for line in numerics_lines(cert.numerics)),
        *(f"  {line}" for line in scope_lines(cert.sequence_scope)),
        f"  {prompt_cache_text(cert)}",
    ]
    lines += _warning_lines(cert)
    lines += [f"  - {reason}" for reason in cert.decision_reasons]
    lines += _cert_lines(path, superseded)
    return "\n".join(lines) + "\n"


def chat_template_warning(cert: Cert) -> str | None:
    """The cert's ``provenance.chat_template.warning`` (answers shaped by a fallback)."""
    block = cert.provenance.chat_template
    warning = block.warning if block is not None else None
    return warning or None


def _warning_lines(cert: Cert) -> list[str]:
    warning = chat_template_warning(cert)
    return [] if warning is None else [f"  WARNING: {warning}"]


def _cert_lines(path: Path, superseded: Path | None) -> list[str]:
    lines = [f"cert: {path}"]
    if superseded is not None:
        lines.append(f"previous cert moved to: {superseded}")
    return lines


def mock_report(
    cert: Cert, path: Path, superseded: Path | None, *, model: str, divergence_mode: bool
) -> str:
    """The ``run-mock`` banner, reasons and footer (source=mock is never promotable)."""
    mode = "--batch-divergence" if divergence_mode else "default"
    lines = [
        _BAR,
        f"  {display_verdict(cert.status)}  mock cell {model} ctx={cert.ctx} "
        f"N={cert.dispatch_n}  ({mode} mode)",
        _BAR,
    ]
    lines += _warning_lines(cert)
    lines += [f"  - {reason}" for reason in cert.decision_reasons]
    lines += _cert_lines(path, superseded)
    lines.append("source=mock: never promotable (verify-cert never exits 0 on it, by design)")
    return "\n".join(lines) + "\n"


def mock_expected_status(divergence_mode: bool) -> str:
    """The status the mock's mode predicts: RED with ``--batch-divergence``, else GREEN."""
    return "failed" if divergence_mode else "green"


def mock_prediction(status: str, divergence_mode: bool) -> tuple[bool, str]:
    """Whether the mock behaved as its mode predicts, and the line that says so."""
    mode = "--batch-divergence" if divergence_mode else "default"
    expected = mock_expected_status(divergence_mode)
    if status == expected:
        return True, f"mock behaved as the {mode} mode predicts ({display_verdict(expected)})"
    return False, (
        f"batch-invariance: the mock did NOT behave as predicted: expected "
        f"{display_verdict(expected)}, got {display_verdict(status)}"
    )


NO_BUNDLE = f"not checked (no --bundle): authenticity was not checked; {DIGEST_SCOPE}"


def verify_report_text(report: Verification, signature: str | None) -> str:
    """What ``verify-cert`` prints for a cert that passed every check."""
    cert = report.cert
    assert cert is not None  # a valid verification always carries its cert
    lines = [
        f"cert:       {report.path}",
        f"cell:       model={cert.model} ctx={cert.ctx} N={cert.dispatch_n}",
        f"status:     {report.verdict} ({cert.status})",
        f"throughput: {_cert_throughput(cert)}",
        f"source:     {cert.source}   gate: {cert.gate}",
        f"promotable: {'yes' if report.promotable else 'no'}",
    ]
    lines += [f"  - {reason}" for reason in report.promotable_reasons]
    lines.append(f"{prompt_cache_text(cert)}")
    lines.append(f"sequences:  {scope_words(cert.sequence_scope)}")
    lines += [
        f"signature:  {signature or NO_BUNDLE}",
        "integrity:  schema ok, digest ok, verdict re-derived from evidence matches, "
        "identity matches its provenance",
        "reasons:",
    ]
    lines += [f"  - {reason}" for reason in cert.decision_reasons]
    return "\n".join(lines) + "\n"


def _sweep_rate(rate: Mapping[str, Any]) -> str:
    if rate.get("kind") == "observed":
        return (
            f"rate {rate.get('observed_rate'):.3g} "
            f"[{rate.get('ci95_low'):.3g}, {rate.get('ci95_high'):.3g}]"
        )
    bound = rate.get("rate_upper_bound_95")
    return "bound -" if bound is None else f"bound <= {bound:.3g}"


def _sweep_sequences(block: Any) -> str:
    """``  seq <= L/C, drift from P``: verdict against sequence length, per N."""
    if not isinstance(block, Mapping):
        return "  sequence length: not recorded"
    longest = block.get("longest")
    text = f"  seq <= {'?' if longest is None else longest}/{block.get('slot_ctx')}"
    first = block.get("first_drift_position")
    return text + ("" if first is None else f", drift from position {first}")


def _sweep_faster(summary: Mapping[str, Any]) -> str:
    """``max_safe_faster_parallel``: the largest safe N that is faster than N=1, in words."""
    faster = summary.get("max_safe_faster_parallel")
    if summary.get("max_safe_parallel") is None:
        why = "no N is safe"
    elif faster is None:
        why = "no safe N is measured faster than N=1: N buys nothing here"
    elif faster == summary["max_safe_parallel"]:
        why = "the largest safe N is faster than N=1"
    else:
        why = "no safe N above it is measured faster than N=1"
    return f"max_safe_faster_parallel = {faster}  ({why})"


def sweep_text(summary: Mapping[str, Any], path: Path) -> str:
    """The table ``sweep`` prints after the cells' banners."""
    lines = [
        _BAR,
        f"  sweep {summary['model']} ctx={summary['ctx']}: max_safe_parallel = "
        f"{summary['max_safe_parallel']}  ({summary['server_launches']} server launches)",
        f"  {_sweep_faster(summary)}",
        _BAR,
    ]
    for entry in summary["cells"]:
        n = entry["parallel"]
        if not entry["ran"]:
            lines.append(f"  N={n:<3} {entry['not_run']}")
            continue
        tp = entry.get("throughput") or {}
        speed = tp.get("speedup")
        first = entry.get("first_divergent_token_median")
        lines.append(
            f"  N={n:<3} {entry['verdict']:<10} promotable={'yes' if entry['promotable'] else 'no'}"
            f"  {_sweep_rate(entry['rate'])}"
            f"  speedup {'-' if speed is None else f'{speed:.2f}x'}"
            f"  passes {entry['passes_run']}{' (stopped on RED)' if entry['stopped_early'] else ''}"
            + ("" if first is None else f"  first divergent token ~{first:g}")
            + _sweep_sequences(entry.get("sequences"))
        )
    lines.append(f"sweep: {path}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- GitHub


def summary_markdown(cert: Cert, require: Require, passed: bool, outputs: Mapping[str, str]) -> str:
    """The job summary: verdict, gate table, divergent ids, bound, scope (pure)."""
    ac = cert.divergence_report.ac
    lines = [
        f"## batch-invariance: {outputs['verdict']} — `{md_code(outputs['cell'], _PATH_CHARS)}`",
        "",
        f"- **Verdict:** {outputs['verdict']} (status `{md_code(cert.status)}`, source "
        f"`{md_code(cert.source)}`, gate `{md_code(cert.gate)}`, KV "
        f"`{md_code(cert.kv_label, _PATH_CHARS)}`)",
        f"- **What N buys:** {_cert_throughput(cert)}",
        f"- **Require `{require}`:** {_require_words(require, passed, outputs['verdict'])}; "
        f"promotable: {outputs['promotable']}",
    ]
    if cert.divergence_class:
        lines.append(f"- **Divergence class:** `{md_code(cert.divergence_class)}`")
    if cert.anomaly:
        lines.append(f"- **Anomaly:** `{md_code(cert.anomaly, 400)}`")
    if cert.source == "mock":
        lines.append(
            "- **Mock run:** this cert comes from the in-process mock server "
            "(`source=mock`); it tests the wiring and can never pass `require`."
        )
    lines += ["", "### Gates", "", "| gate | result | reason |", "| --- | --- | --- |"]
    for name, outcome in cert.gates.items():
        mark = "pass" if outcome.ok else "**fail**"
        lines.append(f"| {md_cell(name, 60)} | {mark} | {md_cell(outcome.reason, 200)} |")
    lines += ["", f"### Divergent ids (A vs C): {len(ac.divergent_ids)}", ""]
    lines += divergent_ids_markdown(cert)
    scope = cert.promotion_scope
    lines += ["", *numerics_markdown(cert.numerics)]
    lines += ["", *scope_markdown(cert.sequence_scope)]
    lines += [
        "",
        *sensitivity_markdown(scope.rule_of_three, cert.sensitivity),
        "",
        "### Scope",
        "",
        f"> {md_cell(str(scope.valid_for).rstrip('.'), 400)}. This result does not generalize "
        "to other models, context sizes, N, builds or hardware.",
        f"> {md_cell(scope.moe_warning, 400)}",
        "",
        "### Decision reasons",
        "",
    ]
    lines += [f"{i}. {md_cell(reason, 400)}" for i, reason in enumerate(cert.decision_reasons, 1)]
    lines += ["", f"Cert: `{md_code(outputs['cert-path'], _PATH_CHARS)}`"]
    if outputs["bundle-path"]:
        lines.append(f"Signature bundle: `{md_code(outputs['bundle-path'], _PATH_CHARS)}`")
    return "\n".join(lines) + "\n"


def _require_words(require: Require, passed: bool, verdict: str) -> str:
    """Whether ``require`` held; under ``cert`` also that the job did not gate on the verdict."""
    if require != "cert" or not passed:
        return _met(passed)
    return (
        f"met (a cert was written; this job does not gate on the verdict, {verdict}: the caller "
        "does)"
    )


def verdict_annotation(cert: Cert, require: Require, passed: bool, cell: str) -> str:
    """The one ``::notice::`` / ``::error::`` line that states the verdict on the job."""
    verdict = display_verdict(str(cert.status))
    title = f"{TITLE} {verdict}"
    reasons = "; ".join(str(r) for r in cert.decision_reasons[:2])
    if passed:
        met = f"require {require} {_require_words(require, passed, verdict)}"
        return annotation("notice", title, f"{cell}: {verdict}, {met}. {reasons}")
    if cert.status == "failed":
        n = len(cert.divergence_report.ac.divergent_ids)
        mock = " (mock run)" if cert.source == "mock" else ""
        return annotation(
            "error",
            title,
            f"{cell}: batching changed scored outputs on {n} id(s) "
            f"({cert.divergence_class}){mock}. {reasons}",
        )
    if cert.source == "mock":
        return annotation(
            "error",
            title,
            f"{cell}: mock mode: the cert has source=mock and can never pass require "
            f"{require}; use mode live on a real server",
        )
    return annotation(
        "error", title, f"{cell}: {verdict} does not meet require {require}. {reasons}"
    )


def failure_summary(heading: str, error: object) -> str:
    """The job summary of a run that ended without a verdict."""
    return f"## {heading}\n\n{md_cell(error, 1000)}\n"
