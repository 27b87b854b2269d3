"""The HTML view without a browser: escaping, invalid certs, highlighted tokens, no script."""

from __future__ import annotations

from batch_invariance.report.html import render_html
from batch_invariance.report.model import build_report
from report_fixtures import loaded, red_data, sweep_inputs


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
