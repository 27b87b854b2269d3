"""`batch-invariance run-mock` end to end through cli.main, both modes, with exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cert.certificate import cert_is_green, is_promotable
from batch_invariance.cert.store import read_cert
from batch_invariance.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def test_default_mode_earns_green_with_source_mock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run-mock", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "mock__ctx2048__N4.json"
    assert "GREEN" in out and str(path) in out
    cert = read_cert(path)
    assert cert.status == "green" and cert.source == "mock"
    assert cert.sensitivity.n_hot_trials >= 30
    # A mock cert is never promotable, whatever its status.
    assert not is_promotable(cert)
    assert not cert_is_green(cert)  # require_source defaults to "live"
    assert cert_is_green(cert, require_source="mock")
    # verify-cert agrees: valid, but not promotable.
    assert main(["verify-cert", str(path)]) == 3


def test_batch_divergence_mode_earns_red(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run-mock", "--out-dir", str(tmp_path), "--batch-divergence", "--ctx", "1024"])
    assert code == 0  # the mock behaved as the mode predicts
    out = capsys.readouterr().out
    assert "RED" in out
    data = json.loads((tmp_path / "mock__ctx1024__N4.json").read_text())
    assert data["status"] == "failed" and data["divergence_class"] == "co_batching"
    assert data["source"] == "mock"
    assert main(["verify-cert", str(tmp_path / "mock__ctx1024__N4.json")]) == 1


def test_example_workset_with_function_scorer(tmp_path: Path) -> None:
    code = main([
        "run-mock", "--out-dir", str(tmp_path), "--gate-passes", "3",
        "--workset", str(EXAMPLES / "workset.json"),
        "--scorer", f"{EXAMPLES / 'scorer.py'}:score_short_answer",
    ])  # fmt: skip
    assert code == 0
    data = json.loads((tmp_path / "mock__ctx2048__N4.json").read_text())
    assert data["provenance"]["scorer_id"].endswith("scorer.py:score_short_answer")
    assert all(t["passed"] is True for t in data["evidence"]["a"].values())


def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run-mock", "--out-dir", str(tmp_path), "--parallel", "1"]) == 2
    assert main(["run-mock", "--out-dir", str(tmp_path), "--workset", "/nonexistent.json"]) == 2
    assert main(["run-mock", "--out-dir", str(tmp_path), "--scorer", "no_colon"]) == 2
    assert main(["run-mock", "--out-dir", str(tmp_path), "--gate-passes", "0"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 4 and all(line.startswith("batch-invariance") for line in lines)
    assert "Traceback" not in err
    assert not list(tmp_path.glob("*.json"))  # nothing written


def test_a_bad_out_dir_is_refused_before_the_cell_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code = main(["run-mock", "--out-dir", str(blocker / "sub"), "--gate-passes", "40"])
    assert code == 2
    captured = capsys.readouterr()
    # Refused before the cell ran: no banner, no progress, nothing written anywhere.
    assert "GREEN" not in captured.out and "RED" not in captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    err = captured.err
    assert "--out-dir" in err and len(err.strip().splitlines()) == 1
