"""Which shell runs a deploy script, decided as the kernel decides it: by its ``#!`` line (pure).

The kernel reads ``#!``, optional blanks, the interpreter (up to a blank or the line's end)
and at most one argument (the rest of the line, blanks trimmed) (Linux ``binfmt_script``).

* ``#!/bin/bash``, ``#!/usr/bin/bash``, ``#!/usr/bin/env bash``: **bash**;
* ``#!/bin/sh``, ``#!/usr/bin/sh``, ``#!/bin/dash``, ``#!/usr/bin/dash``, ``#!/usr/bin/env sh``,
  ``#!/usr/bin/env dash``: **sh**, read with the grammar on which dash and bash (``/bin/sh``
  is bash on some systems, and ``bash run.sh`` ignores the ``#!`` line) agree: no
  ``source``, no ``&>`` (dash reads ``cmd &> f`` as ``cmd &`` then ``> f``), no
  ``set -o pipefail`` (dash refuses it and exits);
* no ``#!`` line: the kernel refuses to run the file (``ENOEXEC``: systemd's ``ExecStart=``
  and ``execve`` fail, so no server starts); ``bash FILE``, ``sh FILE``, or a shell that
  falls back on ``ENOEXEC`` runs it in bash or sh. It is read with the **sh** grammar, whose
  constructs mean the same in both, so the reading holds whichever of them runs it;
* any other ``#!`` line (an option such as ``#!/bin/bash -a``, ``zsh``, ``python``, ``env -S``)
  is not understood: its meaning is not modelled.

A sourced file is read in the dialect of the script that sources it (its ``#!`` line is only a
comment there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from batch_invariance.deploy.readers.source_bytes import BLANKS

Dialect = Literal["bash", "sh"]

_INTERPRETERS: dict[str, Dialect] = {
    "/bin/bash": "bash", "/usr/bin/bash": "bash",
    "/bin/sh": "sh", "/usr/bin/sh": "sh", "/bin/dash": "sh", "/usr/bin/dash": "sh",
}  # fmt: skip
_ENV = frozenset({"/usr/bin/env", "/bin/env"})
_BY_NAME: dict[str, Dialect] = {"bash": "bash", "sh": "sh", "dash": "sh"}


@dataclass(frozen=True)
class ShellChoice:
    """The dialect a script is read in, or why its ``#!`` line is not understood."""

    dialect: Dialect | None
    #: What the ``#!`` line says (or that there is none), for messages.
    said: str


def _shebang(line: str) -> tuple[str, str]:
    """(interpreter, argument) of a ``#!`` line, split as the kernel splits it."""
    rest = line[2:].lstrip(BLANKS)
    index = 0
    while index < len(rest) and rest[index] not in BLANKS:
        index += 1
    return rest[:index], rest[index:].strip(BLANKS)


def script_dialect(text: str) -> ShellChoice:
    """The dialect of a script from its first line."""
    first = text.split("\n", 1)[0]
    if not first.startswith("#!"):
        return ShellChoice("sh", "no #! line (run by bash or sh)")
    interpreter, argument = _shebang(first)
    if not argument and interpreter in _INTERPRETERS:
        return ShellChoice(_INTERPRETERS[interpreter], first)
    if interpreter in _ENV and argument in _BY_NAME:
        return ShellChoice(_BY_NAME[argument], first)
    return ShellChoice(None, first)


__all__ = ["Dialect", "ShellChoice", "script_dialect"]
