"""Which runtimes a llama-server build links
(:data:`~batch_invariance.engines.llama_server.env.RUNTIMES`), read from its files: the
variables it can read, and so the ones a server gets and its cert records.

The build is the server binary and llama.cpp's own shared libraries: every ``libggml*``,
``libllama*`` and ``libmtmd*`` file in the binary's folder, its ``../lib`` and ``../lib64`` and
the folders its ELF ``DT_RUNPATH`` / ``DT_RPATH`` name (``$ORIGIN`` expanded), which holds the
ggml backends a ``GGML_BACKEND_DL`` build loads at run time, and every such library a
``DT_NEEDED`` entry names. A runtime is linked when

* a ``DT_NEEDED`` entry of one of those files names its library (``libopenblas.so.0``,
  ``libgomp.so.1``, ``libcudart.so.12`` ...): it is linked dynamically; or
* one of those files carries one of its variable names as a string (``OPENBLAS_...`` where no
  letter, digit or ``_`` comes before it): a library linked statically reads its variables
  with the names in the build's own bytes.

Not known (``None``: every runtime's variables count, as before builds were read) when the
binary is not an ELF file this reader reads (a script, a Mach-O file, a path not here) or a
``DT_NEEDED`` entry names one of llama.cpp's libraries that none of those folders holds: a
build read in part could count too few. The libraries a runtime loads in turn are not read
(a BLAS library's OpenMP runtime: its
:attr:`~batch_invariance.engines.variables.Runtime.brings` says so).

The same libraries, by content, are part of the measured build (:func:`own_libraries`): a
cert records each, and ``serve`` and check-deploy hash them again.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from batch_invariance.engines.base import BuildLibraries
from batch_invariance.engines.llama_server.env import RUNTIMES
from batch_invariance.engines.variables import Linked, Runtime

__all__ = [
    "OWN_LIBRARIES",
    "Dynamic",
    "build_files",
    "is_elf",
    "linked_runtimes",
    "own_libraries",
    "own_library_paths",
    "read_dynamic",
]

#: llama.cpp's own shared libraries (ggml, its backends, llama, the multimodal library).
OWN_LIBRARIES = ("libggml", "libllama", "libmtmd")

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 15, 29
#: Bounds on what a malformed file can make the reader read.
_MAX_HEADERS, _MAX_DYNAMIC, _MAX_STRING = 4096, 1 << 20, 4096


@dataclass(frozen=True)
class Dynamic:
    """What an ELF file's dynamic section asks of the loader (both empty: a static file)."""

    #: ``DT_NEEDED``: the shared libraries it links, by soname.
    needed: tuple[str, ...] = ()
    #: ``DT_RUNPATH`` and ``DT_RPATH``, each as written (``:``-separated folders).
    search: tuple[str, ...] = ()


def read_dynamic(path: Path) -> Dynamic | None:
    """The dynamic section of the ELF file ``path`` (32 or 64 bits, either byte order);
    ``None`` when it is no ELF file or cannot be read."""
    try:
        with path.open("rb") as f:
            return _dynamic(f)
    except (OSError, ValueError, struct.error):
        return None


def _segments(f: BinaryIO) -> tuple[str, list[tuple[int, int, int, int]]] | None:
    """The byte order of an ELF file and its program headers, each ``(type, offset, vaddr,
    filesz)``; ``None`` when it is no ELF file."""
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[5] not in (1, 2):
        return None
    order = "<" if ident[5] == 1 else ">"
    if ident[4] == 2:
        head, ph, pick = "HHIQQQIHHHHHH", "IIQQQQQQ", (0, 2, 3, 5)
    elif ident[4] == 1:
        head, ph, pick = "HHIIIIIHHHHHH", "IIIIIIII", (0, 1, 2, 4)
    else:
        return None
    fields = struct.unpack(order + head, f.read(struct.calcsize(head)))
    phoff, phentsize, phnum = fields[4], fields[8], min(fields[9], _MAX_HEADERS)
    out = []
    for k in range(phnum):
        f.seek(phoff + k * phentsize)
        entry = struct.unpack(order + ph, f.read(struct.calcsize(ph)))
        out.append((entry[pick[0]], entry[pick[1]], entry[pick[2]], entry[pick[3]]))
    return order + ("qQ" if ident[4] == 2 else "iI"), out


