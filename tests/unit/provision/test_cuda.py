"""provision --backend cuda: the build plan as pure functions, the arch read from a stub
nvidia-smi, the sidecar's build identity, and the refusal without nvcc run for real."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.errors import GuardRefused, InfraError, UsageError
from batch_invariance.provision import cuda
from batch_invariance.provision import embedded as prov
from batch_invariance.provision.cuda_plan import (
    cuda_build_plan,
    normalise_arch,
    parse_nvcc_release,
    pick_arch,
)
from tests.support.fakes_live import fake_server
from tests.support.nvidia_smi import MIXED, TWO_H200, install_nvidia_smi

NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def _fake_nvcc(folder: Path, text: str = NVCC_13) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nvcc = folder / "nvcc"
    nvcc.write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(text)}\n")  # builtins only
    nvcc.chmod(0o755)
    return nvcc


@pytest.mark.parametrize(
    ("given", "caps", "arch"),
    [("90", None, "90"), ("9.0", None, "90"), ("120a", None, "120a"), (None, ["9.0", "9.0"], "90"),
     (None, ["8.9"], "89")],
)  # fmt: skip
def test_the_arch_is_the_given_one_else_the_gpus(
    given: str | None, caps: list[str] | None, arch: str
) -> None:
    assert pick_arch(given, caps) == arch


@pytest.mark.parametrize(
    ("caps", "says"),
    [
        (None, "no nvidia-smi"),
        ([], "no GPU listed"),
        (["8.0", "9.0"], "differ"),
        (["[N/A]"], "N/A"),
    ],
)
def test_an_arch_that_cannot_be_read_is_refused_naming_the_flag(
    caps: list[str] | None, says: str
) -> None:
    with pytest.raises(GuardRefused, match="--cuda-arch") as err:
        pick_arch(None, caps)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["x", "9", "90;rm", "9.0.1", "0", ""])
def test_a_malformed_arch_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--cuda-arch"):
        normalise_arch(bad)


def test_nvcc_release_is_read_from_its_version_text() -> None:
    assert parse_nvcc_release(NVCC_13) == "13.0.88"
    assert parse_nvcc_release("Cuda compilation tools, release 12.4") == "12.4"
    assert parse_nvcc_release("gcc (Debian) 12.2.0") is None


def test_the_plan_adds_cuda_for_one_arch_to_the_cpu_flags() -> None:
    plan = cuda_build_plan(prov.CMAKE_FLAGS, "90", "13.0.88", "/opt/cuda/bin/nvcc")
    flags = plan.cmake_flags
    assert flags[: len(prov.CMAKE_FLAGS)] == prov.CMAKE_FLAGS
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=90" in flags
    assert "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc" in flags
    assert [f for f in flags if "ARCHITECTURES" in f] == ["-DCMAKE_CUDA_ARCHITECTURES=90"]
    label = f"-DLLAMA_BUILD_COMMIT={plan.commit_label}"
    assert flags[-1] == label and " " not in label
    assert plan.tag.startswith("cuda13.0.88-sm90-")
    ident = plan.identity()
    assert ident["cuda_version"] == "13.0.88" and ident["cuda_architectures"] == ["90"]
    assert ident["cmake_flags"] == list(flags) and ident["backend"] == "cuda"


def test_another_arch_or_toolkit_is_another_cache_folder() -> None:
    base = cuda_build_plan(prov.CMAKE_FLAGS, "90", "13.0.88", "/a/nvcc")
    assert cuda_build_plan(prov.CMAKE_FLAGS, "90", "13.0.88", "/b/nvcc").tag == base.tag
    assert cuda_build_plan(prov.CMAKE_FLAGS, "89", "13.0.88", "/a/nvcc").tag != base.tag
    assert cuda_build_plan(prov.CMAKE_FLAGS, "90", "12.4", "/a/nvcc").tag != base.tag
    cpu, gpu = prov.Layout(Path("/c")), prov.Layout(Path("/c"), tag=base.tag)
    assert cpu.server_bin != gpu.server_bin and cpu.build_dir != gpu.build_dir
    assert cpu.build_log != gpu.build_log and cpu.sdist == gpu.sdist


def test_the_arch_comes_from_the_stub_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvcc = _fake_nvcc(tmp_path / "cuda")
    env = {"PATH": str(tmp_path / "empty"), "CUDACXX": str(nvcc)}
    monkeypatch.setenv("PATH", str(install_nvidia_smi(tmp_path / "smi", TWO_H200)))
    plan = cuda.plan_here(None, env)
    assert (plan.arch, plan.cuda_version, plan.nvcc) == ("90", "13.0.88", str(nvcc))
    monkeypatch.setenv("PATH", str(install_nvidia_smi(tmp_path / "mixed", MIXED)))
    with pytest.raises(GuardRefused, match="differ"):
        cuda.plan_here(None, env)
    assert cuda.plan_here("8.0", env).arch == "80"  # given: nvidia-smi is not asked
    monkeypatch.setenv("PATH", str(install_nvidia_smi(tmp_path / "broken", TWO_H200, exit_code=9)))
    with pytest.raises(GuardRefused, match="did not answer"):
        cuda.plan_here(None, env)


def test_an_nvcc_that_names_no_release_is_an_infra_error(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path / "cuda", "not a compiler\n")
    with pytest.raises(InfraError, match="naming no CUDA release"):
        cuda.plan_here("90", {"PATH": str(nvcc.parent)})


def test_the_sidecar_records_the_build_identity(tmp_path: Path) -> None:
    plan = cuda_build_plan(prov.CMAKE_FLAGS, "90", "13.0.88", "/a/nvcc")
    layout = prov.Layout(tmp_path, tag=plan.tag)
    fake_server(layout.build_dir / "bin")  # a finished build left by an interrupted provision
    path, _, origin = prov.ensure_server(
        layout, lambda _: None, False, None, plan.cmake_flags, plan.identity()
    )
    assert origin == "adopted" and path == layout.server_bin
    assert json.loads(layout.server_sidecar.read_text())["build"] == plan.identity()
    with pytest.raises(InfraError, match="provision --backend cuda"):
        prov.ensure_server(prov.Layout(tmp_path / "other", tag=plan.tag), lambda _: None, False)


def test_without_nvcc_it_refuses_in_one_line_for_real(tmp_path: Path) -> None:
    """The real command on a PATH with no nvcc (and no $CUDACXX): one line, exit 2, nothing
    built or downloaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    env["BATCH_INVARIANCE_CACHE"] = str(tmp_path / "cache")
    out = subprocess.run(
        [sys.executable, "-m", "batch_invariance", "provision", "--backend", "cuda"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == exitcodes.USAGE == exitcodes.for_error(GuardRefused("x"))
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no nvcc on PATH" in lines[0]
    assert "install the CUDA toolkit" in lines[0] and out.stdout == ""
    assert not (tmp_path / "cache" / "src").exists()
