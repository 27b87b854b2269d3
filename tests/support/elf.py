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


#: What the served program prints: its ggml's marker, which a changed library changes.
_MAIN_C = r"""
#include <stdio.h>
#include <string.h>
const char *ggml_marker(void);
int main(int argc, char **argv) {
    int version = argc > 1 && strcmp(argv[1], "--version") == 0;
    printf("%s %s\n", version ? "version: 1" : "served by", ggml_marker());
    return 0;
}
"""
#: The marker a library built by :func:`gcc_build` carries (one byte of it is the "other
#: build" of the tests).
MEASURED_MARKER = b"measured-ggml"


def gcc_build(folder: Path, *, dynamic: bool = True) -> Path:
    """A real ELF llama-server look-alike compiled by gcc in ``folder``. ``dynamic``: it links
    ``libggml-base.so``, built beside it (a ``DT_NEEDED`` entry, run path ``$ORIGIN``), as a
    default cmake build links ggml; else ggml is in the binary (the embedded default: only
    system libraries). It prints ``version: 1 MARKER`` for ``--version``, else ``served by
    MARKER``, and exits 0. Skips the test where gcc is absent."""
    import shutil
    import subprocess

    import pytest

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: no real ELF build to test with")
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    marker = f'const char *ggml_marker(void) {{ return "{MEASURED_MARKER.decode()}"; }}\n'
    binary = folder / "llama-server"
    main = folder / "main.c"
    if dynamic:
        (folder / "ggml.c").write_text(marker)
        main.write_text(_MAIN_C)
        library = folder / "libggml-base.so"
        subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(folder / "ggml.c")],
                       check=True)  # fmt: skip
        link = ["-L", str(folder), "-lggml-base", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"]
        library.chmod(0o644)
    else:
        main.write_text(_MAIN_C + marker)
        link = []
    subprocess.run([gcc, "-o", str(binary), str(main), *link], check=True)
    for source in folder.glob("*.c"):
        source.unlink()
    binary.chmod(0o755)
    return binary
