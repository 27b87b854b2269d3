"""Runner-grade failure output: a step that does not pass leaves its plan and its server logs
for the artifact (``debug-paths``), and a ``model`` / ``server-bin`` that names no file is
refused in the user's words, with the runner's path and the nearest names in the folder."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.action import entrypoint as action
from batch_invariance.action.lookup import near_names
from tests.support.fakes_live import dense_meta, exiting_server, fake_server, write_gguf
from tests.unit.action.test_entrypoint import actions_env, outputs_of

FOLDERS = {"models-dir": "models", "server-dir": "llama", "server-bin": "bin/llama-server"}
CONFIG = "::error title=batch-invariance configuration error (no verdict)::"


def _no_provision() -> tuple[Path, Path]:
    raise AssertionError("server-bin and model are given: nothing to provision")


def _run(env: dict[str, str]) -> tuple[int, str]:
    buf = io.StringIO()
    code = action.run_action(env, out=buf, provisioner=_no_provision)
    return code, buf.getvalue()


def test_exit_4_leaves_the_plan_and_the_server_log_for_the_artifact(tmp_path: Path) -> None:
    env = actions_env(tmp_path, sign="false", **{"server-bin": "bin/llama-server"},
                      model="base.gguf")  # fmt: skip
    workspace = Path(env["GITHUB_WORKSPACE"])
    exiting_server(workspace / "bin")
    write_gguf(workspace / "base.gguf", dense_meta(), padding=1 << 20)
    # An earlier step's log in the same out-dir is not this step's.
    old = workspace / "batch-invariance-certs" / "server-A-1.log"
    old.parent.mkdir()
    old.write_text("an earlier step\n")
    os.utime(old, (1_000_000_000, 1_000_000_000))
    code, printed = _run(env)
    assert code == exitcodes.INFRA, printed
    outputs = outputs_of(env)
    assert set(outputs) == {"cell-id", "debug-paths"}  # no verdict outputs
    assert outputs["cell-id"] == "base__ctx2048__N4"
    paths = outputs["debug-paths"].splitlines()
    assert paths[0] == "batch-invariance-certs/base__ctx2048__N4.plan.txt"
    plan = (workspace / paths[0]).read_text()
    # The plan as run-live --dry-run prints it: the endpoint auto chose and why, the out-dir.
    assert "endpoint: completions (auto: the model has no chat template" in plan
    assert "out-dir: " in plan and "base__ctx2048__N4.json" in plan
    logs = [workspace / p for p in paths[1:]]
    assert logs and all(p.name.startswith("server-") for p in logs)
    assert old not in logs
    assert any("this server cannot start" in p.read_text() for p in logs)


def test_a_red_step_hands_on_its_plan_and_logs_and_a_passing_one_nothing(
    tmp_path: Path,
) -> None:
    env = actions_env(tmp_path, mode="mock", sign="false")
    code, _ = _run(env)
    assert code != exitcodes.PROMOTABLE  # a mock cert never passes
    outputs = outputs_of(env)
    (plan,) = outputs["debug-paths"].splitlines()
    assert plan == f"batch-invariance-certs/{outputs['cell-id']}.plan.txt"
    text = (Path(env["GITHUB_WORKSPACE"]) / plan).read_text()
    assert text.startswith("mock cell")


def _models(tmp_path: Path, **inputs: str) -> dict[str, str]:
    env = actions_env(tmp_path, sign="false", **inputs)
    workspace = Path(env["GITHUB_WORKSPACE"])
    models, server = workspace / "models", workspace / "llama"
    (models / "gemma").mkdir(parents=True)
    (models / "gemma" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF")
    (models / "qwen2.5-0.5b-q8_0.gguf").write_bytes(b"GGUF")
    fake_server(server / "bin")
    env["BI_HOST_MODELS_DIR"] = "/srv/runner/models"
    env["BI_HOST_SERVER_DIR"] = "/srv/runner/llama"
    env["BI_HOST_WORKSPACE"] = "/home/runner/work/repo/repo"
    return env


def test_a_model_not_in_models_dir_is_named_as_written_with_near_matches(
    tmp_path: Path,
) -> None:
    env = _models(tmp_path, model="gemma/gemma-3-270m-q4_k.gguf", **FOLDERS)
    code, printed = _run(env)
    assert code == exitcodes.USAGE
    line = next(x for x in printed.splitlines() if x.startswith(CONFIG))
    assert (
        "input model: gemma/gemma-3-270m-q4_k.gguf: no such file in models-dir models (on the "
        "runner: /srv/runner/models/gemma/gemma-3-270m-q4_k.gguf); did you mean "
        "gemma/gemma-3-270m-q4_k_m.gguf?"
    ) in line
    assert "/github/" not in line  # never the container's mount


def test_a_server_bin_not_in_server_dir_is_named_with_its_near_match(tmp_path: Path) -> None:
    given = {**FOLDERS, "server-bin": "bin/llama-srv"}
    env = _models(tmp_path, model="qwen2.5-0.5b-q8_0.gguf", **given)
    code, printed = _run(env)
    assert code == exitcodes.USAGE
    assert (
        "input server-bin: bin/llama-srv: no such file in server-dir llama (on the runner: "
        "/srv/runner/llama/bin/llama-srv); did you mean bin/llama-server?"
    ) in printed


def test_nothing_near_says_how_to_name_the_file(tmp_path: Path) -> None:
    env = _models(tmp_path, model="mistral-7b.gguf", **FOLDERS)
    _, printed = _run(env)
    assert "input model: mistral-7b.gguf: no such file in models-dir models" in printed
    assert "give a path relative to models-dir, or an absolute one" in printed


def test_without_models_dir_the_workspace_is_named(tmp_path: Path) -> None:
    env = _models(tmp_path, model="modls/qwen2.5-0.5b-q8_0.gguf",
                  **{"server-bin": "llama/bin/llama-server"})  # fmt: skip
    _, printed = _run(env)
    assert (
        "input model: modls/qwen2.5-0.5b-q8_0.gguf: no such file under the workspace (on the "
        "runner: /home/runner/work/repo/repo/modls/qwen2.5-0.5b-q8_0.gguf); did you mean "
        "models/qwen2.5-0.5b-q8_0.gguf?"
    ) in printed


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gemma-3-270m.gguf", ["gemma/gemma-3-270m-q4_k_m.gguf"]),  # by its name alone
        ("zzz", []),
    ],
)
def test_near_names_match_paths_and_names(tmp_path: Path, value: str, expected: list[str]) -> None:
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"")
    (tmp_path / "README.md").write_text("")
    assert near_names(value, tmp_path) == expected


def test_in_the_container_the_folder_is_named_as_written_not_as_mounted(
    tmp_path: Path,
) -> None:
    # run-container.sh sets models-dir to the mount and hands on what the user wrote.
    env = _models(tmp_path, model="qwen2.5-0.5b-q8.gguf", **FOLDERS)
    mount = str(Path(env["GITHUB_WORKSPACE"]) / "models")
    env["INPUT_MODELS-DIR"] = mount
    env["BI_INPUT_MODELS_DIR"] = "/srv/runner/models"
    _, printed = _run(env)
    assert (
        "input model: qwen2.5-0.5b-q8.gguf: no such file in models-dir /srv/runner/models (on the "
        "runner: /srv/runner/models/qwen2.5-0.5b-q8.gguf); did you mean qwen2.5-0.5b-q8_0.gguf?"
    ) in printed
    assert mount not in printed


def test_the_engine_env_input_reaches_the_server_the_step_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine-env is set for the servers as run-live's shell prefix sets it: here a server
    that writes down its variables and exits (exit 4)."""
    monkeypatch.setenv("GGML_SCHED_MAX_COPIES", "unset by the step")  # restored after
    given = {"server-bin": "bin/llama-server", "engine-env": "GGML_SCHED_MAX_COPIES=1"}
    env = actions_env(tmp_path, sign="false", model="base.gguf", **given)
    workspace = Path(env["GITHUB_WORKSPACE"])
    seen = workspace / "server.env"
    server = workspace / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text(f"#!/bin/sh\nenv > {seen}\nexit 1\n")
    server.chmod(0o755)
    write_gguf(workspace / "base.gguf", dense_meta(), padding=1 << 20)
    code, printed = _run(env)
    assert code == exitcodes.INFRA, printed
    assert "GGML_SCHED_MAX_COPIES=1" in seen.read_text().splitlines()
