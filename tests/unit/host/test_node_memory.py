"""The memory node vLLM reserves from, read the way vLLM 0.32 reads it (a fake sysfs tree):
free + file pages + reclaimable slab as available, and a cgroup limit clamping both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batch_invariance.host.node_memory import read_node_memory

KB = 1024
MEMINFO = """Node 0 MemTotal:       16000000 kB
Node 0 MemFree:         9000000 kB
Node 0 MemUsed:         7000000 kB
Node 0 Active(file):    1000000 kB
Node 0 Inactive(file):  2000000 kB
Node 0 SReclaimable:     500000 kB
"""


def _nodes(tmp_path: Path) -> Path:
    nodes = tmp_path / "node"
    node0 = nodes / "node0"
    node0.mkdir(parents=True)
    (node0 / "meminfo").write_text(MEMINFO)
    cpu = min(os.sched_getaffinity(0))
    (node0 / f"cpu{cpu}").mkdir()
    return nodes


def test_available_counts_free_file_pages_and_reclaimable_slab(tmp_path: Path) -> None:
    got = read_node_memory(_nodes(tmp_path), tmp_path / "no-cgroup")
    assert got.node == 0
    assert got.total_bytes == 16000000 * KB
    assert got.available_bytes == (9000000 + 1000000 + 2000000 + 500000) * KB


def test_a_cgroup_v2_limit_clamps_total_and_counts_its_page_cache_as_used(
    tmp_path: Path,
) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(str(8 * 1024**3))
    (cgroup / "memory.current").write_text(str(5 * 1024**3))  # page cache included
    got = read_node_memory(_nodes(tmp_path), cgroup)
    assert got.total_bytes == 8 * 1024**3
    assert got.available_bytes == 3 * 1024**3


def test_an_unlimited_cgroup_leaves_the_node_as_it_is(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    (cgroup / "memory").mkdir(parents=True)
    (cgroup / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text(str(5 * 1024**3))
    assert read_node_memory(_nodes(tmp_path), cgroup).total_bytes == 16000000 * KB


def test_without_node_meminfo_it_reads_the_host_as_vllm_does(tmp_path: Path) -> None:
    import psutil

    got = read_node_memory(tmp_path / "none", tmp_path / "no-cgroup")
    assert got.node is None and got.total_bytes == psutil.virtual_memory().total


@pytest.mark.skipif(not Path("/sys/devices/system/node").is_dir(), reason="no NUMA sysfs")
def test_the_real_host_reads_a_node_with_room_in_it() -> None:
    got = read_node_memory()
    assert 0 < got.available_bytes <= got.total_bytes
