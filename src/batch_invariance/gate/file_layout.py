"""Who could change a file after it was checked: only its owner may write it, that owner must
be the user running ``serve`` or root, and (where the folders count) no one else may replace
it in a folder above it. ``serve`` holds the files it runs and reads to this rule
(:mod:`batch_invariance.serve.pinned_files`); check-deploy holds a serve line's launcher to it
(:func:`batch_invariance.gate.cells.cell_of`).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import PurePosixPath


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _writable_bits(mode: int) -> str:
    who = [w for w, bit in (("group", stat.S_IWGRP), ("world", stat.S_IWOTH)) if mode & bit]
    return "-".join(who) + "-writable"


def layout_problem(what: str, path: str, st: os.stat_result, *, folders: bool) -> str | None:
    """Why someone else could change the served file ``path`` (``st``: its open descriptor's
    ``fstat``) or, with ``folders``, the folders above it; ``None`` when no one but the user
    running serve and root can."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, me):
        return (
            f"{what} {path} belongs to {_owner(st.st_uid)}, neither you nor root, who could "
            "rewrite it under the running server; copy it to a file of yours or chown it"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{what} {path} is {_writable_bits(mode)} (mode {mode:04o}): others could rewrite it "
            f"under the running server; chmod go-w {path}"
        )
    if not folders:
        return None
    for folder in PurePosixPath(path).parents:
        fst = os.stat(folder)
        fmode = stat.S_IMODE(fst.st_mode)
        if fst.st_uid not in (0, me):
            return (
                f"{what} {path}: folder {folder} belongs to {_owner(fst.st_uid)}, neither you nor "
                f"root, who could replace the {what} or what is read beside it; chown it or "
                "move them to a folder only you and root can write"
            )
        if fmode & (stat.S_IWGRP | stat.S_IWOTH) and not fmode & stat.S_ISVTX:
            return (
                f"{what} {path}: folder {folder} is {_writable_bits(fmode)} without the sticky "
                f"bit (mode {fmode:04o}): others could replace the {what} or what is read "
                f"beside it; chmod go-w {folder}, or move them to a folder only you and root can "
                "write"
            )
    return None
