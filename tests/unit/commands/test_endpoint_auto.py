"""``--endpoint auto`` on the command line: run-live's and sweep's default (the Action's too),
decided from the model's GGUF header; the dry run and the banner say what it chose and why.
The demo says ``completions`` outright (its model is a base model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.cli import build_parser, main
from batch_invariance.mock import MockServer
from tests.support.fakes_live import dense_meta, fake_cell_files, write_gguf

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    return fake_cell_files(tmp_path, monkeypatch, rows=5)


def _dry(setup: dict[str, Path], command: str = "run-live", *extra: str) -> list[str]:
    return [
        command, "--dry-run",
        "--server-bin", str(setup["bin"]),
        "--model", str(setup["model"]),
        "--ctx", "1024", "--parallel", "4",
        "--out-dir", str(setup["out"]),
        *extra,
    ]  # fmt: skip


def test_the_default_is_auto_except_the_demo_s() -> None:
    parser = build_parser()
    common = ["--out-dir", "o"]
    assert parser.parse_args(["run-live", *common]).endpoint == "auto"
    assert parser.parse_args(["sweep", "--parallel", "2", *common]).endpoint == "auto"
    assert parser.parse_args(["demo", *common]).endpoint == "completions"
    assert parser.parse_args(["run-live", "--endpoint", "chat", *common]).endpoint == "chat"


def test_auto_on_a_base_model_sends_completions_and_the_plan_says_why(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # The fake cell's GGUF has no chat template: on chat the plan could never be GREEN.
    assert main(_dry(setup)) == exitcodes.PROMOTABLE
    printed = capsys.readouterr()
    assert "cannot reach GREEN" not in printed.err
    assert (
        "endpoint: completions (auto: the model has no chat template of its own (a base "
        "model)" in printed.out
    )
    assert "; endpoint completions; n_predict" in printed.out


def test_auto_on_a_model_with_a_template_sends_chat(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_gguf(setup["model"], dense_meta(**{"tokenizer.chat_template": TEMPLATE}))
    assert main(_dry(setup)) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert "endpoint: chat (auto: the model has its own chat template)" in out
    assert "; endpoint chat; n_predict" in out


def test_sweep_decides_auto_the_same_way(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _dry(setup, "sweep")
    argv[argv.index("--parallel") + 1] = "2,4"
    assert main(argv) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert out.count("endpoint: completions (auto: the model has no chat template") == 2


def test_an_endpoint_said_outright_has_no_auto_line(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_dry(setup, "run-live", "--endpoint", "completions")) == exitcodes.PROMOTABLE
    out = capsys.readouterr().out
    assert "(auto:" not in out and "; endpoint completions; n_predict" in out


def test_the_banner_of_an_attached_server_says_auto_chose_chat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No model file beside --base-url: auto means chat, and the banner says so (an attached
    server has no dry run)."""
    workset = tmp_path / "open.json"
    rows = [{"id": f"n{k}", "prompt": f"Write a short note about batch number {k}."}
            for k in range(32)]  # fmt: skip
    workset.write_text(json.dumps(rows))
    out = tmp_path / "out"
    with MockServer(parallel=2, ctx=128) as server:
        code = main(["run-live", "--base-url", server.base_url, "--workset", str(workset),
                     "--ctx", "128", "--parallel", "2", "--gate-passes", "1", "--reps", "1",
                     "--n-predict", "96", "--out-dir", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == exitcodes.NOT_PROMOTABLE, printed  # attached: never promotable
    (line,) = [ln for ln in printed.splitlines() if "endpoint: " in ln]
    assert line.strip().startswith("endpoint: chat (auto: an attached server with no model file")
    (cert,) = out.glob("*.json")
    assert json.loads(cert.read_text())["provenance"]["request_template"]["endpoint"] == "chat"
