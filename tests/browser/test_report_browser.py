"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``) renders the
report of a mock sweep (N = 2, 4 GREEN; N = 8 RED) and of one RED cert; the test reads the
DOM Chromium built (verdicts, ids, the highlighted token), takes a screenshot and checks the
file references no external URL. Skips, saying so, only when Chromium is not installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from batch_invariance.cli import main
from batch_invariance.service.mock_cell import MockRequest, mock_ladder
from tests.support.report_fixtures import mock_cert

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium) for the DOM test"
)
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "wbr", "source", "area", "base"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)


class _Dom(HTMLParser):
    """Every element with its attributes and the text inside it (no external parser)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text += data


def dom(text: str) -> list[Element]:
    parser = _Dom()
    parser.feed(text)
    return parser.elements


def having(elements: list[Element], cls: str) -> list[Element]:
    return [e for e in elements if cls in e.attrs.get("class", "").split()]


def chromium(args: list[str], profile: Path) -> str:
    """Run headless Chromium in its own process group; the group never outlives the call."""
    assert CHROMIUM is not None
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        f"--user-data-dir={profile}", "--window-size=1280,2000", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}"
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    mock_cert(folder, 2)
    mock_cert(folder, 4)
    mock_cert(folder, 8, red=True)
    return folder


def _render(paths: list[Path], out: Path) -> str:
    assert main(["report", *map(str, paths), "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def assert_no_external_reference(text: str) -> None:
    for element in dom(text):
        for name, value in element.attrs.items():
            assert "://" not in value and not value.startswith("//"), f"{element.tag} {name}"
            if name in ("href", "src", "srcset", "action", "poster", "data"):
                assert value.startswith("#"), f"{element.tag} {name}={value!r}"
    assert "url(" not in text and "@import" not in text and "<script" not in text
    assert "http:" not in text and "https:" not in text  # mock certs carry no URL either


def test_sweep_report_renders_in_chromium(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    text = _render([sweep], out)
    assert_no_external_reference(text)
    built = dom(chromium(["--dump-dom", out.as_uri()], tmp_path / "profile"))
    rows = [e for e in built if e.tag == "tr" and "cell-row" in e.attrs.get("class", "")]
    assert [(r.attrs["data-n"], r.attrs["data-verdict"]) for r in rows] == [
        ("2", "GREEN"),
        ("4", "GREEN"),
        ("8", "RED"),
    ]
    assert [b.text for b in having(built, "verdict")][:3] == ["GREEN", "GREEN", "RED"]
    points = [e for e in built if e.tag == "circle" and "rate-point" in e.attrs["class"]]
    assert [p.attrs["data-verdict"] for p in points] == ["GREEN", "GREEN", "RED"]
    assert len(having(built, "interval-bar")) == 3
    ids = {e.attrs["data-test-id"] for e in having(built, "divergent")}
    # run-mock measures the length ladder of its slot: the divergent ids are its rows.
    ladder = mock_ladder(MockRequest(out_dir=tmp_path)).items
    assert ids and ids <= {item.test_id for item in ladder}
    assert having(built, "lengths")  # verdict and drift against sequence length, per cell
    gates = {e.attrs["data-gate"] for e in built if e.tag == "tr" and "data-gate" in e.attrs}
    assert {"F0", "F1", "F2", "F3", "transport", "serial_repeat"} <= gates
    shot = tmp_path / "sweep.png"
    chromium([f"--screenshot={shot}", out.as_uri()], tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_red_cert_report_highlights_the_first_divergent_token(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "red.html"
    text = _render([sweep / "mock__ctx512__N8.json"], out)
    assert_no_external_reference(text)
    built = dom(chromium(["--dump-dom", out.as_uri()], tmp_path / "profile"))
    assert next(b.text for b in having(built, "verdict")) == "RED"
    divergent = having(built, "divergent")
    assert divergent, "a RED mock cell has divergent ids"
    marks = [e for e in built if e.tag == "mark" and "first-divergent-token" in e.attrs["class"]]
    # One highlighted token on the A side and one on the C side of every divergent id.
    assert len(marks) == 2 * len(divergent)
    assert all(m.text for m in marks)
    assert having(built, "side-a") and having(built, "side-c")
    assert len(having(built, "flip")) == len(divergent)
    shot = tmp_path / "red.png"
    chromium([f"--screenshot={shot}", out.as_uri()], tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: Injected into a copy of the report (the report itself carries no script): marks every SVG
#: text whose box, as Chromium laid it out, leaves its SVG's drawing area.
_MARK_OVERFLOW = """<script>
for (const svg of document.querySelectorAll("svg")) {
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  for (const t of svg.querySelectorAll("text")) {
    const b = t.getBBox();
    if (b.x < 0 || b.y < 0 || b.x + b.width > w || b.y + b.height > h) {
      const x = `x ${Math.round(b.x)}+${Math.round(b.width)} of ${w}`;
      const box = `${x}, y ${b.y.toFixed(1)}+${b.height.toFixed(1)} of ${h}`;
      t.setAttribute("data-outside", `${svg.getAttribute("class")}: ${box}`);
    }
  }
  svg.setAttribute("data-checked", "yes");
}
</script>"""


def test_every_plot_label_lies_inside_its_svg(sweep: Path, tmp_path: Path) -> None:
    """Checked on Chromium's layout, not on estimated text widths: a label that started at the
    right axis once ran out of the plot ("tokens/s (C)" was shown as "tokens/s (C")."""
    text = _render([sweep], tmp_path / "report.html")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", _MARK_OVERFLOW + "</body>"), encoding="utf-8")
    built = dom(chromium(["--dump-dom", probe.as_uri()], tmp_path / "profile"))
    svgs = [e for e in built if e.tag == "svg"]
    assert svgs and all(e.attrs.get("data-checked") == "yes" for e in svgs)
    assert any("tokens/s (C)" in e.text for e in built if e.tag == "text")
    outside = [(e.text, e.attrs["data-outside"]) for e in built if "data-outside" in e.attrs]
    assert outside == []


def test_history_over_builds_renders_in_chromium(tmp_path: Path) -> None:
    """Four builds of one cell: the history table, one row per build, as Chromium built it."""
    from tests.unit.report.test_history import history_certs

    paths = history_certs(tmp_path / "builds")
    out = tmp_path / "history.html"
    text = _render(paths, out)
    assert_no_external_reference(text)
    built = dom(chromium(["--dump-dom", out.as_uri()], tmp_path / "profile"))
    (section,) = [e for e in built if e.tag == "section" and "history" in e.attrs.get("class", "")]
    assert (section.attrs["data-model"], section.attrs["data-n"]) == ("tiny-model", "4")
    rows = [e for e in built if e.tag == "tr" and "history-row" in e.attrs.get("class", "")]
    assert [r.attrs["data-build"] for r in rows] == [
        "llama-server@" + c * 6 for c in ("a1", "b2", "c3", "d4")
    ]
    assert "first build" in rows[0].text
    assert "0 of 32" in rows[1].text and "1 of 32" in rows[1].text  # no answer changed, 1 drift
    assert "1 of 32 (+1 tokens only)" in rows[2].text
    assert "not comparable: another work-set" in rows[3].text
