"""The memory guard on a GPU: what -ngl puts in VRAM, the refusal naming the fixes, and
plan-n reading free VRAM from a stub nvidia-smi (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from batch_invariance import exitcodes
from batch_invariance.errors import GuardRefused
from batch_invariance.host import memory
from batch_invariance.host.gguf import parse_info
from batch_invariance.host.memory import GIB, OVERHEAD_BYTES, HostMemory
from tests.support.fakes_live import dense_meta, write_gguf
from tests.support.nvidia_smi import TWO_H200, install_nvidia_smi


@pytest.fixture()
def info(tmp_path: Path) -> memory.GgufInfo:
    return parse_info(write_gguf(tmp_path / "m.gguf", dense_meta(), padding=1 << 20))


@pytest.mark.parametrize(
    ("flags", "share", "kv_on_gpu"),
    [([], 0.0, False), (["-ngl", "0"], 0.0, False), (["-ngl", "99"], 1.0, True),
     (["-ngl", "18"], 1.0, True), (["-ngl", "all"], 1.0, True), (["-ngl", "9"], 0.5, True),
     (["-ngl", "99", "-nkvo"], 1.0, False), (["--n-gpu-layers", "-1"], 1.0, True)],
)  # fmt: skip
def test_the_share_on_the_gpu_follows_ngl(flags: list[str], share: float, kv_on_gpu: bool) -> None:
    assert memory.gpu_offload_share(flags, 18) == (share, kv_on_gpu)


def test_ngl_projects_weights_and_kv_onto_vram(info: memory.GgufInfo) -> None:
    cpu = memory.project(info, 4096, 4)
    full = memory.project(info, 4096, 4, ["-ngl", "99"])
    half = memory.project(info, 4096, 4, ["-ngl", "9"])
    host_kv = memory.project(info, 4096, 4, ["-ngl", "99", "-nkvo"])
    assert cpu.vram_bytes == 0 and full.total_bytes == cpu.total_bytes
    assert full.vram_bytes == info.file_size + full.kv_bytes + OVERHEAD_BYTES
    assert half.vram_bytes == info.file_size // 2 + half.kv_bytes // 2 + OVERHEAD_BYTES
    assert host_kv.vram_bytes == info.file_size + OVERHEAD_BYTES


def test_a_cell_over_free_vram_is_refused_naming_the_fixes(info: memory.GgufInfo) -> None:
    flags = ["-ngl", "99"]
    proj = memory.project(info, 32768, 16, flags)
    tight = HostMemory(64 * GIB, 64 * GIB, vram_free_bytes=proj.vram_bytes - 1)
    decision = memory.evaluate(proj, tight, None, memory.offloads_to_gpu(flags))
    refusal = decision.refusal or ""
    assert "VRAM is free (nvidia-smi)" in refusal and "\n" not in refusal
    for fix in ("fewer slots (--parallel)", "smaller --ctx", "quantised KV cache"):
        assert fix in refusal
    roomy = HostMemory(1, 1, vram_free_bytes=proj.vram_bytes)  # host memory is not the limit
    assert memory.evaluate(proj, roomy, None, True).refusal is None
    q8 = memory.project(info, 32768, 16, [*flags, "-ctk", "q8_0", "-ctv", "q8_0"])
    q8_refusal = memory.evaluate(q8, HostMemory(1, 1, 1), None, True).refusal or ""
    assert "quantised" not in q8_refusal and "--parallel" in q8_refusal
    with pytest.raises(GuardRefused):
        memory.launch_guard(decision)


def test_free_vram_is_read_from_the_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = install_nvidia_smi(tmp_path / "smi", TWO_H200, free_mib=[1000, 2000])
    monkeypatch.setenv("PATH", str(folder))
    assert memory.read_vram_free() == 3000 * 1024**2
    monkeypatch.setenv("PATH", str(install_nvidia_smi(tmp_path / "bare", TWO_H200)))
    assert memory.read_vram_free() is None  # an nvidia-smi that cannot answer: unknown


def _plan_n(model: Path, smi: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{smi}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "batch_invariance", "plan-n", "--model", str(model), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def test_plan_n_holds_the_gpu_part_against_free_vram(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "m.gguf", dense_meta(), padding=1 << 20)
    smi = install_nvidia_smi(tmp_path / "smi", TWO_H200, free_mib=[400])
    out = _plan_n(model, smi, "--ctx", "4096", "--parallel", "8", "--server-flag=-ngl",
                  "--server-flag=99")  # fmt: skip
    assert out.returncode == exitcodes.PROMOTABLE, out.stderr
    assert "VRAM free 0.39 GiB" in out.stdout and "on GPU" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in (["1"], ["8"])]
    assert rows[0][-1] == "yes" and rows[1][-1] == "NO"
    assert "first that does not fit: --parallel" in out.stdout and "smaller --ctx" in out.stdout
    cpu = _plan_n(model, smi, "--ctx", "4096", "--parallel", "8")
    assert "VRAM" not in cpu.stdout and "on GPU" not in cpu.stdout
