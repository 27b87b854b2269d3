"""A short summary of the host (CPU, memory, GPU, the Action's container image) for the
cert's provenance.

The one file-hash helper: a file's sha256, and a cache of it keyed by size and mtime.

Model files, server binaries, sdists and converted folders are all identified this way.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batch_invariance.host.memory import query_nvidia_smi, read_meminfo

__all__ = [
    "IMAGE_VARIABLES",
    "cached_sha256",
    "container_image",
    "cpu_flags",
    "cpu_model",
    "gpu_summary",
    "sha256_file",
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
    """The SIMD features that change llama.cpp kernels (avx2, avx512f, ...), when known: those
    ggml scores its CPU backend variants by (x86: SSE3 is ``pni``; Arm: ``asimddp`` is dotprod),
    so two hosts with the same list load the same variant."""
    wanted = (
        "pni", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "f16c", "fma", "bmi2", "avx_vnni",
        "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi",
        "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
        "asimd", "asimddp", "i8mm", "sve", "sve2", "sme",
    )  # fmt: skip
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


#: Set by the Action's container step (action/run-container.sh): the image the cell ran in, as
#: it was run (``NAME@sha256:...`` or the tag of a build from the action's source), and its
#: image ID.
IMAGE_VARIABLES = ("BATCH_INVARIANCE_IMAGE", "BATCH_INVARIANCE_IMAGE_ID")


def container_image(environ: Mapping[str, str]) -> dict[str, str | None] | None:
    """``{"ref", "id"}`` of the container image the Action ran the cell in; ``None`` outside
    the Action's container (a host run, or an image the step did not name)."""
    ref = environ.get(IMAGE_VARIABLES[0])
    if not ref:
        return None
    return {"ref": ref, "id": environ.get(IMAGE_VARIABLES[1]) or None}


def summary() -> dict[str, Any]:
    """JSON-ready host facts: OS, CPU model/count/flags, memory total, GPUs, and the Action's
    container image where the cell ran in one."""
    _, mem_total = read_meminfo()
    affinity = getattr(os, "sched_getaffinity", None)
    usable = len(affinity(0)) if affinity is not None else os.cpu_count()
    image = container_image(os.environ)
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
        **({"container_image": image} if image is not None else {}),
    }


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (the one file-hash helper)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_sha256(path: str | Path, cache_file: Path | None) -> str:
    """sha256 of ``path``, reusing a cached value while its size and mtime are unchanged.

    ``cache_file`` is a small JSON map; ``None`` disables caching. A corrupt or unwritable
    cache only costs a re-hash, never an error.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = str(p)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    table: dict[str, Any] = {}
    if cache_file is not None:
        try:
            loaded = json.loads(cache_file.read_text())
            if isinstance(loaded, dict):
                table = loaded
        except (OSError, ValueError):
            table = {}
        entry = table.get(key)
        if (
            isinstance(entry, dict)
            and entry.get("size") == stamp["size"]
            and entry.get("mtime_ns") == stamp["mtime_ns"]
            and isinstance(entry.get("sha256"), str)
        ):
            return str(entry["sha256"])
    digest = sha256_file(p)
    if cache_file is not None:
        table[key] = {**stamp, "sha256": digest}
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, sort_keys=True))
            os.replace(tmp, cache_file)
        except OSError:
            pass
    return digest
