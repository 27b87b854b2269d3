"""The memo of verified cert texts: what it remembers, what a hit still checks, what changes
its key, and that a memo which cannot work leaves full verification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batch_invariance.cache_dir import cache_root
from batch_invariance.cert.memo import (
    MEMO_ENV,
    FolderMemo,
    fingerprint_of,
    memo_key,
    rules_fingerprint,
    verified_memo,
)
from batch_invariance.cert.schema import cert_to_json, compute_digest
from batch_invariance.cert.store import render
from batch_invariance.cert.verify import Depth, verify
from batch_invariance.cli import main
from tests.support.factories import cert_for, comparable_cert, green_evidence

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "batch_invariance"


class _Recorder:
    """A memo in memory that says which keys it was asked about and told."""

    def __init__(self, known: set[str] | None = None) -> None:
        self.known = set() if known is None else known
        self.asked: list[str] = []

    def knows(self, key: str) -> bool:
        self.asked.append(key)
        return key in self.known

    def remember(self, key: str) -> None:
        self.known.add(key)


def _edited_in_evidence() -> str:
    """A C score edited and re-digested: the digest passes, only re-derivation catches it."""
    data = cert_to_json(cert_for()[0])
    data["evidence"]["c_passes"][0]["trials"]["t002"]["score"] = 0.0
    data["digest"] = compute_digest(data)
    return json.dumps(data, sort_keys=True, indent=2)


def test_where_the_memo_lives(tmp_path: Path) -> None:
    assert verified_memo({MEMO_ENV: "off"}) is None
    assert verified_memo({MEMO_ENV: " OFF "}) is None
    assert verified_memo({MEMO_ENV: str(tmp_path)}) == FolderMemo(tmp_path)
    env = {"BATCH_INVARIANCE_CACHE": str(tmp_path / "c")}
    assert verified_memo(env) == FolderMemo(cache_root(env) / "verified")


def test_a_text_that_passes_is_remembered_and_a_failing_one_never() -> None:
    memo = _Recorder()
    good = render(cert_for()[0])
    assert verify(good, Depth.REMEMBERED, memo=memo).valid
    assert memo.known == {memo_key(good)}
    bad = _edited_in_evidence()
    for _ in range(2):  # verified in full both times: nothing was remembered
        found = verify(bad, Depth.REMEMBERED, memo=memo)
        assert not found.valid and "its own evidence gives" in found.problems[0]
    assert memo.known == {memo_key(good)}


def test_a_known_text_skips_exactly_the_checks_the_memo_vouches_for() -> None:
    """A key is only ever remembered for bytes that passed; forcing one in shows what a hit
    skips (the re-derivation, the digest) and what it still checks (schema, version)."""
    edited = _edited_in_evidence()
    assert not verify(edited).valid
    assert verify(edited, Depth.REMEMBERED, memo=_Recorder({memo_key(edited)})).valid
    data = cert_to_json(cert_for()[0])
    data["tool_version"] = "0.0.1"
    data["rules_version"] += 1  # another release alone is not another version: other rules
    other_version = json.dumps(data)
    found = verify(other_version, Depth.REMEMBERED, memo=_Recorder({memo_key(other_version)}))
    assert not found.valid and "not re-derivable here" in found.problems[0]
    broken = render(cert_for()[0]).replace('"ctx"', '"context"', 1)
    found = verify(broken, Depth.REMEMBERED, memo=_Recorder({memo_key(broken)}))
    assert not found.valid and "does not match the cert schema" in found.problems[0]


def test_the_key_is_the_bytes_under_these_rules() -> None:
    text = render(cert_for()[0])
    assert memo_key(text) == memo_key(text.encode())
    assert memo_key(text) != memo_key(text + " ")
    assert memo_key("\ud800") is None  # no UTF-8 bytes: no key, so full verification
    assert rules_fingerprint() is not None


def test_any_edit_to_the_code_is_another_fingerprint(tmp_path: Path) -> None:
    copy = tmp_path / "batch_invariance"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    versions = ("3.11", "2.0")
    before = fingerprint_of(copy, versions)
    assert before is not None and before == fingerprint_of(copy, versions)
    assert fingerprint_of(copy, ("3.12", "2.0")) != before
    rule = copy / "core" / "verdict.py"
    rule.write_text(rule.read_text() + "\n# one more line\n")
    assert fingerprint_of(copy, versions) not in (None, before)
    (copy / "core" / "moved.py").symlink_to(tmp_path / "absent.py")  # cannot be read
    assert fingerprint_of(copy, versions) is None
    assert fingerprint_of(tmp_path / "empty", versions) is None


def test_a_memo_that_cannot_be_written_leaves_full_verification(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    memo = FolderMemo(blocked / "verified")
    good = render(cert_for()[0])
    assert verify(good, Depth.REMEMBERED, memo=memo).valid
    key = memo_key(good)
    assert key is not None and not memo.knows(key)
    assert not verify(_edited_in_evidence(), Depth.REMEMBERED, memo=memo).valid


def test_compare_reads_the_memo_and_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(render(comparable_cert(green_evidence())))
    new.write_text(render(comparable_cert(green_evidence(), binary_sha="22" * 32)))
    folder = tmp_path / "memo"
    monkeypatch.setenv(MEMO_ENV, str(folder))
    outputs = []
    for _ in range(2):
        assert main(["compare", str(old), str(new), "--allow-unsigned"]) == 0
        outputs.append(capsys.readouterr().out)
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            str(memo_key(p.read_text())) for p in (old, new)
        )
    assert outputs[0] == outputs[1]
    # The memo is keyed by bytes: an edit after the first read is verified in full.
    edited = json.loads(new.read_text())
    edited["status"] = "failed"
    new.write_text(json.dumps(edited))
    assert main(["compare", str(old), str(new), "--allow-unsigned"]) == 5
    assert "digest mismatch" in capsys.readouterr().err


def test_off_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = tmp_path / "c.json"
    cert.write_text(render(comparable_cert(green_evidence())))
    monkeypatch.setenv("BATCH_INVARIANCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(MEMO_ENV, "off")
    assert main(["compare", str(cert), str(cert), "--allow-unsigned"]) == 0
    assert not (tmp_path / "cache").exists()
