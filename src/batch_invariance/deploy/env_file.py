"""The closed grammar of an environment file (systemd ``EnvironmentFile=``, compose
``env_file:``): the lines on which systemd's and compose's parsers provably agree.

Each line is empty, a comment (first character ``#`` or ``;``) or ``NAME=VALUE`` with ``NAME``
a shell-style name and ``VALUE`` made only of the characters in :data:`PLAIN_VALUE` (no quotes,
no backslash, no ``$``, no whitespace). Both parsers read such a line as the same pair
(systemd.exec(5), "EnvironmentFile="; the compose specification, "env_file" format). Anything
else (``K = V``, ``export K=V``, quotes, a continuation, ``$X``) is not understood, naming the
line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.deploy.commands import NotUnderstood

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
    """:func:`parse_env_file` of a file; ``None`` when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return parse_env_file(text, shown)
