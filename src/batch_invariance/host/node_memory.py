"""The memory node vLLM's CPU backend reserves from, read the way vLLM 0.32 reads it.

vLLM's CPU worker binds to the NUMA node of the first CPU it may run on and reads that node's
``/sys/devices/system/node/nodeK/meminfo``: total ``MemTotal``, available ``MemFree +
Active(file) + Inactive(file) + SReclaimable``; where the node has no meminfo, the host's
``psutil.virtual_memory()``. Under a cgroup memory limit smaller than the node, the total is
the limit and the available memory at most ``limit - usage``, where usage counts the cgroup's
page cache: that is how a host whose page cache holds a few GB makes vLLM's default 0.92
fail at start (``vllm/utils/cpu_resource_utils.py``: ``get_memory_node_info``; a test holds
this reader against that function where vLLM is provisioned).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["NodeMemory", "read_node_memory"]

_NODES = Path("/sys/devices/system/node")
_CGROUP = Path("/sys/fs/cgroup")
#: cgroup v1 writes a number near PAGE_COUNTER_MAX for "no limit" (vLLM's own cut-off).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class NodeMemory:
    """One memory node as vLLM sees it: bytes in all, and bytes it counts as available."""

    node: int | None
    total_bytes: int
    available_bytes: int


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return None if not text or text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _first_cpu_node(nodes: Path) -> int | None:
    """The node of the lowest CPU this process may run on (vLLM's ``allowed_cpu_list[0]``)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is None:
        return None
    cpu = min(affinity(0))
    for node_dir in sorted(nodes.glob("node[0-9]*")):
        if (node_dir / f"cpu{cpu}").exists():
            return int(node_dir.name.removeprefix("node"))
    return None


def _node_meminfo(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()  # "Node 0 MemTotal: 97421888 kB"
        if len(parts) >= 4 and parts[3].isdigit():
            values[parts[2].rstrip(":")] = int(parts[3]) * 1024
    return values


def _cgroup_limit_usage(root: Path) -> tuple[int | None, int | None]:
    v2_limit = _read_int(root / "memory.max")
    if v2_limit is not None:  # cgroup v2
        return v2_limit, _read_int(root / "memory.current")
    limit = _read_int(root / "memory" / "memory.limit_in_bytes")
    if limit is None or limit >= _V1_UNLIMITED:
        return None, None
    return limit, _read_int(root / "memory" / "memory.usage_in_bytes")


def read_node_memory(nodes: Path = _NODES, cgroup: Path = _CGROUP) -> NodeMemory:
    """The node vLLM would reserve from, with its total and available bytes right now."""
    node = _first_cpu_node(nodes)
    meminfo = nodes / f"node{node}" / "meminfo"
    try:
        info = _node_meminfo(meminfo) if node is not None else {}
        total = info["MemTotal"]
        available = sum(
            info[k] for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
        )
    except (OSError, KeyError):
        vm = psutil.virtual_memory()
        node, total, available = None, int(vm.total), int(vm.available)
    limit, usage = _cgroup_limit_usage(cgroup)
    if limit is not None and limit < total:
        total = limit
        available = max(0, min(available, limit - (usage or 0)))
    return NodeMemory(node, total, available)
