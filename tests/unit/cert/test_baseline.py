"""A compare baseline from other rules is read as far as its fields allow; one under these
rules is verified in full; another layout is refused (cert/baseline.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.cert.baseline import compared_fields, read_baseline
from batch_invariance.cert.schema import CERT_VERSION, compute_digest
from batch_invariance.cert.store import render
from batch_invariance.core.rules import RULES_VERSION
from batch_invariance.errors import CertInvalid
from batch_invariance.report.compare_load import load_side
from tests.support.factories import comparable_cert, load_cert


def _as_released(**changes: Any) -> str:
    data = json.loads(render(comparable_cert()))
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        data.pop(key)
    data["digest"] = compute_digest(data)
    return json.dumps(data)


def test_under_these_rules_it_is_verified_in_full() -> None:
    found = read_baseline(render(comparable_cert()), "b.json")
    assert found.rules_note is None and found.cert.rules_version == RULES_VERSION
    edited = json.loads(render(comparable_cert()))
    edited["status"], edited["verdict"] = "failed", "RED"
    edited["digest"] = compute_digest(edited)
    with pytest.raises(CertInvalid, match="its own evidence gives 'green'"):
        read_baseline(json.dumps(edited), "b.json")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"rules_version": RULES_VERSION + 1}, f"rules {RULES_VERSION + 1} by batch-invariance 7"),
        ({"rules_version": None}, "unversioned rules of 7"),
    ],
)
def test_under_other_rules_it_is_read_and_the_note_says_so(
    changes: dict[str, Any], words: str
) -> None:
    found = read_baseline(_as_released(tool_version="7", **changes), "b.json")
    assert found.cert.tool_version == "7"
    assert found.rules_note is not None
    assert found.rules_note.startswith(f"baseline written under {words} (this is rules ")
    assert found.rules_note.endswith(
        ": its verdict is not re-derived; compared: answers, tokens, logprobs"
    )


def test_another_layout_is_refused() -> None:
    text = _as_released(cert_version=CERT_VERSION + 1, tool_version="9.0")
    fix = f"a release that reads cert_version {CERT_VERSION + 1}$"
    with pytest.raises(CertInvalid, match=r"another layout .* " + fix) as found:
        read_baseline(text, "b.json")
    assert "pip install" not in str(found.value)


def test_compared_fields_follow_what_arm_a_recorded(tmp_path: Path) -> None:
    cert = comparable_cert()
    assert compared_fields(cert) == ("answers", "tokens", "logprobs")
    data = json.loads(render(cert))
    for trial in data["evidence"]["a"].values():
        trial["tokens"] = trial["token_logprobs"] = trial["top_margins"] = None
    data["digest"] = compute_digest(data)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    assert compared_fields(load_cert(path)) == ("answers",)


def test_only_a_side_loaded_as_baseline_reads_other_rules(tmp_path: Path) -> None:
    """compare, run-live --baseline and the Action load their baseline so; nothing else."""
    path = tmp_path / "old.json"
    path.write_text(_as_released(tool_version="7.0", rules_version=RULES_VERSION + 1))
    (side,) = load_side(path, None, baseline=True)
    assert side.rules_note is not None and side.ref().rules_note == side.rules_note
    with pytest.raises(CertInvalid, match="not re-derivable here"):
        load_side(path, None)
