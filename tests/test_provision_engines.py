"""provision --engine llama-cpp-python: reuse only a venv built with the pinned flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from batch_invariance.engines.provision import Layout
from batch_invariance.engines.provision_engines import (
    CMAKE_ARGS,
    LLAMA_CPP_PYTHON_VERSION,
    ensure_llama_cpp_python,
    installed_version,
    venv_dir,
)
from batch_invariance.errors import InfraError


def fake_venv(root: Path, version: str, flags: str | None) -> Path:
    """A venv whose ``python`` answers the import probe with ``version``."""
    home = venv_dir(Layout(root))
    python = home / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!{sys.executable}\nprint({version!r})\n")
    python.chmod(0o755)
    if flags is not None:
        (home / "build-flags.txt").write_text(flags + "\n")
    return python


def test_a_venv_with_the_pinned_version_and_flags_is_reused(tmp_path: Path) -> None:
    python = fake_venv(tmp_path, LLAMA_CPP_PYTHON_VERSION, CMAKE_ARGS)
    got = ensure_llama_cpp_python(Layout(tmp_path), allow_build=False)
    assert (got.python, got.version, got.origin) == (python, LLAMA_CPP_PYTHON_VERSION, "reused")


@pytest.mark.parametrize(
    ("version", "flags"),
    [
        ("0.3.1", CMAKE_ARGS),
        (LLAMA_CPP_PYTHON_VERSION, None),
        (LLAMA_CPP_PYTHON_VERSION, "-DGGML_NATIVE=ON"),
    ],
)
def test_other_versions_or_native_builds_are_not_reused(
    tmp_path: Path, version: str, flags: str | None
) -> None:
    fake_venv(tmp_path, version, flags)
    with pytest.raises(InfraError, match="provision --engine llama-cpp-python"):
        ensure_llama_cpp_python(Layout(tmp_path), allow_build=False)


def test_installed_version_of_nothing_is_none(tmp_path: Path) -> None:
    assert installed_version(tmp_path / "missing") is None
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert installed_version(broken) is None


def test_portable_flags_leave_amx_out() -> None:
    assert "-DGGML_NATIVE=OFF" in CMAKE_ARGS and "AMX" not in CMAKE_ARGS.replace("NATIVE", "")
