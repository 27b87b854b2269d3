"""`batch-invariance report` end to end on real (mock) certs: formats, folders, invalid certs,
bundles and exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batch_invariance.cli import main
from tests.support.report_fixtures import mock_cert


@pytest.fixture(scope="module")
def green_cert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mock_cert(tmp_path_factory.mktemp("mock"), 2)


def _folder_with(tmp_path: Path, cert: Path) -> Path:
    folder = tmp_path / "certs"
    (folder / "cell-a").mkdir(parents=True)
    shutil.copy(cert, folder / "cell-a" / cert.name)
    return folder


def test_html_of_a_folder_exit_0_and_other_json_is_skipped(
    tmp_path: Path, green_cert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder_with(tmp_path, green_cert)
    (folder / "sweep.json").write_text("{}", encoding="utf-8")
    shutil.copy(green_cert, folder / "mock__ctx512__N2.superseded-20250101T000000Z.json")
    out = tmp_path / "report.html"
    assert main(["report", str(folder), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "GREEN" in text
    assert text.count('class="cell-row"') == 1
    assert "1 valid cert(s), 0 invalid" in capsys.readouterr().out


def test_invalid_cert_is_named_in_the_report_and_exits_5(
    tmp_path: Path, green_cert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder_with(tmp_path, green_cert)
    tampered = folder / "mock__ctx512__N3.json"
    data = json.loads(green_cert.read_text(encoding="utf-8"))
    data["status"] = "failed"
    tampered.write_text(json.dumps(data), encoding="utf-8")
    not_json = tmp_path / "garbage__ctx1__N2.json"
    not_json.write_text("{not json", encoding="utf-8")
    out = tmp_path / "r.md"
    code = main(["report", str(folder), str(not_json), "--out", str(out), "--format", "md"])
    assert code == 5
    md = out.read_text(encoding="utf-8")
    assert "**Invalid certs**" in md and "mock__ctx512__N3.json" in md and "digest" in md
    assert "garbage__ctx1__N2.json" in md and "not valid JSON" in md
    printed = capsys.readouterr().out
    assert printed.count("invalid: ") == 2


def test_json_to_stdout(green_cert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(green_cert), "--out", "-", "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["n_certs"] == 1 and data["cells"][0]["verdict"] == "GREEN"
    assert data["cells"][0]["promotable"] is False  # source mock
    assert "report: 1 valid" in captured.err


def test_bundle_present_but_no_identity_is_not_verified(tmp_path: Path, green_cert: Path) -> None:
    folder = _folder_with(tmp_path, green_cert)
    cert = folder / "cell-a" / green_cert.name
    Path(f"{cert}.sigstore.json").write_text("{}", encoding="utf-8")
    out = tmp_path / "r.md"
    assert main(["report", str(folder), "--out", str(out), "--format", "md"]) == 0
    assert "bundle present, not verified" in out.read_text(encoding="utf-8")


def test_a_corrupt_bundle_checked_against_an_identity_fails_with_5(
    tmp_path: Path, green_cert: Path
) -> None:
    folder = _folder_with(tmp_path, green_cert)
    cert = folder / "cell-a" / green_cert.name
    Path(f"{cert}.sigstore.json").write_text("{}", encoding="utf-8")
    out = tmp_path / "r.json"
    code = main([
        "report", str(folder), "--out", str(out), "--format", "json",
        "--cert-identity", "https://github.com/o/r/.github/workflows/x.yml@refs/heads/main",
        "--cert-oidc-issuer", "https://token.actions.githubusercontent.com", "--offline",
    ])  # fmt: skip
    assert code == 5
    cell = json.loads(out.read_text(encoding="utf-8"))["cells"][0]
    assert cell["signature"]["state"] == "failed"
    assert "signature bundle corrupt" in cell["signature"]["detail"]


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "/nonexistent/certs", "--out", "x.html"],
        ["report", ".", "--out", "x.html", "--cert-identity", "someone"],
        ["report", ".", "--out", "x.html", "--repository", "o/r"],
        ["report", ".", "--out", "x.html", "--format", "pdf"],
    ],
)
def test_usage_errors_exit_2_and_write_nothing(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert not (tmp_path / "x.html").exists()


def test_a_folder_without_certs_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sweep.json").write_text("{}", encoding="utf-8")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 2
    assert "no cert files" in capsys.readouterr().err


def test_the_format_follows_the_out_suffix_unless_given(tmp_path: Path, green_cert: Path) -> None:
    for name, start in (("r.md", "## batch-invariance report"), ("r.json", "{"), ("r.htm", "<!")):
        assert main(["report", str(green_cert), "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_text(encoding="utf-8").startswith(start)
    out = tmp_path / "forced.md"
    assert main(["report", str(green_cert), "--out", str(out), "--format", "json"]) == 0
    assert out.read_text(encoding="utf-8").startswith("{")
