"""The report's history over builds: one row per build of a cell, each against the previous
(answers changed, drift), in Markdown and JSON (golden) and HTML (the browser test renders it
in Chromium: tests/browser)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.store import render
from batch_invariance.cli import main
from batch_invariance.report.html import render_html
from batch_invariance.report.load import load_all
from batch_invariance.report.markdown import render_markdown
from batch_invariance.report.model import build_report
from batch_invariance.report.summary import render_json
from tests.support.factories import (
    changed,
    comparable_cert,
    green_evidence,
    make_trial,
    replace_trial,
)
from tests.support.golden import check_golden


def history_certs(root: Path) -> list[Path]:
    """Four builds of one cell, written as release folders (relative to ``root``): b1; b2 the
    same answers with one prompt's logprobs drifted; b3 one answer changed and one token-only
    change; b4 another work-set (not comparable)."""
    ev = green_evidence()
    drifted = make_trial("t001")
    lps = list(drifted.token_logprobs or ())
    lps[4] -= 0.0625
    ev2 = replace_trial(ev, "A", "t001", replace(drifted, token_logprobs=tuple(lps)))
    ev3 = replace_trial(ev2, "A", "t005", changed(make_trial("t005"), completion="answer-t5",
                                                  tokens=tuple("answer-t5"),
                                                  extracted_answer="answer-t5"))  # fmt: skip
    tok = make_trial("t006")
    text = "answer-t0O6"
    same_answer = changed(
        tok, completion=text, tokens=tuple(text), extracted_answer=tok.extracted_answer
    )
    ev3 = replace_trial(ev3, "A", "t006", same_answer)
    builds = [
        ("b1", comparable_cert(ev, binary_sha="a1" * 32, ts_utc="2026-10-01T00:00:00Z")),
        ("b2", comparable_cert(ev2, binary_sha="b2" * 32, ts_utc="2026-11-01T00:00:00Z")),
        ("b3", comparable_cert(ev3, binary_sha="c3" * 32, ts_utc="2026-12-01T00:00:00Z")),
        ("b4", comparable_cert(ev3, binary_sha="d4" * 32, ts_utc="2026-12-02T00:00:00Z",
                               workset={"sha256": "ee" * 32})),
    ]  # fmt: skip
    paths = []
    for folder, cert in builds:
        path = root / folder / "tiny-model__ctx2048__N4.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(cert), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.fixture()
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    monkeypatch.chdir(tmp_path)
    return [p.relative_to(tmp_path) for p in history_certs(tmp_path)]


def test_history_rows_compare_each_build_with_the_previous(builds: list[Path]) -> None:
    report = build_report(load_all(builds, None))
    (history,) = report.histories
    assert (history.model, history.ctx, history.n) == ("tiny-model", 2048, 4)
    rows = history.rows
    assert [r.build for r in rows] == [
        "llama-server@a1a1a1a1a1a1",
        "llama-server@b2b2b2b2b2b2",
        "llama-server@c3c3c3c3c3c3",
        "llama-server@d4d4d4d4d4d4",
    ]
    assert [r.verdict for r in rows] == ["GREEN", "UNVERIFIED", "RED", "RED"]
    assert rows[0].note == "first build" and rows[0].answers_changed is None
    assert (rows[1].answers_changed, rows[1].tokens_changed, rows[1].drift) == (0, 0, 1)
    assert (rows[2].answers_changed, rows[2].tokens_changed, rows[2].drift) == (1, 1, 0)
    assert rows[2].compared == 32
    assert rows[3].answers_changed is None
    assert rows[3].note.startswith("not comparable: another work-set")


def test_one_build_per_cell_has_no_history(builds: list[Path]) -> None:
    assert build_report(load_all(builds[:1], None)).histories == ()


def test_history_golden_markdown_and_json(builds: list[Path]) -> None:
    report = build_report(load_all(builds, None))
    markdown = render_markdown(report)
    check_golden("report_history.md", markdown[markdown.index("### History over builds") :])
    data = json.loads(render_json(report))
    check_golden(
        "report_history.json", json.dumps(data["histories"], indent=2, sort_keys=True) + "\n"
    )


def test_history_in_html_and_the_report_command(
    builds: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    html = render_html(build_report(load_all(builds, None)))
    assert '<section class="history" data-model="tiny-model" data-ctx="2048" data-n="4">' in html
    assert html.count('<tr class="history-row"') == 4
    assert "1 of 32 (+1 tokens only)" in html
    assert main(["report", *map(str, builds), "--out", "r.md"]) == 0
    assert "### History over builds: tiny-model ctx 2048 N 4: 4 builds" in Path("r.md").read_text()
