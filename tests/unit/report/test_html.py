"""The HTML view without a browser: escaping, invalid certs, highlighted tokens, no script."""

from __future__ import annotations

from batch_invariance.report.html import render_html
from batch_invariance.report.model import build_report
from tests.support.report_fixtures import loaded, red_data, sweep_inputs


def test_every_cert_value_is_escaped() -> None:
    data = red_data(8, model="<script>alert(1)</script>")
    data["evidence"]["a"]["q1"]["tokens"] = ["<b>", "&", " is", "</pre>", "x"]
    html = render_html(build_report([loaded(data, 'x"><img src=y>.json')]))
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;b&gt;&amp;" in html
    assert '<mark class="first-divergent-token"> is</mark>&lt;/pre&gt;x' in html


def test_invalid_certs_sections_and_highlights() -> None:
    html = render_html(build_report(sweep_inputs()))
    assert '<li class="invalid-cert"><code>broken__ctx2048__N4.json</code>: digest mismatch' in html
    assert html.count('<section class="group"') == 2
    assert html.count('class="cell-row"') == 4
    # q1 is split on both sides; q2 has no tokens, q3 has a token only on A.
    assert html.count('<mark class="first-divergent-token">') == 3
    assert "(tokens not recorded)" in html
    assert "tie flip" in html and "<script" not in html


def test_the_report_draws_rows_x_passes_drift_vs_flip_and_the_risk_curve() -> None:
    html = render_html(build_report([loaded(red_data(4), "red.json")]))
    assert '<svg class="numerics-grid"' in html and '<svg class="risk-curve"' in html
    # q1 flips in passes 0 and 2, q3 drifts in pass 1, q2 has no logprobs: 3 ids x 4 passes.
    assert html.count('class="cell-flip"') == 2 and html.count('class="cell-drift"') == 1
    assert html.count('class="cell-missing"') == 4 and html.count('class="cell-equal"') == 5
    assert "C1: drift on 1/2 rows, token flip on 0, max |delta| 0.188" in html
    assert "batching changed the numerics on 2 of 2 rows" in html
    bare = red_data(4)
    del bare["numerics"]
    assert "not recorded in this cert" in render_html(build_report([loaded(bare, "old.json")]))
