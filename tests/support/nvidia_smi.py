"""A stand-in ``nvidia-smi`` for hosts without a GPU: prints fixed rows for ``--query-gpu``.

It answers only the queries this tool sends (index, uuid, name, memory.total, driver_version,
compute_cap as CSV without units; and, given ``free_mib``, ``memory.free`` one row per GPU);
any other call exits 6 like a real ``nvidia-smi`` that cannot answer. Put its folder first on
``PATH``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

#: Two cards of one model, as ``nvidia-smi`` on a two-GPU H200 host lists them.
TWO_H200 = (
    "0, GPU-1111aaaa-0000-0000-0000-000000000000, NVIDIA H200, 143771, 570.86.15, 9.0",
    "1, GPU-2222bbbb-0000-0000-0000-000000000000, NVIDIA H200, 143771, 570.86.15, 9.0",
)
#: Card 0 is another model than card 1.
MIXED = (
    "0, GPU-3333cccc-0000-0000-0000-000000000000, NVIDIA A100-SXM4-80GB, 81920, 570.86.15, 8.0",
    "1, GPU-2222bbbb-0000-0000-0000-000000000000, NVIDIA H200, 143771, 570.86.15, 9.0",
)


def install_nvidia_smi(
    folder: Path,
    rows: Sequence[str],
    *,
    exit_code: int = 0,
    free_mib: Sequence[int] | None = None,
) -> Path:
    """Write an executable ``nvidia-smi`` into ``folder`` and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    body = "\n".join(rows)
    free = "" if free_mib is None else "\n".join(str(m) for m in free_mib)
    free_case = (
        ""
        if free_mib is None
        else f"  *--query-gpu=memory.free\\ --format*) printf '%s\\n' {shlex.quote(free)} ;;\n"
    )
    script.write_text(
        "#!/bin/sh\n"
        f"if [ {exit_code} -ne 0 ]; then echo 'NVIDIA-SMI has failed' >&2; exit {exit_code}; fi\n"
        'case "$*" in\n'
        "  *--query-gpu=index,uuid,name,memory.total,driver_version,compute_cap*)\n"
        f"    printf '%s\\n' {shlex.quote(body)} ;;\n"
        f"{free_case}"
        "  *) echo 'unexpected call' >&2; exit 6 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return folder
