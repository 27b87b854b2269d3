"""The memory node the vLLM guard sizes ``--gpu-memory-utilization`` from: the tool's reading
of it against vLLM's own (the CPU build). The sized launches themselves, and the prompt-cache
arm on vLLM, run in ``test_vllm_live.py``'s launched cell."""

from __future__ import annotations

import subprocess

import pytest

from batch_invariance.host.node_memory import read_node_memory
from batch_invariance.provision.vllm import VllmProvisioned

pytestmark = pytest.mark.live

VLLM_NODE = (
    "from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info\n"
    "m = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)\n"
    "import psutil\n"
    "print(m.total_memory, m.available_memory, psutil.Process().memory_info().rss)\n"
)


def test_the_node_reader_agrees_with_vllms_own(vllm: VllmProvisioned) -> None:
    before = read_node_memory()
    out = subprocess.run(
        [str(vllm.venv.python), "-c", VLLM_NODE], capture_output=True, text=True, timeout=300
    )
    after = read_node_memory()
    assert out.returncode == 0, out.stderr[-2000:]
    total, available, own_rss = (int(x) for x in out.stdout.split()[-3:])
    assert before.total_bytes == after.total_bytes == total
    # Free memory moves while vLLM imports (seconds), and vLLM reads with its own imports
    # resident: its reading must lie between ours, taken just before and just after, less
    # its own resident set, give or take 64 MiB.
    low = min(before.available_bytes, after.available_bytes) - own_rss - 64 * 1024**2
    high = max(before.available_bytes, after.available_bytes) + 64 * 1024**2
    assert low <= available <= high, (before, available, after)
