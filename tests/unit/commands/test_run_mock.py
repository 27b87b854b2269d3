"""`batch-invariance run-mock` end to end through cli.main, both modes, with exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batch_invariance.cert.certificate import cert_is_green, is_promotable
from batch_invariance.cli import main
from tests.support.factories import load_cert
from tests.support.paths import EXAMPLES


def test_default_mode_earns_green_with_source_mock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A mock GREEN exits 3 like any GREEN that is not promotable (README exit-code table).
    assert main(["run-mock", "--out-dir", str(tmp_path)]) == 3
    captured = capsys.readouterr()
    out = captured.out
    path = tmp_path / "mock__ctx512__N4.json"
    assert "GREEN" in out and str(path) in out
    # The default is the length ladder of the slot: 32 distinct documents (issue 17 §1).
    assert "from 32 distinct prompts" in out and "warning:" not in captured.err
    cert = load_cert(path)
    assert cert.status == "green" and cert.source == "mock"
    assert cert.provenance.workset is not None
    assert cert.provenance.workset["duplicate_prompts"] == []
    assert cert.sensitivity.n_hot_trials >= 30
    assert cert.sensitivity.n_distinct_prompts >= 30
    assert cert.promotion_scope.answer_tokens_median is not None
    assert cert.promotion_scope.answer_tokens_median >= 64
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
    assert code == 1  # a mock RED exits 1 like any RED
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
    assert code == 3
    data = json.loads((tmp_path / "mock__ctx512__N4.json").read_text())
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


def _notes(path: Path, n_rows: int) -> Path:
    rows = [
        {"id": f"n{k}", "prompt": f"Write a short note about batch number {k}."}
        for k in range(n_rows)
    ]
    path.write_text(json.dumps(rows))
    return path


def _run(tmp_path: Path, *args: str, ctx: int = 512) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "out"
    code = main(["run-mock", "--out-dir", str(out), "--ctx", str(ctx), *args])
    data: dict[str, Any] = json.loads((out / f"mock__ctx{ctx}__N4.json").read_text())
    return code, data


def test_issue_reproducer_40_notes_green_divergence_red_short_budget_unverified(
    tmp_path: Path,
) -> None:
    notes = str(_notes(tmp_path / "w40.json", 40))
    # Notes of about 100 tokens (prompt + answer) do not fill a 512-token slot: not GREEN
    # for it, the reason naming both lengths; they do fill a 128-token one.
    code, data = _run(tmp_path, "--workset", notes)
    assert (code, data["status"]) == (3, "green_unverified")
    longest = data["sequence_scope"]["longest"]
    assert longest < 384 and any(
        f"longest co-batched sequence measured is {longest} of the slot's 512 tokens" in r
        for r in data["decision_reasons"]
    )
    code, data = _run(tmp_path, "--workset", notes, ctx=128)
    assert (code, data["status"]) == (3, "green"), data["decision_reasons"]
    scope = data["promotion_scope"]
    assert scope["answer_tokens_min"] >= 64 and scope["share_cut_by_budget"] == 0.0
    assert f"holds for answers up to {scope['answer_tokens_max']} tokens" in scope["valid_for"]
    trial = data["evidence"]["a"]["n0"]
    assert trial["finish_reason"] == "stop" and trial["completion_tokens"] >= 64
    code, data = _run(tmp_path, "--workset", notes, "--batch-divergence", ctx=128)
    assert (code, data["status"]) == (1, "failed")
    # The budget cuts every answer before the (late) divergence: never GREEN, and the reason
    # names the length.
    code, data = _run(tmp_path, "--workset", notes, "--batch-divergence", "--n-predict", "3",
                      ctx=128)  # fmt: skip
    assert (code, data["status"]) == (3, "green_unverified")
    assert any("median 3 generated tokens" in r for r in data["decision_reasons"])
    assert data["promotion_scope"]["share_cut_by_budget"] == 1.0
    assert data["evidence"]["c_passes"][0]["trials"]["n0"]["finish_reason"] == "length"


@pytest.mark.parametrize(("rows", "reps"), [(1, 4), (2, 3)])
def test_repetitions_of_few_prompts_are_never_green(tmp_path: Path, rows: int, reps: int) -> None:
    notes = str(_notes(tmp_path / "few.json", rows))
    code, data = _run(tmp_path, "--workset", notes, "--reps", str(reps), "--gate-passes", "8")
    assert (code, data["status"]) == (3, "green_unverified")
    sens = data["sensitivity"]
    assert sens["n_distinct_prompts"] == rows and sens["rate_upper_bound_95"] == 1.0
    assert sens["per_comparison_rate_upper_bound_95"] <= 0.1  # what used to be the headline
    assert any("per-prompt bound not met" in r for r in data["decision_reasons"])


def test_min_hot_trials_1_keeps_every_bound_a_probability(tmp_path: Path) -> None:
    notes = str(_notes(tmp_path / "w2.json", 2))
    code, data = _run(tmp_path, "--workset", notes, "--min-hot-trials", "1", "--gate-passes", "1")
    assert code == 3 and data["status"] != "green"
    sens = data["sensitivity"]
    for key in ("rate_upper_bound_95", "per_comparison_rate_upper_bound_95"):
        assert 0.0 <= sens[key] <= 1.0
    assert data["evidence"]["policy"]["min_hot_trials"] == 1
    assert "min_hot_trials 1 is looser than the default 30" in data["gates"]["F5"]["reason"]


def test_policy_options_are_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--max-bound", "0"], ["--max-bound", "1.5"], ["--min-answer-tokens", "0"]):
        assert main(["run-mock", "--out-dir", str(tmp_path), *bad]) == 2
    err = capsys.readouterr().err
    assert "--max-bound must be a rate in (0, 1]" in err and "--min-answer-tokens" in err
    assert not list(tmp_path.glob("*.json"))


def test_a_scorer_returning_nan_or_inf_gives_scorer_error_and_the_cell_still_gets_a_cert(
    tmp_path: Path,
) -> None:
    scorer = tmp_path / "odd_scorer.py"
    scorer.write_text(
        "import math\n"
        "def odd(text, expected, *, item):\n"
        "    if item.test_id == 'n1':\n"
        "        return math.nan, True, 'ok'\n"
        "    if item.test_id == 'n2':\n"
        "        return -math.inf, False, 'ok'\n"
        "    return 1.0, True, 'ok'\n"
    )
    notes = str(_notes(tmp_path / "w4.json", 4))
    code, data = _run(
        tmp_path, "--workset", notes, "--gate-passes", "1", "--scorer", f"{scorer}:odd"
    )
    assert code == 3 and data["status"] == "green_unverified"
    for arm in (data["evidence"]["a"], data["evidence"]["c_passes"][0]["trials"]):
        assert arm["n1"]["failure_mode"] == "scorer_error" and arm["n1"]["score"] is None
        assert arm["n2"]["failure_mode"] == "scorer_error"
        assert arm["n0"]["failure_mode"] == "ok"
