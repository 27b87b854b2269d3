"""Can a mounted llama-server binary run in this image at all? (``ldd`` before the run.)

A server built on the runner host links against the host's glibc, libstdc++, CUDA runtime and
(for a shared build) its own libggml/libllama. When the image lacks one, the server dies at
exec time with a loader message deep in a log. The preflight asks the dynamic loader first and
turns every gap into one line: what is missing and what to do about it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.errors import UsageError

__all__ = ["LinkGaps", "check_binary", "gap_message", "image_libc", "parse_ldd"]

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")
_VERSION = re.compile(r"version [`'](\S+)' not found \(required by")


@dataclass(frozen=True)
class LinkGaps:
    """What the dynamic loader could not satisfy for a binary."""

    libraries: tuple[str, ...]
    versions: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.libraries and not self.versions


def parse_ldd(output: str) -> LinkGaps:
    """Missing libraries (``libx.so => not found``) and symbol versions (``GLIBC_2.38``)."""
    libraries: list[str] = []
    versions: list[str] = []
    for line in output.splitlines():
        lib = _NOT_FOUND.match(line)
        if lib and lib.group(1) not in libraries:
            libraries.append(lib.group(1))
        for version in _VERSION.findall(line):
            if version not in versions:
                versions.append(version)
    return LinkGaps(libraries=tuple(libraries), versions=tuple(versions))


def gap_message(binary: Path, gaps: LinkGaps, libc: str) -> str:
    """One line: what is missing for ``binary`` in an image with ``libc``, and what to do."""
    missing = ", ".join([*gaps.libraries, *gaps.versions])
    todo: list[str] = []
    if gaps.libraries:
        todo.append(
            "link llama.cpp's own libraries in (cmake -DBUILD_SHARED_LIBS=OFF, as "
            "`batch-invariance provision` does) and build the image on a base that has the "
            "rest (a CUDA 13 server needs a CUDA 13 runtime base)"
        )
    if gaps.versions:
        todo.append(
            f"build llama-server on a host whose glibc/libstdc++ is not newer than the "
            f"image's ({libc}) or rebuild the image on a newer base"
        )
    return (
        f"llama-server {binary} cannot run in this image ({libc}): missing {missing}; "
        f"{' and '.join(todo)} (docker build --build-arg BASE_IMAGE=..., see docs/action.md)"
    )


def image_libc() -> str:
    """The image's C library, e.g. ``glibc 2.36``."""
    import os

    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown libc"
    except (ValueError, OSError):
        return "unknown libc"


def check_binary(binary: Path) -> None:
    """Raise UsageError (one line) when ``binary`` needs something this system lacks.

    A missing file is left to the run itself (it reports that); a static binary ("not a
    dynamic executable") or a system without ``ldd`` passes.
    """
    if not binary.is_file():
        return
    try:
        proc = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    gaps = parse_ldd(proc.stdout + "\n" + proc.stderr)
    if not gaps.ok:
        raise UsageError(gap_message(binary, gaps, image_libc()))
