"""The GPUs of this host, read from ``nvidia-smi``, and the ones an environment selects."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

from batch_invariance.core.gpu_placement import (
    GpuDevice,
    GpuPlacement,
    select_gpus,
    unread_placement,
)

__all__ = ["QUERY_FIELDS", "list_gpus", "placement_here"]

#: ``nvidia-smi --query-gpu`` fields, in :class:`GpuDevice` order (``compute_cap``: driver 510+).
QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap")


class _Unread(Exception):
    pass


def list_gpus() -> list[GpuDevice] | None:
    """Every GPU ``nvidia-smi`` lists; ``None`` when there is no ``nvidia-smi`` (no NVIDIA
    driver, so no NVIDIA GPU a server could use). Raises :class:`_Unread` when it is there
    but does not answer (a broken driver, a driver too old to name the compute capability)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    argv = [exe, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise _Unread(f"nvidia-smi did not run ({exc})") from None
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        raise _Unread(f"nvidia-smi exited {out.returncode}: {why[0] if why else 'no message'}")
    devices = []
    for line in out.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise _Unread(f"nvidia-smi printed a line this tool cannot read: {line.strip()!r}")
        index, uuid, name, memory, driver, cap = cells
        devices.append(
            GpuDevice(
                name=name,
                memory_total_mib=int(memory) if memory.isdigit() else None,
                driver_version=driver,
                compute_cap=cap,
                index=index,
                uuid=uuid,
            )
        )
    return devices


def placement_here(env: Mapping[str, str]) -> GpuPlacement:
    """The GPUs a process started on this host with ``env`` sees, or why that is unknown."""
    try:
        listed = list_gpus()
    except _Unread as exc:
        return unread_placement(str(exc))
    return select_gpus(listed, env)
