"""The search's plot in a real browser: headless Chromium renders the report of a search
folder (its ``search.json`` beside a cert); the test reads the DOM Chromium built (one point
per configuration with evidence, coloured by verdict, a probe's reject hollow on the bottom
line), checks every label lies inside the plot, and takes a screenshot. Skips only when
Chromium is not installed."""

from __future__ import annotations

import json
from pathlib import Path

from batch_invariance.report.plot import VERDICT_COLOURS
from batch_invariance.service.search_record import search_record
from tests.browser.test_report_browser import (
    _MARK_OVERFLOW,
    _render,
    assert_no_external_reference,
    chromium,
    dom,
    pytestmark,  # noqa: F401  (skips without Chromium)
)
from tests.support.report_fixtures import mock_cert
from tests.unit.core.test_search import golden_rows


def test_the_search_plot_renders_every_configuration_in_chromium(tmp_path: Path) -> None:
    folder = tmp_path / "search"
    folder.mkdir()
    mock_cert(folder, 4)  # the report needs a cert; the search record sits beside it
    record = search_record("gemma-3-270m-q4_k_m", 1024, 4, "llama-server", golden_rows(),
                           stopped=None, wall_s=3600.0)  # fmt: skip
    (folder / "search.json").write_text(json.dumps(record))
    out = tmp_path / "report.html"
    text = _render([folder], out)
    assert_no_external_reference(text)
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", _MARK_OVERFLOW + "</body>"), encoding="utf-8")
    built = dom(chromium(["--dump-dom", probe.as_uri()], tmp_path / "profile"))
    (svg,) = [e for e in built if e.tag == "svg" and e.attrs.get("class") == "search-plot"]
    points = [e for e in built if e.tag == "circle" and e.attrs.get("class") == "config"]
    # t1 did not run: no evidence, no point.
    assert [(p.attrs["data-config"], p.attrs["data-verdict"]) for p in points] == [
        ("defaults", "RED"), ("ub1", "GREEN"), ("ub1-t1", "GREEN"), ("fa-on", "RED")
    ]  # fmt: skip
    colours = {p.attrs["data-config"]: (p.attrs["fill"], p.attrs["stroke"]) for p in points}
    assert colours["ub1"] == (VERDICT_COLOURS["GREEN"], VERDICT_COLOURS["GREEN"])
    assert colours["fa-on"] == ("none", VERDICT_COLOURS["RED"])  # a probe's reject: hollow
    # ub1 buys 0.90x: below the 1.0x line; the defaults buy 1.72x: above it.
    ys = {p.attrs["data-config"]: float(p.attrs["cy"]) for p in points}
    assert ys["defaults"] < ys["ub1"] < ys["fa-on"]
    assert svg.attrs.get("data-checked") == "yes"
    outside = [(e.text, e.attrs["data-outside"]) for e in built if "data-outside" in e.attrs]
    assert outside == []
    assert any("fastest promotable GREEN: ub1" in e.text for e in built if e.tag == "li")
    shot = tmp_path / "search.png"
    chromium([f"--screenshot={shot}", out.as_uri()], tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
