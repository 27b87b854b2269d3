"""`batch-invariance compare` with a baseline written under other decision rules (an earlier
release's): compared as far as its fields allow, its verdict not re-derived, and said so in the
text, the JSON and the job summary; another cert layout is refused (docs/compare.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.schema import CERT_VERSION, compute_digest
from batch_invariance.cert.store import render
from batch_invariance.cli import main
from batch_invariance.core.rules import RULES_VERSION
from batch_invariance.report.compare_load import compare_inputs
from batch_invariance.report.compare_render import comparison_markdown
from tests.support.factories import comparable_cert, green_evidence, make_trial, replace_trial

OLDER = RULES_VERSION - 1
NOTE = (
    f"baseline written under rules {OLDER} by batch-invariance 0.0.9 (this is rules "
    f"{RULES_VERSION}, batch-invariance {__version__}): its verdict is not re-derived; "
    "compared: answers, tokens, logprobs"
)


def _released(path: Path, data: dict[str, Any], **changes: Any) -> Path:
    """``data`` as an earlier release wrote it: ``changes`` applied (``None`` removes a key),
    digested by that release."""
    data = {**data, **changes}
    for key in [k for k, v in changes.items() if v is None]:
        data.pop(key)
    data["digest"] = compute_digest(data)
    path.write_text(json.dumps(data, sort_keys=True, indent=2), encoding="utf-8")
    return path


def _cert_json(**kw: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(render(comparable_cert(**kw)))
    return data


@pytest.fixture
def sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A baseline of older rules by release 0.0.9 and a new cert of this release."""
    monkeypatch.chdir(tmp_path)
    _released(Path("old.json"), _cert_json(), tool_version="0.0.9", rules_version=OLDER)
    Path("new.json").write_text(render(comparable_cert(binary_sha="33" * 32)), encoding="utf-8")
    return "old.json", "new.json"


def test_a_baseline_of_older_rules_is_compared_and_says_what_was_not_rederived(
    sides: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify-cert", sides[0]]) == exitcodes.CERT_INVALID  # refused on its own
    capsys.readouterr()
    assert main(["compare", *sides, "--allow-unsigned"]) == 0
    out = capsys.readouterr().out
    assert f"\n  {NOTE}\n" in out
    assert "arm A, 32 prompts: 32 identical" in out and "verdict GREEN -> GREEN" in out
    assert main(["compare", *sides, "--allow-unsigned", "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["baseline"]["rules_note"] == NOTE
    assert (cell["baseline"]["rules_version"], cell["baseline"]["tool_version"]) == (OLDER, "0.0.9")
    assert cell["new"]["rules_note"] is None and cell["new"]["rules_version"] == RULES_VERSION
    assert cell["counts"]["identical"] == 32


def test_a_changed_answer_against_an_older_baseline_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _released(Path("old.json"), _cert_json(), tool_version="0.0.9", rules_version=OLDER)
    t = make_trial("t003")
    text = "answer-t3"
    ev = replace_trial(
        green_evidence(), "A", "t003",
        replace(t, completion=text, tokens=tuple(text), extracted_answer=text),
    )  # fmt: skip
    Path("new.json").write_text(render(comparable_cert(ev)), encoding="utf-8")
    assert main(["compare", "old.json", "new.json", "--allow-unsigned"]) == 1
    out = capsys.readouterr().out
    assert "scored     t003: extracted_answer" in out and NOTE in out


def test_an_unversioned_baseline_of_another_release_is_read_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written before rules versions were recorded: the rules of exactly its release."""
    monkeypatch.chdir(tmp_path)
    _released(Path("old.json"), _cert_json(), tool_version="0.0.9", rules_version=None)
    Path("new.json").write_text(render(comparable_cert()), encoding="utf-8")
    assert main(["compare", "old.json", "new.json", "--allow-unsigned"]) == 0
    out = capsys.readouterr().out
    assert (
        f"  baseline written under unversioned rules of 0.0.9 (this is rules {RULES_VERSION}, "
        f"batch-invariance {__version__}): its verdict is not re-derived; compared: answers, "
        "tokens, logprobs\n" in out
    )


def test_the_note_names_only_the_fields_the_baseline_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _cert_json()
    for trial in data["evidence"]["a"].values():
        trial["token_logprobs"] = trial["top_margins"] = None
    _released(Path("old.json"), data, tool_version="0.0.9", rules_version=OLDER)
    Path("new.json").write_text(render(comparable_cert()), encoding="utf-8")
    assert main(["compare", "old.json", "new.json", "--allow-unsigned"]) == 3  # unchecked
    out = capsys.readouterr().out
    assert "its verdict is not re-derived; compared: answers, tokens\n" in out


def test_a_baseline_under_these_rules_is_verified_in_full_and_carries_no_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _cert_json()
    _released(Path("old.json"), data, tool_version="0.0.9")  # another release, these rules
    Path("new.json").write_text(render(comparable_cert()), encoding="utf-8")
    assert main(["compare", "old.json", "new.json", "--allow-unsigned", "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["baseline"]["rules_note"] is None
    # ... so a verdict edited and re-digested is caught by the re-derivation, as before
    _released(Path("old.json"), data, status="green_with_caveat", verdict="AMBER")
    assert main(["compare", "old.json", "new.json", "--allow-unsigned"]) == exitcodes.CERT_INVALID
    assert "its own evidence gives 'green'" in capsys.readouterr().err


def test_an_older_baseline_still_has_its_schema_and_digest_checked(
    sides: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    old = json.loads(Path(sides[0]).read_text())
    old["evidence"]["a"]["t001"]["extracted_answer"] = "edited"  # not re-digested
    Path(sides[0]).write_text(json.dumps(old))
    assert main(["compare", *sides, "--allow-unsigned"]) == exitcodes.CERT_INVALID
    err = capsys.readouterr().err
    assert "digest mismatch" in err and len(err.splitlines()) == 1
    _released(Path(sides[0]), old, ctx="2048")  # a schema error, digested
    assert main(["compare", *sides, "--allow-unsigned"]) == exitcodes.CERT_INVALID
    err = capsys.readouterr().err
    assert "does not match the cert schema: ctx" in err and "re-derivable" not in err


def test_a_baseline_of_another_layout_is_refused_with_one_line(
    sides: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    old = json.loads(Path(sides[0]).read_text())
    _released(Path(sides[0]), old, cert_version=CERT_VERSION - 1, tool_version="0.0.5")
    assert main(["compare", *sides, "--allow-unsigned"]) == exitcodes.CERT_INVALID
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert (
        f"old.json: a baseline of cert_version {CERT_VERSION - 1} (written by batch-invariance "
        f"0.0.5) has another layout than this tool reads (cert_version {CERT_VERSION}), so its "
        f"fields cannot be compared here; compare it with a release that reads cert_version "
        f"{CERT_VERSION - 1}" in captured.err
    )
    assert "pip install" not in captured.err


def test_only_the_baseline_is_read_under_other_rules(
    sides: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The new side is what this release vouches for: verified in full, other rules refused."""
    assert main(["compare", sides[1], sides[0], "--allow-unsigned"]) == exitcodes.CERT_INVALID
    err = capsys.readouterr().err
    assert "its rules are not re-derivable here" in err and f"rules {OLDER}" in err


def test_the_job_summary_says_it_too(sides: tuple[str, str]) -> None:
    comparison = compare_inputs(Path(sides[0]), Path(sides[1]), None)
    assert f"- `tiny-model` ctx 2048 N 4: {NOTE}" in comparison_markdown(comparison, "scored")
