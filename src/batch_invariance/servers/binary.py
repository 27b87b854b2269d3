"""What binary ran: :func:`identify_binary` records a server binary's sha256 and ``--version``
for the cert, before the cell starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.host.file_hash import sha256_file

__all__ = ["BinaryIdentity", "identify_binary"]


@dataclass(frozen=True)
class BinaryIdentity:
    """What the cert records about the server binary."""

    path: str
    sha256: str
    version: str
    version_rc: int | None


def identify_binary(server_bin: Path, timeout_s: float = 15.0) -> BinaryIdentity:
    """sha256 and ``--version`` of a server binary.

    A failing ``--version`` is recorded, not raised: the launch itself reports a broken binary
    with its log tail.
    """
    digest = sha256_file(server_bin)
    try:
        # Own process group: a --version that hangs is killed with everything it spawned,
        # and nothing outside that group is touched.
        proc = subprocess.Popen(
            [str(server_bin), "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return BinaryIdentity(
            path=str(server_bin),
            sha256=digest,
            version=f"(--version failed: {exc})",
            version_rc=None,
        )
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        version, rc = f"(--version did not finish within {timeout_s:g} s)", None
    else:
        text = (text or "").strip()
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip().startswith(("version", "built"))
        ]
        version = " ; ".join(lines) if lines else text[-300:]
        rc = proc.returncode
    return BinaryIdentity(path=str(server_bin), sha256=digest, version=version, version_rc=rc)
