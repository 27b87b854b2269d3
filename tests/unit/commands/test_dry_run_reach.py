"""``--dry-run`` refuses, before anything launches, a plan that cannot reach GREEN: one test
per cause, each one line naming the fix and exit 2; the length ladder's default plan passes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import main
from tests.support.fakes_live import dense_meta, fake_cell_files, write_gguf


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return fake_cell_files(tmp_path, monkeypatch, rows=5)


def _dry(setup: dict[str, Path], *extra: str) -> list[str]:
    return [
        "run-live", "--dry-run",
        "--server-bin", str(setup["bin"]),
        "--model", str(setup["model"]),
        "--ctx", "1024", "--parallel", "4",
        "--out-dir", str(setup["out"]),
        *extra,
    ]  # fmt: skip


def _refused(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(_dry(setup, *extra)) == exitcodes.USAGE
    assert not setup["marker"].exists() and not setup["out"].exists()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "cannot reach GREEN" in ln]
    assert len(lines) == 1, err
    return lines[0]


def test_the_ladder_on_completions_can_pass(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_dry(setup, "--endpoint", "completions")) == exitcodes.PROMOTABLE
    out = capsys.readouterr()
    assert "work-set: length ladder, 32 distinct prompts" in out.out
    assert "cannot reach GREEN" not in out.err


def test_too_few_distinct_prompts(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # Answers of 800 tokens fill the slot with the short prompts: only the count is wrong.
    line = _refused(setup, capsys, "--workset", str(setup["ws"]), "--endpoint", "completions",
                    "--n-predict", "800")  # fmt: skip
    assert "too few distinct prompts: 5 give a 95% bound of 3/5" in line
    assert "give at least 30 distinct prompts" in line


def test_an_answer_budget_under_the_length_gate(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused(setup, capsys, "--endpoint", "completions", "--n-predict", "16")
    assert "--n-predict 16 caps every answer below the 64-token median" in line


def test_a_base_model_on_chat(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(setup, capsys, "--endpoint", "chat")
    assert "a base model on the chat endpoint" in line and "--endpoint completions" in line


def test_a_model_with_a_template_on_chat_can_pass(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_gguf(setup["model"], dense_meta(**{"tokenizer.chat_template": "{{ x }}"}))
    assert main(_dry(setup, "--endpoint", "chat")) == exitcodes.PROMOTABLE
    assert "cannot reach GREEN" not in capsys.readouterr().err


def test_a_slot_the_work_set_cannot_fill(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    short = tmp_path / "short.json"
    short.write_text(json.dumps([{"id": f"q{i}", "prompt": f"Tell me {i}."} for i in range(40)]))
    line = _refused(setup, capsys, "--workset", str(short), "--endpoint", "completions")
    assert "a slot the work-set cannot fill" in line and "3/4 of --ctx 1024" in line


def _short_workset(tmp_path: Path) -> Path:
    short = tmp_path / "short.json"
    short.write_text(json.dumps([{"id": f"q{i}", "prompt": f"Tell me {i}."} for i in range(40)]))
    return short


def test_the_smaller_ctx_it_names_is_accepted(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Following the fix ends the refusals: the --ctx it names is one llama-server takes (a
    multiple of 256), and the work-set fills it (it once named 174, refused as no multiple of
    256, and 256 named 174 again)."""
    extra = ("--workset", str(_short_workset(tmp_path)), "--endpoint", "completions",
             "--n-predict", "400")  # fmt: skip
    line = _refused(setup, capsys, *extra)
    found = re.search(r"use --ctx (\d+) or less", line)
    assert found is not None, line
    ctx = int(found.group(1))
    assert ctx % 256 == 0 and 0 < ctx < 1024
    argv = _dry(setup, *extra)
    argv[argv.index("--ctx") + 1] = str(ctx)
    assert main(argv) == exitcodes.PROMOTABLE
    err = capsys.readouterr().err
    assert "cannot reach GREEN" not in err and "rounds the context" not in err


@pytest.mark.parametrize("ctx", ["256", "1024"])
def test_no_smaller_ctx_is_named_when_none_the_engine_takes_is_filled(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, ctx: str
) -> None:
    """~133 tokens fill no multiple of 256 (the smallest needs 192): the line says so instead
    of naming a --ctx the tool would refuse (it named 177)."""
    setup_argv = ("--workset", str(_short_workset(tmp_path)), "--endpoint", "completions")
    argv = _dry(setup, *setup_argv)
    argv[argv.index("--ctx") + 1] = ctx
    assert main(argv) == exitcodes.USAGE
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "cannot reach GREEN" in ln]
    assert "a slot the work-set cannot fill" in line
    assert not re.search(r"--ctx \d+ or less", line)
    assert "no --ctx the engine accepts is filled: the smallest, 256, needs 192 tokens" in line
