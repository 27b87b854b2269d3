"""``models-dir`` and ``server-dir``: a relative ``model`` / ``server-bin`` is looked up in them
(in the container they are the read-only mounts); a folder that is not there is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from batch_invariance.action.inputs import (
    check_folders,
    live_request,
    model_path,
    read_inputs,
    server_bin_path,
)
from batch_invariance.errors import UsageError


def _inputs(workspace: Path, **given: str) -> dict[str, str]:
    env = {"GITHUB_WORKSPACE": str(workspace)}
    env.update({f"INPUT_{name.upper()}": value for name, value in given.items()})
    return env


def test_relative_files_are_looked_up_in_their_folders(tmp_path: Path) -> None:
    given = {"models-dir": "/github/models", "server-dir": "/github/server",
             "model": "g/gemma.gguf", "server-bin": "bin/llama-server"}  # fmt: skip
    inputs = read_inputs(_inputs(tmp_path / "ws", **given))
    assert model_path(inputs) == Path("/github/models/g/gemma.gguf")
    assert server_bin_path(inputs) == Path("/github/server/bin/llama-server")
    request = live_request(inputs, None)
    assert request.model == Path("/github/models/g/gemma.gguf") and request.profile is None


def test_without_folders_files_are_under_the_workspace_and_absolute_ones_stay(
    tmp_path: Path,
) -> None:
    inputs = read_inputs(_inputs(tmp_path, model="m.gguf", **{"server-bin": "/opt/llama-server"}))
    assert model_path(inputs) == tmp_path / "m.gguf"
    assert server_bin_path(inputs) == Path("/opt/llama-server")
    rel = read_inputs(_inputs(tmp_path, model="m.gguf", **{"models-dir": "models"}))
    assert model_path(rel) == tmp_path / "models" / "m.gguf"


def test_a_profile_gets_the_folder_as_models_dir(tmp_path: Path) -> None:
    inputs = read_inputs(_inputs(tmp_path, profile="spark", **{"models-dir": "/github/models"}))
    profile = live_request(inputs, None).profile
    assert profile is not None and profile.models_dir == "/github/models"


def test_a_folder_that_is_not_here_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    check_folders(read_inputs(_inputs(tmp_path, **{"models-dir": "models"})))
    with pytest.raises(UsageError, match="input server-dir /nowhere: no such folder here"):
        check_folders(read_inputs(_inputs(tmp_path, **{"server-dir": "/nowhere"})))
