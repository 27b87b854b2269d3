"""Files a deploy script writes, against every path it or its servers read (pure, except
:func:`os.path.realpath`, which looks at the links there now).

The grammar writes files in two ways only: output redirections (``echo x >> a.log``,
``exec >> a.log 2>&1``, a launch's ``> a.log``) to a ``.log`` file, and ``mkdir -p`` (folders).
It has no ``cp``, ``ln``, ``curl``, ``tee`` or ``dd``: a download, a copy or a link is a
program outside the grammar. A write is *not understood* when anything of the deploy can read
the path written, before or after the write (a restarted service reruns the script over what
the last run left):

* a file the script sources (``. FILE``);
* any path a server's argv or environment names (each word, and each piece of it between
  ``=``, ``:`` and ``,``, so ``--model=/x``, ``LD_LIBRARY_PATH=/a:/b`` and lists count), the
  program itself (for a bare name, that name in each ``PATH`` folder), the config files
  llama-server reads;
* a written path that is a link now, or under one (where it lands is decided by the link,
  not by the words the reader compared); a relative write in a folder the reader could not
  follow is refused where it is written (:mod:`batch_invariance.deploy.readers.shell`).

A relative path a server names in a folder the reader could not follow is compared by its
last name: ``-m x.log`` there could be any ``x.log``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from batch_invariance.deploy.readers.commands import NotUnderstood, ServerCommand
from batch_invariance.engines.llama_server.env import config_files

__all__ = ["Access", "write_problems"]

_SEPARATOR = re.compile("[=:,]")


@dataclass(frozen=True)
class Access:
    """A path the script writes or sources, absolute, with where it says so."""

    path: str
    file: str
    line: int
    #: ``output`` (a redirection), ``folder`` (``mkdir -p``) or ``source`` (``. FILE``).
    kind: Literal["output", "folder", "source"]


def _pieces(word: str) -> list[str]:
    """``word`` and each piece of it between ``=``, ``:`` and ``,`` (split at those only)."""
    return [word, *(p for p in _SEPARATOR.split(word) if p and p != word)]


def _server_reads(command: ServerCommand, home: str | None) -> tuple[set[str], set[str]]:
    """(absolute paths, last names of relative paths in an unknown folder) the server reads."""
    absolute: set[str] = set()
    names: set[str] = set()
    words = [*command.argv, *command.env.values(), *config_files(command.env, home)]
    program = command.argv[0] if command.argv else ""
    if program and "/" not in program and command.search_path:
        words += [os.path.join(folder, program) for folder in command.search_path.split(":")]
    for piece in (p for word in words for p in _pieces(word)):
        if piece.startswith("/"):
            absolute.add(os.path.normpath(piece))
        elif command.base_dir is not None:
            absolute.add(os.path.normpath(os.path.join(command.base_dir, piece)))
        else:
            names.add(os.path.basename(piece))
    return absolute, names


class _Reads:
    """Paths read, by where they land now (``os.path.realpath``, looked up once per path), each
    with the first reader that reads it: a write is compared with a dictionary look-up, not
    with every read (writes times reads was work the deploy's size does not show)."""

    def __init__(self, real: dict[str, str]) -> None:
        #: Each path's ``realpath`` (shared: each path is looked up once in all).
        self.real = real
        self.by_real: dict[str, tuple[int, str]] = {}
        self.by_name: dict[str, int] = {}

    def realpath(self, path: str) -> str:
        if path not in self.real:
            self.real[path] = os.path.realpath(path)
        return self.real[path]

    def add(self, reader: int, paths: Iterable[str], names: Iterable[str] = ()) -> None:
        for path in paths:
            self.by_real.setdefault(self.realpath(path), (reader, path))
        for name in names:
            self.by_name.setdefault(name, reader)

    def hit(self, written: str) -> tuple[int, str] | None:
        """The first reader of ``written`` (the same path, or one landing where it lands; else
        a relative path of the same last name) and the path it reads."""
        found = self.by_real.get(self.realpath(written))
        name = os.path.basename(written)
        reader = self.by_name.get(name)
        if reader is not None and (found is None or reader < found[0]):
            return reader, name
        return found


def _problem(access: Access, construct: str) -> NotUnderstood:
    what = "output written to" if access.kind == "output" else "mkdir -p"
    return NotUnderstood(
        access.file,
        access.line,
        f"{what} {access.path}, {construct} (what the check read there is not what runs)",
        "write logs to a path nothing of the deploy reads (not a link), or /dev/null",
    )


def write_problems(
    written: Sequence[Access],
    sourced: Sequence[Access],
    commands: Sequence[ServerCommand],
    home: str | None,
) -> list[NotUnderstood]:
    """Each write of the script that something of the deploy can read (or that lands through a
    link), named at its line."""
    bad: list[NotUnderstood] = []
    looked_up: dict[str, str] = {}
    sources, servers = _Reads(looked_up), _Reads(looked_up)
    sources.add(0, (s.path for s in sourced))
    for index, command in enumerate(commands):
        servers.add(index, *_server_reads(command, home))
    for access in written:
        real = sources.realpath(access.path)
        if real != os.path.normpath(access.path):
            bad.append(_problem(access, f"which is a link to {real} or under one"))
            continue
        source = sources.by_real.get(real)
        if source is not None:
            bad.append(_problem(access, f"which the script sources ({source[1]})"))
            continue
        hit = servers.hit(access.path)
        if hit is not None:
            origin = commands[hit[0]].origin
            bad.append(_problem(access, f"which {origin} reads ({hit[1]})"))
    return bad