def _dynamic(f: BinaryIO) -> Dynamic | None:
    read = _segments(f)
    if read is None:
        return None
    fmt, segments = read
    dynamic = [s for s in segments if s[0] == _PT_DYNAMIC]
    if not dynamic:
        return Dynamic()  # linked statically
    _, offset, _, size = dynamic[0]
    f.seek(offset)
    raw = f.read(min(size, _MAX_DYNAMIC))
    width = struct.calcsize(fmt)
    entries: list[tuple[int, int]] = []
    for k in range(len(raw) // width):
        tag, value = struct.unpack_from(fmt, raw, k * width)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    base = None if strtab is None else _file_offset(segments, strtab)
    if base is None:
        raise ValueError("no string table")

    def string(at: int) -> str:
        f.seek(base + at)
        return f.read(_MAX_STRING).split(b"\0", 1)[0].decode("utf-8", "replace")

    return Dynamic(
        needed=tuple(string(v) for t, v in entries if t == _DT_NEEDED),
        search=tuple(string(v) for t, v in entries if t in (_DT_RUNPATH, _DT_RPATH)),
    )


def _file_offset(segments: Sequence[tuple[int, int, int, int]], address: int) -> int | None:
    """Where the loaded ``address`` sits in the file (the ``PT_LOAD`` segment holding it)."""
    for kind, offset, vaddr, size in segments:
        if kind == _PT_LOAD and vaddr <= address < vaddr + size:
            return offset + address - vaddr
    return None


def _own(name: str) -> bool:
    return name.startswith(OWN_LIBRARIES)


def _folders(binary: Path, search: Sequence[str]) -> list[Path]:
    """Where the build's own libraries may be: beside it, ``../lib``, ``../lib64`` and its
    run paths (``$ORIGIN`` is its folder; a relative entry is left out)."""
    here = binary.parent
    out = [here, here.parent / "lib", here.parent / "lib64"]
    for entry in search:
        for part in entry.split(":"):
            part = part.replace("${ORIGIN}", str(here)).replace("$ORIGIN", str(here))
            if part.startswith("/"):
                out.append(Path(part))
    return list(dict.fromkeys(out))


def is_elf(path: Path) -> bool:
    """Whether ``path`` starts as an ELF file this reader reads (32 or 64 bits, either byte
    order); a script or a file that cannot be read is not."""
    try:
        with path.open("rb") as f:
            ident = f.read(6)
    except OSError:
        return False
    return len(ident) == 6 and ident[:4] == b"\x7fELF" and ident[4] in (1, 2) and ident[5] in (1, 2)


def own_library_paths(binary: Path, search: Sequence[str]) -> list[Path]:
    """Every ``libggml*``, ``libllama*`` and ``libmtmd*`` file where the build of ``binary``
    (resolved; ``search``: its run paths) may load them from, as named there (links not
    followed)."""
    return [
        p
        for folder in _folders(binary, search)
        if folder.is_dir()
        for prefix in OWN_LIBRARIES
        for p in sorted(folder.glob(f"{prefix}*.so*"))
    ]


def build_files(binary: Path) -> dict[Path, Dynamic] | None:
    """The build's files (the binary and llama.cpp's own libraries), each with its dynamic
    section; ``None`` when the build cannot be read whole (see the module)."""
    binary = binary.resolve()
    first = read_dynamic(binary)
    if first is None:
        return None
    folders = _folders(binary, first.search)
    files = {binary: first}
    todo = own_library_paths(binary, first.search)
    needed = list(first.needed)
    while todo or needed:
        if needed:
            soname = needed.pop()
            if not _own(soname):
                continue
            found = next((d / soname for d in folders if (d / soname).exists()), None)
            if found is None:
                return None  # one of the build's libraries is not where it is looked for
            todo.append(found)
            continue
        path = todo.pop().resolve()
        if path in files:
            continue
        dynamic = read_dynamic(path)
        if dynamic is None:
            return None
        files[path] = dynamic
        needed.extend(dynamic.needed)
    return files


def own_libraries(binary: Path, sha256: Callable[[Path], str]) -> BuildLibraries | None:
    """llama.cpp's own libraries the build of ``binary`` can load, each hashed by ``sha256``
    and named by its path relative to the binary's folder as the loader finds it (a link too:
    ``libllama.so.0`` and the file it names). ``None`` when ``binary`` is no ELF file (a
    script loads none of them itself); ``unread`` when a library cannot be hashed (an
    ``OSError``) or the build cannot be read whole (see the module)."""
    if not is_elf(binary):
        return None
    real = binary.resolve()
    first = read_dynamic(real)
    files = build_files(real)
    found = {*own_library_paths(real, first.search if first else ()), *(files or ())} - {real}
    seen: dict[Path, str] = {}  # a file reached by several links is read once
    digests = []
    for name, path in sorted((os.path.relpath(p, real.parent), p) for p in found):
        try:
            if path.resolve() not in seen:
                seen[path.resolve()] = sha256(path)
        except OSError as exc:
            return BuildLibraries(unread=f"llama.cpp library {path} of {binary} cannot be read "
                                         f"({exc.strerror or exc})")  # fmt: skip
        digests.append((name, seen[path.resolve()]))
    if files is None:
        return BuildLibraries(
            unread=f"which llama.cpp libraries {binary} loads cannot be read (one it names is "
            "not beside it, or a libggml/libllama/libmtmd file there is no ELF file; keep the "
            "build's llama.cpp libraries beside it, or link them in)"
        )
    return BuildLibraries(tuple(digests))


#: Bytes that may not come before a variable's name for it to be one (a letter, a digit,
#: ``_``: ``GGML_CUDA_X`` is ggml's, not the CUDA runtime's).
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
#: Bytes that may follow a prefix in a variable's name.
_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def _carries(data: mmap.mmap, prefix: bytes) -> bool:
    """Whether ``data`` holds a name starting with ``prefix`` (the whole word)."""
    at = data.find(prefix)
    while at >= 0:
        end = at + len(prefix)
        if (at == 0 or data[at - 1] not in _WORD) and end < len(data) and data[end] in _NAME:
            return True
        at = data.find(prefix, at + 1)
    return False


def _carried(paths: Iterable[Path], runtimes: Sequence[Runtime]) -> set[str]:
    """The runtimes whose variable names one of ``paths`` carries as a string."""
    found: set[str] = set()
    for path in paths:
        try:
            with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                found |= {
                    r.name
                    for r in runtimes
                    if r.name not in found and any(_carries(m, p.encode()) for p in r.prefixes)
                }
        except (OSError, ValueError):  # an empty file cannot be mapped
            continue
    return found


def _linked(binary: Path) -> Linked:
    files = build_files(binary)
    if files is None:
        return None
    sonames = {s for dynamic in files.values() for s in dynamic.needed}
    dynamic = {r.name for r in RUNTIMES if any(r.linked_as(s) for s in sonames)}
    static = _carried(files, [r for r in RUNTIMES if r.name not in dynamic])
    return frozenset(dynamic | static)


@functools.lru_cache(maxsize=16)
def _linked_once(binary: Path, mtime_ns: int, size: int) -> Linked:
    return _linked(binary)


def linked_runtimes(binary: Path) -> Linked:
    """The runtimes the build of ``binary`` links, by name (see the module); ``None`` when it
    cannot be told. Read once per binary file as it is (path, mtime, size)."""
    try:
        real = binary.resolve()
        stat = real.stat()
    except (OSError, RuntimeError):
        return None
    return _linked_once(real, stat.st_mtime_ns, stat.st_size)
