"""GPU placement: what a selection picks, what a cert records, how a deploy is compared."""

from __future__ import annotations

import pytest

from batch_invariance.core.gpu_placement import (
    NO_NVIDIA_SMI,
    GpuDevice,
    GpuPlacement,
    is_gpu_selection,
    placement_differences,
    select_gpus,
)


def _h200(index: str, uuid: str = "") -> GpuDevice:
    return GpuDevice("NVIDIA H200", 143771, "570.86.15", "9.0", index, uuid or f"GPU-{index}abc")


A100 = GpuDevice("NVIDIA A100-SXM4-80GB", 81920, "570.86.15", "8.0", "0", "GPU-0zzz")
TWO = (_h200("0"), _h200("1"))


@pytest.mark.parametrize(
    "name",
    ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
     "ROCR_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA"],
)  # fmt: skip
def test_selection_variables_are_placement(name: str) -> None:
    assert is_gpu_selection(name)


@pytest.mark.parametrize("name", ["NVIDIA_TF32_OVERRIDE", "CUDA_LAUNCH_BLOCKING", "GGML_CUDA_X"])
def test_variables_that_change_the_numbers_are_not_placement(name: str) -> None:
    assert not is_gpu_selection(name)


def test_no_selection_sees_every_gpu() -> None:
    assert select_gpus(TWO, {}).devices == TWO


def test_cuda_visible_devices_by_index_and_by_uuid_prefix() -> None:
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "1"}).devices == (TWO[1],)
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "GPU-1a"}).devices == (TWO[1],)
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "1,0"}).devices == (TWO[1], TWO[0])


@pytest.mark.parametrize("value", ["", "-1", "7", "none"])
def test_entries_that_name_no_gpu_hide_the_rest(value: str) -> None:
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": value}).devices == ()
    # The runtime stops at the first entry naming no GPU, and at a repeat.
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": f"0,{value},1"}).devices == (TWO[0],)
    assert select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "0,0,1"}).devices == (TWO[0],)


def test_what_cannot_be_resolved_is_unread_not_guessed() -> None:
    mig = select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "MIG-1234"})
    assert mig.unread is not None and "MIG" in mig.unread
    amd = select_gpus(TWO, {"HIP_VISIBLE_DEVICES": "0"})
    assert amd.unread is not None and "HIP_VISIBLE_DEVICES" in amd.unread


def test_a_host_without_nvidia_smi_uses_no_gpu() -> None:
    placement = select_gpus(None, {"CUDA_VISIBLE_DEVICES": "0"})
    assert placement.devices == () and placement.unread is None
    assert placement.record() == {"source": NO_NVIDIA_SMI, "devices": []}


def test_the_record_names_the_card_model_not_the_card() -> None:
    record = select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "1"}).record()
    assert record == {
        "source": "nvidia-smi",
        "devices": [{"name": "NVIDIA H200", "memory_total_mib": 143771,
                     "driver_version": "570.86.15", "compute_cap": "9.0"}],
    }  # fmt: skip
    # So GPU 0 of the same model is the same placement.
    other = select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "0"})
    check = placement_differences(record, other)
    assert check.differences == () and check.unchecked is None


def test_another_model_count_or_driver_is_a_difference() -> None:
    record = select_gpus(TWO, {"CUDA_VISIBLE_DEVICES": "1"}).record()
    (line,) = placement_differences(record, GpuPlacement((A100,))).differences
    assert line == (
        "GPUs 1 x NVIDIA A100-SXM4-80GB (81920 MiB, driver 570.86.15, compute 8.0) (measured "
        "on 1 x NVIDIA H200 (143771 MiB, driver 570.86.15, compute 9.0))"
    )
    assert placement_differences(record, GpuPlacement(TWO)).differences
    assert placement_differences(record, GpuPlacement()).differences
    newer = GpuDevice("NVIDIA H200", 143771, "580.1", "9.0", "0")
    assert placement_differences(record, GpuPlacement((newer,))).differences


def test_what_is_unread_on_either_side_is_said() -> None:
    record = GpuPlacement(TWO).record()
    assert "does not record its GPUs" in str(
        placement_differences(None, GpuPlacement(TWO)).unchecked
    )
    unread_cert = placement_differences({"unread": "an attached server"}, GpuPlacement(TWO))
    assert unread_cert.differences == () and "attached server" in str(unread_cert.unchecked)
    here = placement_differences(record, GpuPlacement(unread="nvidia-smi exited 9: x"))
    assert here.differences == () and "this host's unread (nvidia-smi exited 9" in str(
        here.unchecked
    )
    broken = placement_differences({"devices": "two"}, GpuPlacement(TWO))
    assert broken.unchecked is not None and broken.differences == ()
