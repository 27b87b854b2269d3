"""A deploy file's bytes, checked before anything reads them, and the bounds on a reader's work.

Shells and systemd split words on a few ASCII bytes, Python on many more (U+00A0, ``\\v``, ...):
a file may hold only :data:`ALLOWED`; any other byte is *not understood* at its line and column.
A construct whose work the file's size does not show (YAML nested thousands deep, thousands
of servers or variables) is *not understood* past a bound here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batch_invariance.gate.server_command import NotUnderstood

#: The bytes a deploy file may hold: printable ASCII (0x20..0x7e), tab and newline.
ALLOWED = frozenset({0x09, 0x0A, *range(0x20, 0x7F)})
#: Any byte outside :data:`ALLOWED` (found in C: no Python loop over a file's bytes).
_DISALLOWED = re.compile(rb"[^\t\n\x20-\x7e]")
#: Blanks between words: bash's and dash's (``<blank>``), and systemd's ``WHITESPACE`` within
#: a line (its CR is outside :data:`ALLOWED`, its newline ends the line).
BLANKS = " \t"
#: The most servers one deploy file may start, the most words (argv words and environment
#: variables) and characters their command lines and environments hold in all: the gate checks
#: each server's cell, every word of it, and a variable exported once reaches every server.
MAX_SERVERS = 64
MAX_SERVER_WORDS = 65_536
MAX_SERVER_CHARS = 4 * 1024 * 1024
#: The deepest a YAML document may nest collections: PyYAML's composer recurses per level.
MAX_NESTING = 64
#: What a message says of a bound crossed.
BOUND = "a bound on the work of the check"
_FIX = "write the file in plain ASCII with LF line ends (no CR, NUL, control or non-ASCII bytes)"
_NAMES = {0x00: "NUL", 0x0B: "VT", 0x0C: "FF", 0x0D: "CR", 0x7F: "DEL"}


@dataclass
class ServerBudget:
    """The servers a deploy file starts, counted as each is read (:data:`MAX_SERVERS`,
    :data:`MAX_SERVER_WORDS`, :data:`MAX_SERVER_CHARS`)."""

    servers: int = 0
    words: int = 0
    chars: int = 0

    def spend(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """The bound crossed with this server, said as a construct (``None``: none)."""
        self.servers += 1
        self.words += len(argv) + len(env)
        self.chars += sum(map(len, argv)) + sum(len(k) + len(v) + 1 for k, v in env.items())
        if self.servers > MAX_SERVERS:
            return f"a server beyond the {MAX_SERVERS} one deploy may start ({BOUND})"
        if self.words > MAX_SERVER_WORDS or self.chars > MAX_SERVER_CHARS:
            return (
                f"servers whose command lines and environments hold more than "
                f"{MAX_SERVER_WORDS} words or {MAX_SERVER_CHARS} characters in all ({BOUND})"
            )
        return None


#: What to write instead of a deploy past :class:`ServerBudget`.
BUDGET_FIX = "start fewer servers from one file, with only the variables they need"


def _name(byte: int) -> str:
    if byte in _NAMES:
        return f"a {_NAMES[byte]} byte (0x{byte:02x})"
    if byte < 0x20:
        return f"a control byte 0x{byte:02x}"
    return f"a non-ASCII byte 0x{byte:02x}"


def byte_problem(data: bytes, shown: str) -> NotUnderstood | None:
    """The first byte outside :data:`ALLOWED`, named with its line and byte offset."""
    found = _DISALLOWED.search(data)
    if found is None:
        return None
    offset = found.start()
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return NotUnderstood(
        shown,
        line,
        f"{_name(data[offset])} at byte offset {offset} (column {column}); the reader takes "
        "only printable ASCII, tab and newline, so it cannot split this line as the program "
        "does",
        _FIX,
    )


def decode(data: bytes, shown: str) -> str | NotUnderstood:
    """The file as text when every byte is in :data:`ALLOWED`, else what is not."""
    problem = byte_problem(data, shown)
    return data.decode("ascii") if problem is None else problem


def text_problem(text: str, shown: str) -> NotUnderstood | None:
    """:func:`byte_problem` of text already decoded (a pure reader's input)."""
    return byte_problem(text.encode("utf-8", "surrogateescape"), shown)


def read_source(path: Path, shown: str) -> str | NotUnderstood | None:
    """A file's text through :func:`decode`; ``None`` when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode(data, shown)
