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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from batch_invariance.deploy.readers.commands import NotUnderstood, ServerCommand
from batch_invariance.engines.llama_server.env import config_files

__all__ = ["Access", "write_problems"]

_SEPARATORS = "=:,"


@dataclass(frozen=True)
class Access:
    """A path the script writes or sources, absolute, with where it says so."""

    path: str
    file: str
    line: int
    #: ``output`` (a redirection), ``folder`` (``mkdir -p``) or ``source`` (``. FILE``).
    kind: Literal["output", "folder", "source"]


def _pieces(word: str) -> list[str]:
    """``word`` and each piece of it between ``=``, ``:`` and ``,`` (no Python split)."""
    out, current = [word], ""
    for char in word + _SEPARATORS[0]:
        if char in _SEPARATORS:
            if current and current != word:
                out.append(current)
            current = ""
        else:
            current += char
    return out


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


def _same(written: str, reads: Iterable[str]) -> str | None:
    real = os.path.realpath(written)
    for read in reads:
        if read == written or os.path.realpath(read) == real:
            return read
    return None


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
    reads = [(_server_reads(c, home), c) for c in commands]
    for access in written:
        real = os.path.realpath(access.path)
        if real != os.path.normpath(access.path):
            bad.append(_problem(access, f"which is a link to {real} or under one"))
            continue
        hit = _same(access.path, (s.path for s in sourced))
        if hit is not None:
            bad.append(_problem(access, f"which the script sources ({hit})"))
            continue
        for (absolute, names), command in reads:
            hit = _same(access.path, absolute)
            if hit is None and os.path.basename(access.path) in names:
                hit = os.path.basename(access.path)
            if hit is not None:
                bad.append(_problem(access, f"which {command.origin} reads ({hit})"))
                break
    return bad
