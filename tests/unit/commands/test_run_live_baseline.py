"""``run-live --baseline CERT``: the baseline is verified before anything launches, and the new
cert's arm A is compared with it after the run (a launched protocol fake, not a real server:
the real pairs are in docs/compare.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance.cli import main
from tests.support.fakes_live import LOOSE_GATES, hf_model_files
from tests.unit.engines.test_engine_cells import stand_in

#: The fake's pace: a tenth of the mock's time a token, prompts free. These runs test what
#: the comparison with the baseline says about arm A, not the verdict (the gates are loose).
PACE = {"token_delay_s": 0.00005, "prompt_token_delay_s": 0.0}


@pytest.fixture()
def workset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_ENGINE_KNOBS", json.dumps(PACE))
    path = tmp_path / "open.json"
    rows = [{"id": f"n{k}", "prompt": f"Write a note about batch number {k}."} for k in range(8)]
    path.write_text(json.dumps(rows))
    return path


def _other_build(tmp_path: Path) -> Path:
    """Another build of the fake engine: it answers otherwise on about half the prompts, in
    every arm (the launcher passes no FAKE_* variable on, so the build carries its knobs)."""
    exe = stand_in(tmp_path, "vllm")
    lines = exe.read_text().splitlines(keepends=True)
    # After the line that sets the test's FAKE_* settings, so this build's knobs win.
    (at,) = [k for k, line in enumerate(lines) if line.startswith("os.environ.update(")]
    knobs = json.dumps({**PACE, "divergence_probability": 0.5})
    text = "".join([*lines[: at + 1], f"os.environ['FAKE_ENGINE_KNOBS'] = {knobs!r}\n",
                    *lines[at + 1 :]])  # fmt: skip
    assert text != exe.read_text()
    other = tmp_path / "other" / "vllm"
    other.parent.mkdir()
    other.write_text(text)
    other.chmod(0o755)
    return other


def _run(
    tmp_path: Path, workset: Path, out: str, *extra: str, exe: Path | None = None
) -> list[str]:
    exe = exe or stand_in(tmp_path, "vllm")
    model = hf_model_files(tmp_path)
    return [
        "run-live", "--engine", "vllm", "--server-bin", str(exe), "--model", str(model),
        "--workset", str(workset), "--ctx", "512", "--parallel", "2", "--gate-passes", "1",
        "--reps", "3", "--n-predict", "512", "--out-dir", str(tmp_path / out), *LOOSE_GATES,
        *extra,
    ]  # fmt: skip


def test_baseline_identical_then_changed_answers(
    tmp_path: Path, workset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(_run(tmp_path, workset, "base"))
    (baseline,) = (tmp_path / "base").glob("*__N2.json")
    capsys.readouterr()

    main(_run(tmp_path, workset, "same", "--baseline", str(baseline), "--allow-unsigned"))
    out = capsys.readouterr().out
    assert "arm A, 24 prompts: 24 identical" in out  # 8 rows x 3 reps
    (same,) = (tmp_path / "same").glob("*.compare.json")
    data = json.loads(same.read_text())
    assert data["worst"] == "identical"
    assert data["policy"] == {"fail_on": "scored", "failed": False, "reasons": []}
    assert data["signatures"].startswith("baseline not checked (--allow-unsigned)")

    other = _other_build(tmp_path)
    main(_run(tmp_path, workset, "new", "--baseline", str(baseline), "--allow-unsigned", exe=other))
    out = capsys.readouterr().out
    (changed,) = (tmp_path / "new").glob("*.compare.json")
    data = json.loads(changed.read_text())
    assert data["worst"] == "scored", out
    assert data["policy"]["failed"] is True
    assert data["counts"]["scored"] >= 1
    assert "scored     n" in out


def test_a_bad_baseline_is_refused_before_anything_launches(
    tmp_path: Path, workset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad__ctx512__N2.json"
    bad.write_text('{"cert_version": 3}')
    assert main(_run(tmp_path, workset, "out", "--baseline", str(bad), "--allow-unsigned")) == 5
    assert not (tmp_path / "out").exists()
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_policy_flags_need_a_baseline_and_a_baseline_needs_a_policy(
    tmp_path: Path, workset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_run(tmp_path, workset, "out", "--allow-unsigned")) == 2
    assert "give --baseline" in capsys.readouterr().err
    some = tmp_path / "x__ctx512__N2.json"
    some.write_text("{}")
    assert main(_run(tmp_path, workset, "out", "--baseline", str(some))) == 2
    assert "run-live --baseline verifies every cert's signature" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
