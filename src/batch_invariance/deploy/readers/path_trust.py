"""Whether a path a deploy's programs read will name, when they read it, what the check read
(imperative: ``lstat`` and ``readlink`` only, nothing is opened).

A path is looked up again by every program that opens it. So the check walks it as the kernel
does (each component in turn, each symlink followed from where it points, ``..`` taken on the
real folder, at most 40 links) and refuses, naming the component:

* a **dangling link** (nothing is there now; whoever fills it later decides what is read);
* a link, folder or file that belongs to someone other than root or the user running the check;
* a folder that is group- or world-writable without the sticky bit (anyone in it can rename
  another file over the one checked), or a regular file that is group- or world-writable;
* for a path that **may be absent** (a config file, an optional environment file, a folder on
  ``PATH``), a missing entry whose folder others can write, sticky or not: they could create it.

A missing path that may not be absent (a model, a binary) is left to the caller, which says it
is not here. Devices (``/dev/null``) are only checked for their owner.
"""

from __future__ import annotations

import os
import stat

__all__ = ["TRUST_FIX", "trust_problem"]

#: What to do about a path :func:`trust_problem` refuses.
TRUST_FIX = (
    "point the deploy at the real file (no dangling link), owned by you or root, in folders "
    "only you and root can write (chmod go-w)"
)

_MAX_LINKS = 40
_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _owner_problem(entry: str, st: os.stat_result, kind: str) -> str | None:
    if st.st_uid in (0, os.geteuid()):
        return None
    return f"{kind} {entry} belongs to uid {st.st_uid}, neither you nor root"


def _entry_problem(entry: str, st: os.stat_result) -> str | None:
    """Why someone else could change ``entry`` (its ``lstat``), or ``None``."""
    mode = st.st_mode
    kind = "link" if stat.S_ISLNK(mode) else "folder" if stat.S_ISDIR(mode) else "file"
    problem = _owner_problem(entry, st, kind)
    if problem is not None:
        return problem
    bits = stat.S_IMODE(mode)
    if stat.S_ISDIR(mode) and bits & _OTHERS and not bits & stat.S_ISVTX:
        return f"folder {entry} is writable by others (mode {bits:04o}, no sticky bit)"
    if stat.S_ISREG(mode) and bits & _OTHERS:
        return f"file {entry} is writable by others (mode {bits:04o})"
    return None


def _components(path: str, origin: str | None) -> list[tuple[str, str | None]]:
    """The names of ``path`` (empty ones and ``.`` dropped), each tagged with the link whose
    target it came from (``None``: the path as written)."""
    return [(name, origin) for name in path.split("/") if name not in ("", ".")]


def _absent(what: str, path: str, folder: str, link: str | None, may_be_absent: bool) -> str | None:
    if link is not None:
        return (
            f"{what} {path}: {link} is a dangling link (it points to nothing now; what is read "
            "there is decided after the check)"
        )
    if not may_be_absent:
        return None  # the caller says it is not here
    bits = stat.S_IMODE(os.stat(folder).st_mode)
    if bits & _OTHERS:
        return (
            f"{what} {path} does not exist and folder {folder} is writable by others "
            f"(mode {bits:04o}): anyone could create it after the check"
        )
    return None


def trust_problem(what: str, path: str, *, may_be_absent: bool = False) -> str | None:
    """Why ``path`` (absolute, or relative to this process's folder) may not name what the
    check read when a deploy's program opens it; ``None`` when it will."""
    start = path if path.startswith("/") else os.path.join(os.getcwd(), path)
    todo = _components(start, None)
    current = "/"
    problem = _entry_problem("/", os.lstat("/"))
    links = 0
    while todo and problem is None:
        name, link = todo.pop(0)
        if name == "..":
            current = os.path.dirname(current)  # the real parent: current has no links
            continue
        entry = os.path.join(current, name)
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            return _absent(what, path, current, link, may_be_absent)
        except OSError as exc:
            return f"{what} {path}: {entry} cannot be looked up ({exc.strerror or exc})"
        problem = _entry_problem(entry, st)
        if stat.S_ISLNK(st.st_mode) and problem is None:
            links += 1
            if links > _MAX_LINKS:
                return f"{what} {path}: more than {_MAX_LINKS} links (a loop)"
            target = os.readlink(entry)
            todo = _components(target, entry) + todo
            current = "/" if target.startswith("/") else current
        elif todo and not stat.S_ISDIR(st.st_mode) and problem is None:
            return f"{what} {path}: {entry} is not a folder"
        else:
            current = entry
    return None if problem is None else f"{what} {path}: {problem}"
