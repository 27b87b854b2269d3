"""Cert files: naming, canonical form, atomic write, supersede-never-overwrite, read errors."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.cert.store import cert_path, render, write_cert
from batch_invariance.cert.verify import verify
from batch_invariance.errors import InfraError
from tests.support.factories import cert_for, green_evidence, load_cert, spec


def test_cert_path_layout_and_unsafe_names(tmp_path: Path) -> None:
    assert (
        cert_path(tmp_path, "gemma-3-270m", 2048, 4) == tmp_path / "gemma-3-270m__ctx2048__N4.json"
    )
    assert cert_path(tmp_path, "org/model:q4", 512, 2).name == "org_model_q4__ctx512__N2.json"
    assert cert_path(tmp_path, "../..", 1, 1).parent == tmp_path


def test_write_is_canonical_and_reads_back(tmp_path: Path) -> None:
    cert, _ = cert_for()
    written = write_cert(tmp_path / "new", cert)
    assert written.path == cert_path(tmp_path / "new", "tiny-model", 2048, 4)
    assert written.superseded is None
    text = written.path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert list(data) == sorted(data)
    assert load_cert(written.path) == cert
    # No temp files left behind.
    assert [p.name for p in (tmp_path / "new").iterdir()] == [written.path.name]
    assert written.path.stat().st_mode & 0o777 == 0o644


def test_existing_cert_is_moved_aside_never_overwritten(tmp_path: Path) -> None:
    first, _ = cert_for()
    write_cert(tmp_path, first)
    second, _ = cert_for(green_evidence(n_ids=6))
    second = replace(second, ts_utc="2025-02-03T04:05:06Z")
    w = write_cert(tmp_path, second)
    assert w.superseded is not None and w.superseded.exists()
    assert "20250203T040506Z" in w.superseded.name
    assert json.loads(w.superseded.read_text())["status"] == "green"
    assert json.loads(w.path.read_text())["status"] == "green_unverified"
    # A third write with the same timestamp keeps both older files.
    w3 = write_cert(tmp_path, second)
    assert w3.superseded is not None and w3.superseded != w.superseded
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_failed_write_leaves_the_old_cert_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, _ = cert_for()
    w = write_cert(tmp_path, cert)
    before = w.path.read_bytes()
    real_replace = os.replace

    def failing_replace(src: object, dst: object) -> None:
        # Let the old cert be moved aside, then fail to put the new one in place.
        if str(src).endswith(".tmp"):
            raise OSError("disk full (simulated)")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", failing_replace)
    second, _ = cert_for(green_evidence(n_ids=6))
    with pytest.raises(InfraError, match="disk full") as info:
        write_cert(tmp_path, second)
    assert "\n" not in str(info.value) and "previous cert is unchanged" in str(info.value)
    monkeypatch.undo()
    assert w.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [w.path.name]


def test_an_out_dir_that_cannot_hold_a_cert_is_one_infra_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cert, _ = cert_for()
    with pytest.raises(InfraError, match="cannot write cert") as info:
        write_cert(blocker, cert)
    assert "\n" not in str(info.value)
    assert blocker.read_text() == "not a folder"


def test_unreadable_certs_are_invalid_with_one_line(tmp_path: Path) -> None:
    def first_problem(path: Path) -> str:
        return verify(path).problems[0]

    assert "no such cert file" in first_problem(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    for text, why in (("{not json", "not valid JSON"), ("[1, 2]", "JSON object"),
                      ('{"status": "green"}', "schema")):  # fmt: skip
        bad.write_text(text)
        assert why in first_problem(bad) and "\n" not in first_problem(bad)


def test_read_cert_detects_a_changed_value(tmp_path: Path) -> None:
    cert, _ = cert_for()
    path = write_cert(tmp_path, cert).path
    path.write_text(path.read_text().replace('"reps": 1', '"reps": 2'))
    assert "digest mismatch" in verify(path).problems[0]


def test_render_matches_file(tmp_path: Path) -> None:
    cert, _ = cert_for(cell=replace(spec(), model="m"))
    assert write_cert(tmp_path, cert).path.read_text() == render(cert)
