"""``verify-cert --json`` through cli.main: the answer as one object, an invalid cert's too
(its problems, exit 5, the one line on stderr), with the exit code it has without ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.cert.store import write_cert
from batch_invariance.cli import main
from tests.support.factories import cert_for, changed, green_evidence, replace_trial
from tests.support.golden import check_golden


def _write(folder: Path, **kw: Any) -> Path:
    cert, _ = cert_for(**kw)
    return write_cert(folder, cert).path


def _json(argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == code
    plain = capsys.readouterr()
    assert main([*argv, "--json"]) == code
    out, err = capsys.readouterr()
    assert err.startswith(plain.out) and plain.out  # the human text, moved to stderr
    data: dict[str, Any] = json.loads(out)
    assert data["exit_code"] == code and data["command"] == "verify-cert"
    return data


def test_a_green_cert_is_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert main(["verify-cert", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert (data["valid"], data["verdict"], data["promotable"]) == (True, "GREEN", True)
    assert data["signature"]["state"] == "not_checked" and data["problems"] == []
    check_golden("verify_cert.json", out.replace(str(tmp_path), "<tmp>"))


def test_red_and_mock_keep_their_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = green_evidence()
    ev = replace_trial(ev, "C", "t001", changed(ev.c_passes[0].trials["t001"], score=0.0))
    red = _json(["verify-cert", str(_write(tmp_path / "red", evidence=ev))], 1, capsys)
    assert (red["status"], red["verdict"], red["promotable"]) == ("failed", "RED", False)
    mock = _json(["verify-cert", str(_write(tmp_path / "mock", source="mock"))], 3, capsys)
    assert (mock["valid"], mock["source"], mock["promotable"]) == (True, "mock", False)
    assert mock["promotable_reasons"]


def test_an_invalid_cert_is_answered_with_its_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path)
    path.write_text(path.read_text().replace('"ctx": 2048', '"ctx": 2049', 1))
    assert main(["verify-cert", str(path)]) == 5
    line = capsys.readouterr().err
    assert main(["verify-cert", str(path), "--json"]) == 5
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert err == line and "digest mismatch" in line  # the same one line on stderr
    assert data["valid"] is False and data["promotable"] is False
    assert any("digest mismatch" in p for p in data["problems"])
    assert data["signature"]["state"] == "not_checked"


def test_a_signature_that_fails_is_answered_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path)
    bundle = tmp_path / "none.sigstore.json"
    who = ["--cert-identity", "me@example.com", "--cert-oidc-issuer", "https://issuer"]
    argv = ["verify-cert", str(path), "--bundle", str(bundle), *who, "--json"]
    assert main(argv) == 5
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True and data["signature"]["state"] == "failed"
    assert "signature bundle not found" in data["signature"]["detail"]


def test_a_usage_error_is_the_error_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path)
    assert main(["verify-cert", str(path), "--cert-identity", "x", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["exit_code"] == 2
