"""action/run-container.sh's mounts and variables, with a stand-in ``docker`` that records its
argv (the Docker stage runs the script against the real engine: tests/docker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "action" / "run-container.sh"
IMAGE = "ghcr.io/o/bi@sha256:" + "a" * 64
IMAGE_ID = "sha256:" + "c" * 64


@pytest.fixture()
def runner(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "docker.argv"
    docker = bin_dir / "docker"
    # One line per argument of `docker run`; `image inspect` answers that the image is here
    # (and, asked for its --format, gives its image ID).
    docker.write_text(
        f'#!/bin/bash\nif [ "$1" = run ]; then printf "%s\\n" "$@" > {log}; fi\n'
        f'if [ "$1 $3" = "image --format" ]; then echo {IMAGE_ID}; fi\nexit 0\n'
    )
    docker.chmod(0o755)
    workspace = tmp_path / "work" / "repo"
    (tmp_path / "work" / "_temp").mkdir(parents=True)
    workspace.mkdir()
    (tmp_path / "fc").mkdir()
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GITHUB_WORKSPACE": str(workspace),
        "GITHUB_OUTPUT": str(tmp_path / "fc" / "set_output"),
        "RUNNER_TEMP": str(tmp_path / "work" / "_temp"),
        "BI_IMAGE": IMAGE,
        "LOG": str(log),
    }


def _run(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**env, **extra}, capture_output=True, text=True, timeout=60
    )


def _argv(env: dict[str, str]) -> list[str]:
    return Path(env["LOG"]).read_text().splitlines()


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_models_and_server_folders_outside_the_workspace_are_mounted_read_only(
    runner: dict[str, str], tmp_path: Path
) -> None:
    models, server = tmp_path / "srv" / "models", tmp_path / "opt" / "llama"
    models.mkdir(parents=True)
    server.mkdir(parents=True)
    # act also sets the hyphenated spelling of a composite action's inputs.
    proc = _run(runner, INPUT_MODELS_DIR=str(models), INPUT_SERVER_DIR=str(server),
                INPUT_MODEL="gemma.gguf", **{"INPUT_MODELS-DIR": str(models)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    argv = _argv(runner)
    volumes = _pairs(argv, "-v")
    assert f"{models}:/github/models:ro" in volumes and f"{server}:/github/server:ro" in volumes
    env = _pairs(argv, "-e")
    assert "INPUT_MODELS-DIR=/github/models" in env and "INPUT_SERVER-DIR=/github/server" in env
    assert "INPUT_MODEL=gemma.gguf" in env
    dirs = [e for e in env if e.startswith(("INPUT_MODELS_DIR", "INPUT_MODELS-DIR"))]
    assert dirs == ["INPUT_MODELS-DIR=/github/models"]
    # The runner's own paths, for refusals in the user's words (action/lookup.py).
    assert f"BI_HOST_MODELS_DIR={models}" in env and f"BI_HOST_SERVER_DIR={server}" in env
    assert f"BI_HOST_WORKSPACE={runner['GITHUB_WORKSPACE']}" in env
    assert f"BI_INPUT_MODELS_DIR={models}" in env  # as the user wrote it


def test_a_relative_models_dir_is_under_the_workspace_and_a_missing_one_is_refused(
    runner: dict[str, str],
) -> None:
    (Path(runner["GITHUB_WORKSPACE"]) / "models").mkdir()
    assert _run(runner, INPUT_MODELS_DIR="models").returncode == 0
    assert f"{runner['GITHUB_WORKSPACE']}/models:/github/models:ro" in _pairs(_argv(runner), "-v")
    proc = _run(runner, INPUT_MODELS_DIR="/nowhere/models")
    assert proc.returncode == 2
    assert "input models-dir /nowhere/models: no such folder on the runner" in proc.stdout


def test_the_tool_cache_is_mounted_keyed_by_the_image(
    runner: dict[str, str], tmp_path: Path
) -> None:
    cache = tmp_path / "toolcache"
    printed = _run(runner, RUNNER_TOOL_CACHE=str(cache), BI_PRINT_CACHE="1").stdout.strip()
    assert printed.startswith(f"{cache}/batch-invariance/") and not Path(printed).exists()
    assert _run(runner, RUNNER_TOOL_CACHE=str(cache)).returncode == 0
    argv = _argv(runner)
    assert f"{printed}:/github/toolcache" in _pairs(argv, "-v") and Path(printed).is_dir()
    assert "BATCH_INVARIANCE_CACHE=/github/toolcache" in _pairs(argv, "-e")
    other = _run({**runner, "BI_IMAGE": IMAGE.replace("a" * 64, "b" * 64)},
                 RUNNER_TOOL_CACHE=str(cache), BI_PRINT_CACHE="1").stdout.strip()  # fmt: skip
    assert other != printed
    assert _run(runner, BI_PRINT_CACHE="1").stdout.strip() == ""  # no tool cache: none
    assert _run(runner).returncode == 0
    assert "BATCH_INVARIANCE_CACHE=/github/toolcache" not in _pairs(_argv(runner), "-e")


def test_the_container_knows_the_image_it_runs_in_for_the_certs_provenance(
    runner: dict[str, str],
) -> None:
    """The cert records the image its cell ran in (provenance.host.container_image, read by
    host/facts.py): the step passes its name as run and its image ID."""
    assert _run(runner).returncode == 0
    env = _pairs(_argv(runner), "-e")
    assert f"BATCH_INVARIANCE_IMAGE={IMAGE}" in env
    assert f"BATCH_INVARIANCE_IMAGE_ID={IMAGE_ID}" in env


def test_the_runners_gpu_selection_reaches_the_container(runner: dict[str, str]) -> None:
    proc = _run(runner, CUDA_VISIBLE_DEVICES="1", NVIDIA_VISIBLE_DEVICES="all", BI_GPUS="all")
    assert proc.returncode == 0, proc.stdout
    argv = _argv(runner)
    assert {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"} <= set(_pairs(argv, "-e"))
    assert _pairs(argv, "--gpus") == ["all"]
    assert _run(runner).returncode == 0
    assert "CUDA_VISIBLE_DEVICES" not in _pairs(_argv(runner), "-e")


def test_device_and_a_runner_selection_together_are_refused(runner: dict[str, str]) -> None:
    proc = _run(runner, CUDA_VISIBLE_DEVICES="1", BI_GPUS="device=1")
    assert proc.returncode == 2
    assert "set one of the two" in proc.stdout and not Path(runner["LOG"]).exists()


def _commands(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.strip().startswith("::")]


def test_a_folder_input_holding_a_line_break_is_refused_on_one_line(
    runner: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "models\n::error::injected"
    folder.mkdir()
    proc = _run(runner, INPUT_MODELS_DIR=str(folder))
    assert proc.returncode == 2 and not Path(runner["LOG"]).exists()
    assert _commands(proc.stdout) == [
        "::error title=batch-invariance container step::input models-dir holds a line break; "
        "it takes one folder"
    ]


@pytest.mark.parametrize(
    ("extra", "escaped"),
    [
        # A missing folder named with the runner's own escapes and a command: %, CR, LF escaped.
        ({"INPUT_SERVER_DIR": "/nowhere/50% ::warning::w %0A"},
         "input server-dir /nowhere/50%25 ::warning::w %250A: no such folder on the runner"),
        ({"BI_IMAGE": "evil\n::error::injected\r"},
         "input image must be pinned by digest (NAME@sha256:<64 hex>), got "
         "'evil%0A::error::injected%0D'"),
        ({"BI_GPUS": "device=1\n::warning::w", "CUDA_VISIBLE_DEVICES": "0"},
         "input gpus device=1%0A::warning::w and the runner's"),
    ],
)  # fmt: skip
def test_the_die_message_is_escaped_as_the_runner_unescapes_it(
    runner: dict[str, str], extra: dict[str, str], escaped: str
) -> None:
    proc = _run(runner, **extra)
    assert proc.returncode == 2
    (error,) = _commands(proc.stdout)
    assert error.startswith("::error title=batch-invariance container step::")
    assert escaped in error, error
    assert len(proc.stdout.splitlines()) == 1, proc.stdout


def _job_key(runner: dict[str, str], **extra: str) -> str:
    output = Path(runner["GITHUB_OUTPUT"])
    output.write_text("")
    proc = _run(runner, **extra)
    assert proc.returncode == 0, proc.stderr
    (key,) = [line for line in output.read_text().splitlines() if line.startswith("job-key=")]
    return key.removeprefix("job-key=")


def test_the_job_key_tells_apart_the_jobs_that_may_measure_one_cell(
    runner: dict[str, str],
) -> None:
    """Two matrix jobs of one cell differ in their inputs, two jobs in their names: the
    artifact's name carries the key (action/name-artifact.sh); the same step, the same key."""
    split = _job_key(runner, GITHUB_JOB="cell", INPUT_CTX="1024", INPUT_KV_LAYOUT="split")
    assert len(split) == 16 and int(split, 16) >= 0
    assert _job_key(runner, GITHUB_JOB="cell", INPUT_CTX="1024", INPUT_KV_LAYOUT="split") == split
    others = {
        _job_key(runner, GITHUB_JOB="cell", INPUT_CTX="1024", INPUT_KV_LAYOUT="unified"),
        _job_key(runner, GITHUB_JOB="other", INPUT_CTX="1024", INPUT_KV_LAYOUT="split"),
    }
    assert split not in others and len(others) == 2
