"""``search`` on the command line: the fastest GREEN's deploy line passes check-deploy on its
cert, and ``--dry-run`` states the plan and its ETA and launches nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from batch_invariance.commands.search import deploy_line, parse_budget
from batch_invariance.errors import UsageError
from batch_invariance.service.search_record import deploy_argv
from tests.support.deploy_world import _live_cert, deploy_files
from tests.support.fakes_live import LOOSE_GATES, fake_cell_files


def test_the_deploy_line_of_a_green_passes_check_deploy_on_its_cert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, binary = deploy_files(tmp_path)
    certs = tmp_path / "certs" / "ub1"
    cert = _live_cert(certs, model)  # a promotable GREEN of -ub 1, as run-live writes it
    argv = deploy_argv(cert)
    assert argv is not None and argv[0] == str(binary)
    record = {"fastest_green": "ub1",
              "rows": [{"config": "ub1", "deploy": list(argv), "certs": str(certs)}]}  # fmt: skip
    line = deploy_line(record)
    # This tool's launcher by its path: the line passes as printed, whatever PATH says.
    launcher = Path(sys.executable).with_name("batch-invariance")
    assert line is not None and line.startswith(f"{launcher} serve --certs {certs} ")
    script = tmp_path / "llama-server.sh"
    script.write_text(f"exec {line}\n")
    code = main(["check-deploy", str(script), "--certs", str(certs), "--allow-unsigned"])
    out = capsys.readouterr().out
    assert code == exitcodes.PROMOTABLE, out
    assert "check-deploy: PASS" in out


def test_dry_run_states_the_plan_and_eta_and_launches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = fake_cell_files(tmp_path, monkeypatch, rows=3)
    code = main(["search", "--server-bin", str(files["bin"]), "--model", str(files["model"]),
                 "--workset", str(files["ws"]), "--ctx", "512", "--parallel", "4",
                 "--out-dir", str(files["out"]), "--configs", "ub1,fa-on", "--budget", "2h",
                 "--dry-run", *LOOSE_GATES])  # fmt: skip
    out = capsys.readouterr().out
    assert code == exitcodes.PROMOTABLE, out
    assert "3 configuration(s) (nothing launched)" in out
    assert "defaults: (defaults): probe, then cert (positive control)" in out
    assert "ub1: -ub 1: probe, cert unless rejected" in out
    assert "ETA: ~" in out and "budget: 7200 s" in out
    assert "interleave: each promotable GREEN against the defaults, 3 round(s)" in out
    assert "ub1: -ub 1: probe, cert unless rejected, then interleaved if promotable GREEN" in out
    assert not files["marker"].exists() and not files["out"].exists()
    code = main(["search", "--server-bin", str(files["bin"]), "--model", str(files["model"]),
                 "--workset", str(files["ws"]), "--ctx", "512", "--parallel", "4",
                 "--out-dir", str(files["out"]), "--configs", "ub1", "--interleave-rounds", "0",
                 "--dry-run", *LOOSE_GATES])  # fmt: skip
    out = capsys.readouterr().out
    assert "interleave: off (--interleave-rounds 0)" in out
    assert "ub1: -ub 1: probe, cert unless rejected\n" in out


def test_an_unknown_configuration_and_a_bad_budget_are_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = fake_cell_files(tmp_path, monkeypatch, rows=3)
    code = main(["search", "--server-bin", str(files["bin"]), "--model", str(files["model"]),
                 "--ctx", "512", "--parallel", "4", "--out-dir", str(files["out"]),
                 "--configs", "turbo", "--dry-run"])  # fmt: skip
    assert code == exitcodes.USAGE
    assert "--configs turbo: not in llama-server's space" in capsys.readouterr().err
    assert parse_budget("90m") == 5400 and parse_budget("30") == 30
    with pytest.raises(UsageError):
        parse_budget("soon")
    assert os.environ.get("FAKE_SERVER_MARKER")


def test_the_json_reply_carries_the_record_and_its_exit_code() -> None:
    from batch_invariance.commands.search import SearchReply

    reply = SearchReply({"fastest_green": None, "rows": [], "deploy_line": None}, 3)
    assert reply.to_json() == {
        "command": "search", "fastest_green": None, "rows": [], "deploy_line": None,
        "exit_code": 3,
    }  # fmt: skip


def test_json_and_dry_run_together_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = fake_cell_files(tmp_path, monkeypatch, rows=3)
    code = main(["search", "--server-bin", str(files["bin"]), "--model", str(files["model"]),
                 "--ctx", "512", "--parallel", "4", "--out-dir", str(files["out"]),
                 "--json", "--dry-run"])  # fmt: skip
    assert code == exitcodes.USAGE
    assert '"kind": "UsageError"' in capsys.readouterr().out


def test_the_example_search_certs_verify_as_the_table_says() -> None:
    import json

    from batch_invariance.cert.verify import verify

    folder = Path(__file__).resolve().parents[3] / "examples" / "search"
    record = json.loads((folder / "search.json").read_text())
    assert record["control_red"] is True and len(record["rows"]) >= 12
    certified = {r["config"]: r["cert"] for r in record["rows"] if r["cert"] is not None}
    files = sorted((folder / "certs").glob("*.json"))
    assert [f.stem.rsplit("__", 1)[1] for f in files] == sorted(certified)
    for path in files:
        row = certified[path.stem.rsplit("__", 1)[1]]
        found = verify(path)
        assert found.valid and found.verdict == row["verdict"], (path, found.problems)
        assert found.promotable == bool(row["promotable"]), path
    assert certified[record["fastest_green"]]["verdict"] == "GREEN"
    assert certified["defaults"]["verdict"] == "RED"


def test_a_plan_that_cannot_reach_green_is_refused_before_any_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = fake_cell_files(tmp_path, monkeypatch, rows=3)  # 3 prompts: the bound needs 30
    code = main(["search", "--server-bin", str(files["bin"]), "--model", str(files["model"]),
                 "--workset", str(files["ws"]), "--ctx", "512", "--parallel", "4",
                 "--out-dir", str(files["out"]), "--configs", "ub1"])  # fmt: skip
    assert code == exitcodes.USAGE
    assert "cannot reach GREEN" in capsys.readouterr().err
    assert not files["marker"].exists()
