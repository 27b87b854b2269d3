"""The memory guard's projection and decisions, and the RSS watch (no server needed)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from batch_invariance.errors import GuardRefused
from batch_invariance.host import memory
from batch_invariance.host.gguf import parse_info
from batch_invariance.host.memory import GIB, HostMemory
from tests.support.fakes_live import dense_meta, write_gguf


@pytest.fixture()
def info(tmp_path: Path) -> memory.GgufInfo:
    return parse_info(write_gguf(tmp_path / "m.gguf", dense_meta(), padding=1 << 20))


def test_projection_scales_with_ctx_times_n(info: memory.GgufInfo) -> None:
    one = memory.project(info, 4096, 1)
    four = memory.project(info, 4096, 4)
    assert one.kv_bytes == 18 * 512 * 2 * 4096
    assert four.kv_bytes == 4 * one.kv_bytes
    assert four.weights_bytes == info.file_size
    assert four.total_bytes == four.weights_bytes + four.kv_bytes + memory.OVERHEAD_BYTES


def test_cache_type_flags_change_the_kv_estimate(info: memory.GgufInfo) -> None:
    assert memory.cache_types(["-ctk", "q8_0", "--cache-type-v", "q4_0"]) == ("q8_0", "q4_0")
    f16 = memory.project(info, 1024, 2)
    q8 = memory.project(info, 1024, 2, ["-ctk", "q8_0", "-ctv", "q8_0"])
    assert q8.kv_bytes < f16.kv_bytes
    assert (q8.cache_type_k, q8.cache_type_v) == ("q8_0", "q8_0")


def test_guard_refuses_over_the_cap_and_over_available(info: memory.GgufInfo) -> None:
    proj = memory.project(info, 4096, 4)
    roomy = HostMemory(mem_available_bytes=64 * GIB, mem_total_bytes=64 * GIB, vram_free_bytes=None)
    assert memory.evaluate(proj, roomy, None).refusal is None
    assert memory.evaluate(proj, roomy, 10.0).refusal is None
    capped = memory.evaluate(proj, roomy, proj.total_bytes / GIB / 2)
    assert capped.refusal is not None and "--max-footprint-gb" in capped.refusal
    tight = HostMemory(mem_available_bytes=proj.total_bytes - 1, mem_total_bytes=None,
                       vram_free_bytes=None)  # fmt: skip
    refusal = memory.evaluate(proj, tight, None).refusal
    assert refusal is not None and "available" in refusal


def test_guard_uses_vram_when_layers_are_offloaded(info: memory.GgufInfo) -> None:
    proj = memory.project(info, 4096, 4)
    host = HostMemory(mem_available_bytes=64 * GIB, mem_total_bytes=None, vram_free_bytes=1)
    assert memory.offloads_to_gpu(["-ngl", "99"]) is True
    assert memory.offloads_to_gpu(["--n-gpu-layers=0"]) is False
    assert memory.offloads_to_gpu([]) is False
    refusal = memory.evaluate(proj, host, None, gpu_offload=True).refusal
    assert refusal is not None and "VRAM" in refusal
    assert memory.evaluate(proj, host, None, gpu_offload=False).refusal is None


def test_check_raises_guard_refused(info: memory.GgufInfo) -> None:
    proj = memory.project(info, 4096, 4)
    with pytest.raises(GuardRefused, match="memory guard"):
        memory.check(proj, cap_gb=0.0001)
    assert memory.check(proj, cap_gb=None).refusal is None  # this host has room for 1 MiB


def test_read_meminfo(tmp_path: Path) -> None:
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       1000 kB\nMemFree:   10 kB\nMemAvailable:     500 kB\n")
    assert memory.read_meminfo(fake) == (500 * 1024, 1000 * 1024)
    assert memory.read_meminfo(tmp_path / "nope") == (None, None)


def test_rss_watch_trips_once_past_the_cap() -> None:
    samples = iter([10, 20, 5000, 6000])
    tripped = threading.Event()
    reasons: list[str] = []

    def on_trip(reason: str) -> None:
        reasons.append(reason)
        tripped.set()

    watch = memory.RssWatch(1, cap_bytes=1000, on_trip=on_trip, interval_s=0.001,
                            sample=lambda pid: next(samples))  # fmt: skip
    watch.start()
    assert tripped.wait(5)
    watch.stop()
    assert len(reasons) == 1 and "passed the cap" in reasons[0]
    assert watch.peak_bytes == 5000 and watch.tripped == reasons[0]


def test_rss_watch_stays_quiet_under_the_cap() -> None:
    watch = memory.RssWatch(1, cap_bytes=1000, on_trip=lambda r: None, interval_s=0.001,
                            sample=lambda pid: 10)  # fmt: skip
    watch.start()
    watch.stop()
    assert watch.tripped is None


def test_group_rss_of_a_missing_process_is_zero() -> None:
    assert memory.group_rss(2**22 + 12345) == 0


def test_gpu_figures_come_from_nvidia_smi_when_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batch_invariance.host import facts as hostinfo

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *memory.free*) printf "1000\\n2000\\n";;\n'
        '  *) printf "H200, 143771 MiB, 570.1\\n";; esac\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert memory.read_vram_free() == 3000 * 1024**2
    assert hostinfo.gpu_summary() == [
        {"name": "H200", "memory_total": "143771 MiB", "driver": "570.1"}
    ]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert memory.read_vram_free() is None and hostinfo.gpu_summary() == []


def test_the_host_summary_records_the_actions_container_image_only_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batch_invariance.host import facts as hostinfo

    ref, image_id = "ghcr.io/o/bi@sha256:" + "a" * 64, "sha256:" + "c" * 64
    monkeypatch.delenv("BATCH_INVARIANCE_IMAGE", raising=False)
    assert "container_image" not in hostinfo.summary()  # a host run: no image to name
    monkeypatch.setenv("BATCH_INVARIANCE_IMAGE", ref)
    monkeypatch.setenv("BATCH_INVARIANCE_IMAGE_ID", image_id)
    assert hostinfo.summary()["container_image"] == {"ref": ref, "id": image_id}
    monkeypatch.setenv("BATCH_INVARIANCE_IMAGE_ID", "")  # `docker image inspect` said nothing
    assert hostinfo.container_image(os.environ) == {"ref": ref, "id": None}
