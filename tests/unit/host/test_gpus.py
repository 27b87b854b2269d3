"""This host's GPUs from a stand-in ``nvidia-smi`` on PATH (the real one where it exists)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from batch_invariance.host.gpus import list_gpus, placement_here
from tests.support.nvidia_smi import TWO_H200, install_nvidia_smi


def _only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(folder))


def test_reads_every_card_and_selects_like_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _only(install_nvidia_smi(tmp_path / "bin", TWO_H200), monkeypatch)
    listed = list_gpus()
    assert listed is not None and [d.index for d in listed] == ["0", "1"]
    assert listed[1].uuid.startswith("GPU-2222") and listed[1].memory_total_mib == 143771
    chosen = placement_here({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"})
    assert [d.index for d in chosen.devices] == ["1"] and chosen.unread is None


def test_no_nvidia_smi_is_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _only(tmp_path, monkeypatch)
    assert list_gpus() is None
    assert placement_here({}).record() == {"source": "no nvidia-smi on PATH", "devices": []}


def test_a_failing_nvidia_smi_is_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _only(install_nvidia_smi(tmp_path / "bin", TWO_H200, exit_code=9), monkeypatch)
    placement = placement_here({})
    assert placement.unread is not None and "nvidia-smi exited 9" in placement.unread


def test_an_unreadable_line_is_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _only(install_nvidia_smi(tmp_path / "bin", ["0, GPU-x, [N/A]"]), monkeypatch)
    placement = placement_here({})
    assert placement.unread is not None and "cannot read" in placement.unread


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no real nvidia-smi here")
def test_the_real_nvidia_smi_answers_the_query() -> None:
    placement = placement_here({})
    assert placement.unread is None and placement.devices, placement.words()
    assert all(d.compute_cap and d.driver_version for d in placement.devices)
