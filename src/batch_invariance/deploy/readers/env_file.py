"""The closed grammar of an environment file (systemd ``EnvironmentFile=``, compose
``env_file:``): the lines on which systemd's and compose's parsers provably agree.

Each line is empty, a comment (first character ``#`` or ``;``) or ``NAME=VALUE`` with ``NAME``
a shell-style name and ``VALUE`` made only of the characters in :data:`PLAIN_VALUE` (no quotes,
no backslash, no ``$``, no whitespace). Both parsers read such a line as the same pair
(systemd.exec(5), "EnvironmentFile="; the compose specification, "env_file" format). Anything
else (``K = V``, ``export K=V``, quotes, a continuation, ``$X``) is not understood, naming the
line. The file's bytes are checked first (:mod:`batch_invariance.deploy.readers.source_bytes`:
printable ASCII, tab, newline).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.deploy.readers.commands import NotUnderstood
from batch_invariance.deploy.readers.source_bytes import read_source, text_problem

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Characters a value may hold unquoted in every format this package reads.
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:,@%+=-]*")
_FIX = "write plain NAME=VALUE lines (no spaces, quotes, $ or backslashes)"


@dataclass(frozen=True)
class EnvFile:
    values: dict[str, str]
    not_understood: tuple[NotUnderstood, ...]


def parse_env_file(text: str, shown: str) -> EnvFile:
    """The assignments of an environment file, or the lines outside its grammar."""
    values: dict[str, str] = {}
    problem = text_problem(text, shown)
    if problem is not None:  # bytes the parsers split or strip otherwise than Python
        return EnvFile({}, (problem,))
    bad: list[NotUnderstood] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line == "" or line.startswith(("#", ";")):
            continue
        name, eq, value = line.partition("=")
        if not eq or not NAME.fullmatch(name):
            bad.append(NotUnderstood(shown, number, f"environment line {line[:60]!r}", _FIX))
        elif not PLAIN_VALUE.fullmatch(value):
            bad.append(NotUnderstood(shown, number, f"value of {name} {value[:60]!r}", _FIX))
        else:
            values[name] = value
    return EnvFile(values, tuple(bad))


def read_env_file(path: Path, shown: str) -> EnvFile | None:
    """:func:`parse_env_file` of a file (its bytes checked first); ``None`` when it cannot
    be read."""
    text = read_source(path, shown)
    if text is None:
        return None
    if isinstance(text, NotUnderstood):
        return EnvFile({}, (text,))
    return parse_env_file(text, shown)
