"""Small ELF files for tests: a dynamic section with the ``DT_NEEDED`` / ``DT_RUNPATH``
entries asked for (or none: a static file), and any bytes after it (the strings a statically
linked library would carry). 64-bit little-endian; one ``PT_LOAD`` maps the whole file at
address 0, so an address is its file offset."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

_HEADER, _PHDR, _DYN = 64, 56, 16
_DT_NEEDED, _DT_STRTAB, _DT_RUNPATH = 1, 5, 29


def elf_bytes(
    needed: Sequence[str] = (),
    runpath: str | None = None,
    *,
    static: bool = False,
    payload: bytes = b"",
) -> bytes:
    """An ELF shared object linking ``needed`` (soname order kept)."""
    phnum = 1 if static else 2
    strtab_at = _HEADER + phnum * _PHDR
    names = [*needed, *([runpath] if runpath is not None else [])]
    strtab = b"\0"
    offsets = []
    for name in names:
        offsets.append(len(strtab))
        strtab += name.encode() + b"\0"
    dynamic_at = strtab_at + len(strtab) + (-(strtab_at + len(strtab)) % 8)
    entries = [(_DT_NEEDED, at) for at in offsets[: len(needed)]]
    if runpath is not None:
        entries.append((_DT_RUNPATH, offsets[-1]))
    entries += [(_DT_STRTAB, strtab_at), (0, 0)]
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    body_end = dynamic_at + (0 if static else len(dynamic))
    total = body_end + len(payload)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, _HEADER, 0, 0, _HEADER, _PHDR, phnum, 64, 0, 0
    )
    phdrs = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, total, total, 0x1000)
    if not static:
        phdrs += struct.pack(
            "<IIQQQQQQ", 2, 6, dynamic_at, dynamic_at, dynamic_at, len(dynamic), len(dynamic), 8
        )
    out = header + phdrs + strtab
    out += bytes(dynamic_at - len(out))
    if not static:
        out += dynamic
    return out + payload


def write_elf(
    path: Path,
    needed: Sequence[str] = (),
    runpath: str | None = None,
    *,
    static: bool = False,
    payload: bytes = b"",
) -> Path:
    """:func:`elf_bytes` written to ``path`` (folders made, executable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(elf_bytes(needed, runpath, static=static, payload=payload))
    path.chmod(0o755)
    return path


def llama_build(folder: Path, *, backends: dict[str, Sequence[str]] | None = None) -> Path:
    """A shared-library llama.cpp build in ``folder``: ``llama-server`` linking ``libllama.so``
    and ``libggml.so`` (which links ``libggml-base.so`` and ``libgomp.so.1``), and each of
    ``backends`` (``{"libggml-blas.so": ("libopenblas.so.0",)}``) beside them, loaded at run
    time (no file names it). Returns the binary."""
    write_elf(folder / "libggml-base.so", ("libm.so.6", "libc.so.6"))
    write_elf(folder / "libggml.so", ("libggml-base.so", "libgomp.so.1", "libc.so.6"))
    write_elf(folder / "libllama.so", ("libggml.so", "libggml-base.so", "libstdc++.so.6"))
    for name, needs in (backends or {}).items():
        write_elf(folder / name, ("libggml-base.so", *needs))
    return write_elf(
        folder / "llama-server",
        ("libllama.so", "libggml.so", "libc.so.6"),
        runpath="$ORIGIN",
    )
