"""Give the files a root container wrote back to the owner of the folder they are in.

GitHub runs a Docker action as root with the workspace bind-mounted from the runner user's
work directory. Root-owned files left there make the next job's checkout fail on a
self-hosted runner (actions/runner#434). After the run every entry under the folder that root
created or changed since ``since_ns`` is handed to the folder's owner; other file systems
mounted inside (a models folder) and older files are left alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HandBack", "hand_back"]


@dataclass(frozen=True)
class HandBack:
    """How many entries were given back under a folder, and the first failure if any."""

    root: Path
    changed: int
    error: str | None


def hand_back(root: Path, since_ns: int) -> HandBack:
    """Chown what this (root) process wrote under ``root`` since ``since_ns`` to its owner."""
    me = os.geteuid()
    try:
        top = root.stat()
    except OSError as exc:
        return HandBack(root, 0, f"cannot stat {root}: {exc.strerror or exc}")
    if me != 0 or top.st_uid == me:
        return HandBack(root, 0, None)
    changed = 0
    error: str | None = None
    for folder, dirs, files in os.walk(root):
        kept: list[str] = []
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if info.st_dev != top.st_dev:
                continue  # another file system mounted inside: not ours to change
            if name in dirs and not os.path.islink(path):
                kept.append(name)
            fresh = max(info.st_mtime_ns, info.st_ctime_ns) >= since_ns
            if info.st_uid == me and fresh:
                try:
                    os.lchown(path, top.st_uid, top.st_gid)
                    changed += 1
                except OSError as exc:
                    error = error or f"cannot chown {path}: {exc.strerror or exc}"
        dirs[:] = kept
    return HandBack(root, changed, error)
