"""The job summary's A and C answers open just before their first difference, so the two
cells of a divergent row show what changed (cut at their first 80 characters, a third of the
rows of a real RED read the same on both sides)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.report import render
from batch_invariance.report.divergence import (
    WINDOW_CHARS,
    WINDOW_LEAD,
    ac_excerpts,
    answer_windows,
    first_difference,
    shown_text,
)
from tests.support.factories import load_cert
from tests.support.paths import EXAMPLES

#: Real REDs of the embedded pair (examples/certs/README.md).
REDS = [
    EXAMPLES / "certs" / "gemma-3-270m-q4_k_m__ctx1024__N4.json",
    EXAMPLES / "certs" / "scope" / "gemma-3-270m-q4_k_m__ctx1024__N4.json",
]
OUTPUTS = {"verdict": "RED", "cell": "c", "promotable": "false", "cert-path": "c",
           "bundle-path": ""}  # fmt: skip


def test_the_first_difference() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abcd", "abXd") == 2
    assert first_difference("abc", "abcdef") == 3  # a prefix differs where it ends
    assert first_difference("", "x") == 0


def test_the_windows_open_a_little_before_the_first_difference() -> None:
    same = "x" * 100
    a, c = answer_windows(same + " then A went on", same + " then C went on")
    assert a != c
    assert a.startswith("…") and c.startswith("…")
    assert a == "…" + (same + " then A went on")[100 + 6 - WINDOW_LEAD :]
    assert len(a) <= WINDOW_CHARS + 2 and len(c) <= WINDOW_CHARS + 2
    # A difference near the start: shown from the start, the rest cut with a marker.
    a, c = answer_windows("Yes. " + "y" * 100, "No. " + "y" * 100)
    assert a.startswith("Yes. ") and c.startswith("No. ") and a.endswith("…")
    # Equal answers are shown from the start; a difference in line breaks shows.
    assert answer_windows("same", "same") == ("same", "same")
    a, c = answer_windows("one\ntwo", "one two")
    assert (a, c) == ("one\\ntwo", "one two")


def test_shown_text_is_one_line() -> None:
    assert shown_text("a\r\n\tb   c") == "a\\r\\n\\tb c"


@pytest.mark.parametrize("path", REDS, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_row_of_a_real_red_shows_two_different_answers(path: Path) -> None:
    cert = load_cert(path)
    rows = [r for r in cert.divergence_report.ac.per_id if r.kind != "token_only"]
    shown = [ac_excerpts(cert, row) for row in rows]
    assert shown and all(a != c for a, c in shown)
    table = [
        line.split(" | ")
        for line in render.summary_markdown(cert, "green", False, OUTPUTS).splitlines()
        if line.startswith("| `")
    ]
    assert table and all(cells[3] != cells[4].removesuffix(" |") for cells in table)


def test_the_ladder_red_had_rows_whose_first_80_characters_agree() -> None:
    """What the windows fix: rows whose recorded excerpts are equal still show apart."""
    cert = load_cert(REDS[1])
    rows = [r for r in cert.divergence_report.ac.per_id if r.kind != "token_only"]
    alike = [r for r in rows if r.x_excerpt == r.y_excerpt]
    assert alike
    for row in alike:
        a, c = ac_excerpts(cert, row)
        assert a != c and str(a).startswith("…")


def test_without_tokens_the_excerpts_are_windowed_and_a_missing_answer_shows_its_value() -> None:
    cert = load_cert(REDS[0])
    row = next(r for r in cert.divergence_report.ac.per_id if r.kind != "token_only")
    evidence = replace(
        cert.evidence,
        a={k: replace(t, tokens=None) for k, t in cert.evidence.a.items()},
    )
    bare = replace(cert, evidence=evidence)
    assert ac_excerpts(bare, row) == answer_windows(str(row.x_excerpt), str(row.y_excerpt))
    missing = replace(row, x_excerpt=None, x="(missing)")
    assert ac_excerpts(cert, missing) == ("(missing)", row.y_excerpt)
