"""The files ``serve`` runs, pinned: each opened once, hashed through its descriptor, and handed
on as that descriptor, so what runs is the bytes that were hashed, whatever happens to the path.

A path names whatever is there when it is next opened: a file renamed over it, or a symlink
flipped, between the hash and the server's own open would run bytes nobody measured. A
descriptor names one inode. ``serve`` hashes the open file, execs the binary from its
descriptor (``/proc/self/fd/N``: what ``fexecve`` does on Linux) and passes the model as
``-m /proc/self/fd/M``; llama-server opens (and maps) that, which is the same inode.

A descriptor does not stop a rewrite of the inode itself, so the file must not be writable by
anyone but its owner, and that owner must be the user running ``serve`` or root. The binary's
folders must be writable by no one else either: a build that links its libraries or loads
its backends dynamically finds them by path in that folder after the exec. The model's
folders are not checked: llama-server never opens the model by its path (docs/deploy.md).

:func:`pin_served_files` pins the two files a cert fingerprints, the server binary and the
model its argv runs, against the sha256 the cert recorded. llama.cpp's own libraries the
binary loads from beside it (``libllama``, ``libggml*`` and ggml's run-time backends,
``libmtmd``) are loaded by path after the exec: each is hashed at start, held to the same
rule of who may write it and its folders, and must be one the cert recorded with that sha256
(:func:`~batch_invariance.gate.identity.library_differences`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.cert.provenance import Provenance
from batch_invariance.engines.base import BuildLibraries
from batch_invariance.engines.llama_server.flags import read_flags
from batch_invariance.engines.llama_server.linked import own_libraries
from batch_invariance.errors import NotCovered, UsageError
from batch_invariance.gate.file_layout import layout_problem
from batch_invariance.gate.identity import library_differences

__all__ = [
    "FileLayoutRefused",
    "PinnedFile",
    "ServedFiles",
    "fd_path",
    "pin",
    "pin_files",
    "pin_served_files",
    "refuse_changeable",
    "refuse_split_model",
    "refuse_unpinned_reads",
    "require_measured",
    "sha256_fd",
]

_BLOCK = 1 << 20


class FileLayoutRefused(UsageError):
    """Someone other than the user running ``serve`` (or root) could change a served file."""


def fd_path(fd: int) -> str:
    """The path by which the process holding ``fd`` (and its exec'd image) reopens that file."""
    return f"/proc/self/fd/{fd}"


@dataclass(frozen=True)
class PinnedFile:
    """A served file, open: ``path`` as the argv names it, ``resolved`` (symlinks followed
    when it was opened), the descriptor, and the sha256 read through that descriptor."""

    what: str
    path: str
    resolved: str
    fd: int
    sha256: str

    @property
    def fd_path(self) -> str:
        return fd_path(self.fd)


def sha256_fd(fd: int) -> str:
    """The hex sha256 of the open file ``fd``, read from offset 0 without moving its offset."""
    digest = hashlib.sha256()
    offset = 0
    while True:
        block = os.pread(fd, _BLOCK, offset)
        if not block:
            return digest.hexdigest()
        digest.update(block)
        offset += len(block)


def _open_checked(what: str, path: str, *, folders: bool) -> tuple[str, int]:
    """``path`` resolved and opened once, refused unless it is a regular file that only the
    user running serve and root can change (with ``folders``, the folders above it too)."""
    resolved = os.path.realpath(path)
    try:
        # O_NOFOLLOW: a link slipped in after resolving is refused, not followed. O_NONBLOCK:
        # a FIFO put there does not hang serve (it is refused below as not a regular file).
        fd = os.open(resolved, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise NotCovered(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotCovered(f"{what} {path} is not a regular file")
        os.set_blocking(fd, True)
        problem = layout_problem(what, resolved, st, folders=folders)
        if problem is not None:
            raise FileLayoutRefused(problem)
    except BaseException:
        os.close(fd)
        raise
    return resolved, fd


def refuse_changeable(what: str, path: str) -> None:
    """Refuse a file serve reads (a cert, its bundle) that others could change or swap: the
    file and every folder above it writable by you and root only."""
    os.close(_open_checked(what, path, folders=True)[1])


def pin(what: str, path: str, *, folders: bool) -> PinnedFile:
    """Open ``path`` once (symlinks resolved now; a later flip of a link does not matter, the
    descriptor is what runs), refuse it if others could change it, and hash it through the
    descriptor. The descriptor is close-on-exec until the caller hands it on."""
    resolved, fd = _open_checked(what, path, folders=folders)
    try:
        digest = sha256_fd(fd)
    except OSError as exc:
        os.close(fd)
        raise NotCovered(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    return PinnedFile(what, path, resolved, fd, digest)


#: Options whose value is a file the cert does not fingerprint: serve cannot check them.
_UNCHECKED_FILES = frozenset(
    {"--spec-draft-model", "--lora", "--lora-scaled", "--control-vector",
     "--control-vector-scaled", "--mmproj", "--grammar-file", "--json-schema-file",
     "--chat-template-file", "--lookup-cache-static", "--lookup-cache-dynamic"}
)  # fmt: skip


@dataclass(frozen=True)
class ServedFiles:
    """The binary and the model the argv runs, open and hashed through their descriptors, and
    llama.cpp's libraries the binary loads, hashed (``None``: no ELF file, it loads none)."""

    binary: PinnedFile
    model: PinnedFile
    libraries: BuildLibraries | None

    @property
    def pinned(self) -> tuple[PinnedFile, PinnedFile]:
        return (self.binary, self.model)

    def close(self) -> None:
        for pinned in self.pinned:
            os.close(pinned.fd)


def _library_sha256(path: Path) -> str:
    """A library's sha256, read as the binary is, refused where others could change it or its
    folders (the server loads it by path after the exec)."""
    pinned = pin("llama.cpp library", str(path), folders=True)
    os.close(pinned.fd)
    return pinned.sha256


def pin_files(binary: str, model: str) -> ServedFiles:
    """Open the server binary (its folders checked too: a build that links or loads libraries
    finds them there) and the model, once each, and hash them through those descriptors; hash
    llama.cpp's libraries the binary loads."""
    pinned = pin("server binary", binary, folders=True)
    try:
        libraries = own_libraries(Path(pinned.resolved), _library_sha256)
        return ServedFiles(pinned, pin("model", model, folders=False), libraries)
    except BaseException:
        os.close(pinned.fd)
        raise


def require_measured(files: ServedFiles, provenance: Provenance) -> None:
    """The bytes read through the descriptors, and llama.cpp's libraries, are the ones the
    cert measured."""
    recorded = (provenance.server_binary, provenance.model_file)
    for found, measured in zip(files.pinned, recorded, strict=True):
        sha256 = measured.sha256 if measured is not None else None
        if not sha256:
            raise NotCovered(f"the cert records no {found.what} sha256: serve cannot check it")
        if found.sha256 != sha256:
            raise NotCovered(
                f"{found.what} {found.path} has sha256 {found.sha256[:12]}..., the cert measured "
                f"{sha256[:12]}...: not the measured cell"
            )
    problems = library_differences(files.libraries, provenance.server_binary)
    if problems:
        raise NotCovered(problems[0])


def refuse_unpinned_reads(argv: Sequence[str]) -> None:
    """An argv that loads a file the cert does not fingerprint cannot be served."""
    flags = read_flags(argv, first_is_binary=True)
    unchecked = sorted({o.written for o in flags.options if o.canonical in _UNCHECKED_FILES})
    if unchecked:
        raise NotCovered(f"the measured argv loads {', '.join(unchecked)}, whose files the "
                         "cert does not fingerprint; serve cannot check them")  # fmt: skip


def refuse_split_model(model: PinnedFile) -> None:
    """A split GGUF names its other files only by their names beside the first one, which
    llama-server opens by path after the hash: those bytes would not be the pinned ones."""
    from batch_invariance.host.gguf import read_metadata

    _, meta = read_metadata(model.fd_path)
    count = meta.get("split.count")
    if isinstance(count, int) and count > 1:
        raise NotCovered(
            f"model {model.path} is split into {count} files, which llama-server opens by name "
            "after serve hashed the first: serve cannot pin them; merge them into one file "
            "(llama-gguf-split --merge) and measure that"
        )


def pin_served_files(argv: Sequence[str], provenance: Provenance) -> ServedFiles:
    """Open the binary and model the argv runs, once, and require the bytes read through those
    descriptors to be the ones the cert measured (the descriptors are what later runs)."""
    refuse_unpinned_reads(argv)
    model = read_flags(argv, first_is_binary=True).model
    if model is None:
        raise NotCovered("the measured argv names no --model: serve cannot check it")
    files = pin_files(argv[0], model)
    try:
        require_measured(files, provenance)
        refuse_split_model(files.model)
    except BaseException:
        files.close()
        raise
    return files
