"""A short summary of the host (CPU, memory, GPU) for the cert's provenance."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from batch_invariance.host.memory import query_nvidia_smi, read_meminfo

__all__ = [
    "cpu_flags",
    "cpu_model",
    "gpu_summary",
    "summary",
]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU model name, when the platform says."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The SIMD features that change llama.cpp kernels (avx2, avx512f, ...), when known."""
    wanted = ("avx", "avx2", "avx512f", "avx512_bf16", "avx_vnni", "f16c", "fma", "amx_tile")
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                have = set(value.split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def gpu_summary() -> list[dict[str, str]]:
    """Name, total memory and driver of each GPU ``nvidia-smi`` lists (empty without one)."""
    rows = query_nvidia_smi(["name", "memory.total", "driver_version"]) or []
    return [{"name": n, "memory_total": m, "driver": d} for n, m, d in rows]


def summary() -> dict[str, Any]:
    """JSON-ready host facts: OS, CPU model/count/flags, memory total, GPUs."""
    _, mem_total = read_meminfo()
    affinity = getattr(os, "sched_getaffinity", None)
    usable = len(affinity(0)) if affinity is not None else os.cpu_count()
    return {
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
        "cpu_flags": cpu_flags(),
        "mem_total_bytes": mem_total,
        "gpus": gpu_summary(),
    }
