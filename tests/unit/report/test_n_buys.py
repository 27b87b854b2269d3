"""What N buys, in every view of a verdict: a GREEN whose concurrent throughput is not above
serial says that N buys nothing here in its banner, job summary, verify-cert text and report,
and the sweep names the largest N both safe and faster than N=1 beside max_safe_parallel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batch_invariance.cert.build import evidence_from_cert
from batch_invariance.cert.certificate import Cert, cert_to_json
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.core.throughput import Throughput
from batch_invariance.core.verdict import decide
from batch_invariance.report import render
from batch_invariance.report.html import render_html
from batch_invariance.report.markdown import render_markdown
from batch_invariance.report.model import build_report
from batch_invariance.service.finish import FinishedCell
from batch_invariance.service.sweep_summary import SweepCell, sweep_summary
from tests.support.factories import cert_for, green_evidence, live_provenance, spec
from tests.support.report_fixtures import loaded

CERT_PATH = Path("/certs/tiny-model__ctx2048__N4.json")

#: Serial 64.0 tok/s (arm A: 1280 tokens in 20 s), concurrent 51.2 tok/s (2560 in 50 s).
SLOWER = (
    "GREEN: N=4 buys 0.80x here: concurrent is not faster than serial, so N=4 buys nothing "
    "here (serial 64.0 tok/s, N=4 concurrent 51.2 tok/s)"
)


def _slower_green() -> Cert:
    """A promotable GREEN whose two C passes took 25 s each: concurrent slower than serial."""
    arms: list[dict[str, Any]] = live_provenance(spec())["arms"]
    slow = [{**arm, "wall_s": 25.0} if arm["arm"] == "C" else arm for arm in arms]
    cert = cert_for(green_evidence(slot_ctx=2048), extra_provenance={"arms": slow})[0]
    assert cert.status == "green" and cert.throughput is not None
    assert cert.throughput.speedup == 0.8
    return cert


def test_the_banner_says_a_slower_green_buys_nothing_right_under_its_headline() -> None:
    lines = render.live_banner(_slower_green(), CERT_PATH, None, "live cell x").splitlines()
    assert lines[1].startswith("  GREEN  live cell x") and lines[3] == f"  {SLOWER}"


def test_the_job_summary_and_verify_cert_say_it_in_the_same_words() -> None:
    cert = _slower_green()
    outputs = {"verdict": "GREEN", "promotable": "true", "cell": "tiny-model/2048/4",
               "cert-path": "c.json", "bundle-path": ""}  # fmt: skip
    summary = render.summary_markdown(cert, "green", True, outputs)
    assert f"- **What N buys:** {SLOWER}\n" in summary
    report = verify(cert, Depth.PARSED, origin=str(CERT_PATH), path=CERT_PATH)
    assert report.promotable
    assert f"\nthroughput: {SLOWER}\n" in render.verify_report_text(report, None)


def test_the_report_says_it_in_its_table_and_beside_the_cell() -> None:
    report = build_report([loaded(cert_to_json(_slower_green()), "slow.json", promotable=True)])
    words = "N=4 buys 0.80x here: concurrent is not faster than serial, so N=4 buys nothing here"
    html = render_html(report)
    assert f"<td>{words}</td>" in html
    assert f'<p class="n-buys">GREEN: {words}</p>' in html
    assert f"| {words} |" in render_markdown(report)


def test_the_throughput_line_of_each_verdict() -> None:
    def block(speedup: float | None) -> Throughput:
        concurrent = None if speedup is None else 20.0 * speedup
        return Throughput(20.0, concurrent, speedup, 0.2, 0.2, 22.0, 960, 960)

    assert render.throughput_text(block(2.5), 4, "GREEN") == (
        "GREEN: N=4 buys 2.50x here (serial 20.0 tok/s, N=4 concurrent 50.0 tok/s)"
    )
    assert render.throughput_text(block(2.5), 4, "RED").startswith(
        "RED: N=4 would buy 2.50x here; staying serial costs this ("
    )
    # A slowdown is never called a cost of staying serial.
    assert render.throughput_text(block(0.35), 4, "RED").startswith(
        "RED: N=4 would buy 0.35x here: concurrent is not faster than serial, so staying "
        "serial costs nothing ("
    )
    missing = "GREEN: throughput not measured (the server reported no token timings)"
    assert render.throughput_text(None, 4, "GREEN") == missing
    assert render.throughput_text(block(None), 4, "GREEN") == missing


def _sweep_cell(n: int, cert: Cert) -> SweepCell:
    finished = FinishedCell(cert, decide(evidence_from_cert(cert), cert.evidence.policy),
                            CERT_PATH, None)  # fmt: skip
    return SweepCell(n, finished, verify(cert, Depth.PARSED, path=CERT_PATH), None)


def test_the_sweep_names_the_largest_safe_n_that_is_faster_than_n1() -> None:
    """N=2 and N=4 both promotable GREEN, but N=4 buys 0.80x: the largest N both safe and
    faster than serial is 2."""
    fast = cert_for(green_evidence(slot_ctx=2048))[0]
    cells = [_sweep_cell(2, fast), _sweep_cell(4, _slower_green())]
    summary = sweep_summary("tiny-model", 2048, cells, launches=3)
    assert summary["max_safe_parallel"] == 4
    assert summary["max_safe_faster_parallel"] == 2
    text = render.sweep_text(summary, Path("/certs/sweep.json"))
    assert (
        "  max_safe_faster_parallel = 2  (no safe N above it is measured faster than N=1)\n"
    ) in text
    only_slow = sweep_summary("tiny-model", 2048, cells[1:], launches=2)
    assert only_slow["max_safe_parallel"] == 4 and only_slow["max_safe_faster_parallel"] is None
    assert "max_safe_faster_parallel = None  (no safe N is measured faster than N=1: N buys " in (
        render.sweep_text(only_slow, Path("/certs/sweep.json"))
    )
