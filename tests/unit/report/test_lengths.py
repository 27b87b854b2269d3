"""The report's drawing of verdict and drift against sequence length (``report/lengths.py``)."""

from __future__ import annotations

import json

from batch_invariance.report.html import render_html
from batch_invariance.report.lengths import length_view
from batch_invariance.report.model import build_report
from tests.support.paths import EXAMPLES
from tests.support.report_fixtures import loaded, red_data

RED = EXAMPLES / "certs" / "scope" / "gemma-3-270m-q4_k_m__ctx1024__N4.json"


def test_the_report_draws_verdict_and_drift_against_sequence_length() -> None:
    red = RED
    html = render_html(build_report([loaded(json.loads(red.read_text()), "red.json")]))
    assert '<svg class="lengths"' in html and 'aria-label="RED: drift against sequence' in html
    # Four quarter bands, three series each; the 3/4 mark, the reach and the first drift.
    assert html.count('class="band-drift"') == 4 and html.count('class="band-changed"') == 4
    assert "first drift at position 257" in html and "3/4 of the slot: 768 tokens" in html
    assert "<tr><td>257-512</td><td>16</td><td>16</td><td>4</td><td>257</td></tr>" in html
    old = red_data(4)
    assert "sequence length: not recorded" in render_html(build_report([loaded(old, "o.json")]))


def test_a_block_that_cannot_be_read_is_not_drawn() -> None:
    data = json.loads(RED.read_text())
    view = length_view(data)
    assert view is not None and view.first_drift == 257 and view.longest == 965
    assert [b.drift for b in view.bands] == [0, 16, 16, 16]
    data["sequence_scope"]["bands"][0]["rows_compared"] = "many"
    assert length_view(data) is None
    assert length_view({"sequence_scope": None}) is None
