"""A ``model`` or ``server-bin`` input that names no file: said in the user's own words.

In the container the folders are mounts (``models-dir`` at ``/github/models``, ``server-dir``
at ``/github/server``, the workspace at ``/github/workspace``), so the path the CLI would name
(``--model /github/models/x.gguf: no such file``) is neither what the user wrote nor a path on
their runner. The container step hands the runner's own folders on (``BI_HOST_MODELS_DIR``,
``BI_HOST_SERVER_DIR``, ``BI_HOST_WORKSPACE``) and the folder inputs as written
(``BI_INPUT_MODELS_DIR``, ``BI_INPUT_SERVER_DIR``: run-container.sh), and the refusal names the
input as written, the folder input it was looked up in, the runner's path and the nearest file
names in that folder (difflib), before anything is provisioned or launched.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.action.inputs import ActionInputs, model_path, server_bin_path
from batch_invariance.errors import UsageError

__all__ = ["check_input_files", "near_names"]

#: How far the suggestion walk looks (files, folder depth): a models folder can be large.
_MAX_FILES = 5000
_MAX_DEPTH = 4


@dataclass(frozen=True)
class _Lookup:
    """One file input and where it was looked up."""

    name: str  # the input: model, server-bin
    value: str  # as written
    path: Path  # where it was looked for here
    base: Path  # the folder a relative value is looked up in, here
    folder_input: str  # models-dir, server-dir, or "" for the workspace
    folder_value: str  # the folder input as written
    host_folder: str | None  # the runner's path of the folder, when the step said it


def _files(folder: Path) -> list[str]:
    """Files under ``folder``, relative to it, bounded in count and depth."""
    found: list[str] = []
    for root, dirs, names in os.walk(folder):
        depth = len(Path(root).relative_to(folder).parts)
        if depth >= _MAX_DEPTH:
            dirs[:] = []
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            found.append(str((Path(root) / name).relative_to(folder)))
            if len(found) >= _MAX_FILES:
                return found
    return found


def near_names(value: str, folder: Path, n: int = 3) -> list[str]:
    """The files under ``folder`` whose path (or name alone) is closest to ``value``."""
    if not folder.is_dir():
        return []
    try:
        files = _files(folder)
    except OSError:
        return []
    by_path = difflib.get_close_matches(value, files, n=n, cutoff=0.6)
    by_name: dict[str, list[str]] = {}
    for rel in files:
        by_name.setdefault(Path(rel).name, []).append(rel)
    names = difflib.get_close_matches(Path(value).name, list(by_name), n=n, cutoff=0.6)
    picked = list(by_path)
    for name in names:
        picked += [rel for rel in by_name[name] if rel not in picked]
    return picked[:n]


def _lookups(inputs: ActionInputs, env: Mapping[str, str]) -> list[_Lookup]:
    ws = inputs.workspace
    out: list[_Lookup] = []
    for name, value, folder_input, folder_value, path, host_key in (
        ("model", inputs.model, "models-dir", inputs.models_dir, model_path(inputs),
         "BI_HOST_MODELS_DIR"),
        ("server-bin", inputs.server_bin, "server-dir", inputs.server_dir,
         server_bin_path(inputs), "BI_HOST_SERVER_DIR"),
    ):  # fmt: skip
        if not value or path is None:
            continue
        if not folder_value:
            folder_input, host_key = "", "BI_HOST_WORKSPACE"
        base = ws / folder_value if folder_value else ws  # an absolute folder_value stays
        host = env.get(host_key) or None
        # In the container the folder input is the mount; the step says what the user wrote.
        written = env.get(f"BI_INPUT_{folder_input.upper().replace('-', '_')}") or folder_value
        out.append(_Lookup(name, value, path, base, folder_input, written, host))
    return out


def _message(found: _Lookup) -> str:
    where = (
        f"in {found.folder_input} {found.folder_value}"
        if found.folder_input
        else "under the workspace"
    )
    text = f"input {found.name}: {found.value}: no such file {where}"
    if Path(found.value).is_absolute():
        near = [str(found.path.parent / n) for n in near_names(found.path.name, found.path.parent)]
    else:
        if found.host_folder:
            text += f" (on the runner: {Path(found.host_folder) / found.value})"
        near = near_names(found.value, found.base)
    if near:
        return text + "; did you mean " + " or ".join(near) + "?"
    if found.folder_input:
        return text + f"; give a path relative to {found.folder_input}, or an absolute one"
    return text + "; give a path relative to the workspace, or models-dir / server-dir"


def check_input_files(inputs: ActionInputs, env: Mapping[str, str]) -> None:
    """Refuse a ``model`` or ``server-bin`` that names no file here, in the input's words."""
    if inputs.mode != "live" or inputs.profile:
        return
    for found in _lookups(inputs, env):
        if not found.path.exists():
            raise UsageError(_message(found))
