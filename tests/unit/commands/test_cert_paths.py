"""Every command that takes a cert path: a path that is not there, or a folder where one cert
file is expected (a file where the certs folder is), is a usage error (exit 2) in one line
that says what to pass instead, never a cert error (5) or a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cert.store import write_cert
from batch_invariance.cli import main
from tests.support.factories import cert_for


@pytest.fixture()
def paths(tmp_path: Path) -> dict[str, Path]:
    """A cert in ``certs/``, an empty folder, a path that is not there, a deploy script."""
    cert, _ = cert_for()
    written = write_cert(tmp_path / "certs", cert).path
    (tmp_path / "empty").mkdir()
    deploy = tmp_path / "deploy.sh"
    deploy.write_text("llama-server -m /m.gguf -c 1024 -np 2\n")
    return {"cert": written, "certs": written.parent, "empty": tmp_path / "empty",
            "nope": tmp_path / "nope.json", "deploy": deploy}  # fmt: skip


def _usage(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    assert main(argv) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "[UsageError]" in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("command", [["verify-cert"], ["sign"], ["serve", "--allow-unsigned"]])
def test_a_missing_cert_file(
    command: list[str], paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _usage([*command, str(paths["nope"])], capsys,
           f"{paths['nope']}: no such file; check the path")  # fmt: skip


@pytest.mark.parametrize("command", [["verify-cert"], ["sign"], ["serve", "--allow-unsigned"]])
def test_a_folder_where_a_cert_file_is_expected(
    command: list[str], paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder of certs: the message names one to pass.
    example = f"{paths['certs']} is a folder; pass one cert file in it, for example {paths['cert']}"
    _usage([*command, str(paths["certs"])], capsys, example)
    _usage([*command, str(paths["empty"])], capsys, "is a folder; pass one cert file in it")


def test_check_deploy_certs_folder(
    paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["check-deploy", str(paths["deploy"]), "--allow-unsigned", "--certs"]
    nope, cert = paths["nope"], paths["cert"]
    _usage([*argv, str(nope)], capsys, f"--certs {nope}: no such folder; pass the folder the certs")
    _usage([*argv, str(cert)], capsys, f"--certs {cert} is a file; pass the folder that holds")


def test_compare_and_report_take_a_cert_or_a_folder(
    paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cert, nope, empty = str(paths["cert"]), str(paths["nope"]), str(paths["empty"])
    _usage(["compare", nope, cert, "--allow-unsigned"], capsys,
           f"not found: {nope}; give a cert file or a folder of certs")  # fmt: skip
    _usage(["compare", cert, empty, "--allow-unsigned"], capsys,
           "no cert files", "pass the folder the certs were written to")  # fmt: skip
    out = str(paths["empty"] / "r.html")
    _usage(["report", nope, "--out", out], capsys, "no such file or folder; pass cert files")
    _usage(["report", empty, "--out", out], capsys, "no cert files")


def test_run_live_baseline_that_is_not_there(
    paths: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nope = str(paths["nope"])
    _usage(["run-live", "--baseline", nope, "--allow-unsigned"], capsys, f"not found: {nope}")
