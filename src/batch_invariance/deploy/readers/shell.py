"""Reading a deploy shell script (pure): a short allowlist of line forms, anything else refused.

Not a shell imitation: ``batch-invariance serve`` proves the cell at start, so the script only
has to start serve once, in the foreground, as the one thing that runs. Each logical line (a
``\\`` at a line's end continues it) is a ``#!`` first line naming sh or bash, a comment or
empty; ``set -e|-u|-x|-o errexit|nounset|xtrace|pipefail``; ``NAME=WORD ...`` or ``export
NAME[=WORD] ...``; ``ulimit``, ``umask``, ``echo``, ``printf``, ``true``, ``:`` or ``cd
/ABSOLUTE``; or the launch, once: ``[NAME=WORD ...] [exec] PROGRAM ARGS [REDIRECTIONS]``,
PROGRAM being serve or a server (read to name its cell; a server started directly is never a
pass). Nothing after an ``exec`` runs, so nothing after it is read.

Words are plain characters, ``'...'`` and ``"..."``: the serve line is written out, so no ``$``
is expanded (any ``$`` outside single quotes is refused). Operators, command substitution,
globs, ``~``, backslashes and any other program are refused with the line. Redirections read
a file (``<``) or write a ``.log`` file, ``/dev/null``, ``/dev/stdout``, ``/dev/stderr`` or a
descriptor: nothing serve's Python reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from batch_invariance.deploy.readers.source_bytes import BUDGET_FIX, ServerBudget, text_problem
from batch_invariance.gate.serve_line import is_serve
from batch_invariance.gate.server_command import DeployRead, NotUnderstood, ServerCommand

_SHEBANG = re.compile(r"#![ \t]*(/usr)?/bin/(env[ \t]+)?(ba)?sh[ \t]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./#-]+")
_REDIRECT = re.compile(r"[0-9]?(>>?|<)(&[0-9]|[A-Za-z0-9_@%+=:,./-]+)?")
_PIECES = re.compile(r"""'[^']*'|"[^"]*"|[^'"]+|['"]""")
_LOG_TARGET = re.compile(r"&[0-9]|/dev/(null|stdout|stderr)|[^\0]*\.log")
_SET_WORD = re.compile(r"[-+][eux]+")
_SET_OPTIONS = frozenset({"errexit", "nounset", "xtrace", "pipefail"})
_HARMLESS = frozenset({"ulimit", "umask", "echo", "printf", "true", ":"})
#: Variables that change how the shell itself splits, finds or runs what follows.
_SHELL_VARIABLES = frozenset(
    {"IFS", "CDPATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "GLOBIGNORE",
     "POSIXLY_CORRECT", "BASH_XTRACEFD", "PS4", "EXECIGNORE", "BASH_COMPAT"}
)  # fmt: skip
_FIX = "keep the script to the lines of docs/deploy.md: one exec batch-invariance serve line"


class Refused(Exception):
    """A line outside the allowlist: the construct, named."""


def starts_server(argv: Sequence[str]) -> bool:
    """``argv`` runs llama-server or ``batch-invariance serve`` (by name; what the program is
    is checked by content elsewhere)."""
    program = PurePosixPath(argv[0]).name if argv else ""
    return program.startswith("llama-server") or is_serve(argv)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, ``\\``-newline joined in one pass. A
    backslash at the end of a line with a quote open or a ``#`` is not joined: a comment's
    continues nothing, and in quotes the shells keep or join it by quote kind (that line then
    holds an open quote and is refused)."""
    out: list[tuple[int, str]] = []
    pieces: list[str] = []
    start = quotes = 0
    for number, line in enumerate(text.split("\n"), 1):
        if not pieces:
            start, quotes = number, 0
        quotes += line.count("'") + line.count('"')
        joins = quotes % 2 == 0 and "#" not in line  # a comment's backslash continues nothing
        if joins and line.endswith("\\") and not line.endswith("\\\\"):
            pieces.append(line[:-1])
            continue
        pieces.append(line)
        out.append((start, "".join(pieces)))
        pieces = []
    return out


@dataclass
class _Script:
    variables: dict[str, str] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    cwd: Path | None = None

    def assign(self, name: str, value: str) -> None:
        if name in _SHELL_VARIABLES:
            raise Refused(f"{name}= (it changes how the shell reads or runs what follows)")
        if name != name.lower() and name not in self.exported:
            # The caller's environment would decide whether the server gets it.
            raise Refused(f"{name} assigned without export (write export {name}=..., or a "
                          "lowercase name for a variable of the script only)")  # fmt: skip
        self.variables[name] = value


def _piece(piece: str) -> str:
    """One quoted or unquoted piece of a word, quotes removed, or :class:`Refused`."""
    if piece in ("'", '"'):
        raise Refused("an unterminated quote")
    if piece.startswith("'"):
        return piece[1:-1]
    quoted = piece.startswith('"')
    body = piece[1:-1] if quoted else piece
    if "$" in body:  # the serve line is written out: nothing to expand, nothing to follow
        raise Refused(f"{piece[:40]} (a $ expansion; write the value out)")
    if "`" in body or "\\" in body:
        raise Refused(f"{piece[:40]} (command substitution or backslash)")
    if not quoted and not _PLAIN.fullmatch(body):
        raise Refused(f"{piece[:40]} (an operator, glob or ~)")
    return body


def split_words(line: str) -> list[str]:
    """A line's words, quotes removed and redirections dropped, or :class:`Refused`."""
    words: list[str] = []
    tokens = re.findall(r"""(?:[^ \t'"]+|'[^']*'|"[^"]*")+|['"]""", line)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token.startswith("#"):
            break
        redirect = _REDIRECT.fullmatch(token)
        if redirect is None:
            words.append("".join(_piece(p) for p in _PIECES.findall(token)))
            continue
        target = redirect.group(2)
        if target is None:  # the target is the next word
            if index == len(tokens):
                raise Refused(f"{token} with no target")
            target = "".join(_piece(p) for p in _PIECES.findall(tokens[index]))
            index += 1
        if redirect.group(1) != "<" and not _LOG_TARGET.fullmatch(target):
            # a written file could be one serve's Python or the loader reads (a .pth file)
            raise Refused(f"output to {target[:60]} (only a .log file, /dev/null or a descriptor)")
    return words


def _statement(words: list[str], script: _Script) -> tuple[dict[str, str], list[str]] | None:
    """The prefix assignments and words of a launch line, or ``None`` for a line that starts
    nothing (its effect on the script applied)."""
    prefix: dict[str, str] = {}
    while words and "=" in words[0] and _NAME.fullmatch(words[0].partition("=")[0]):
        name, _, value = words.pop(0).partition("=")
        prefix[name] = value
    program, args = (words[0], words[1:]) if words else ("", [])
    if not words or (program == "exec" and not args):
        # Assignments, or exec redirecting the shell's own output (a special builtin: its
        # assignments stay in the shell).
        for name, value in prefix.items():
            script.assign(name, value)
        return None
    if prefix or program not in (*_HARMLESS, "export", "set", "cd"):
        return prefix, words
    if program == "export":
        for arg in args:
            name, eq, value = arg.partition("=")
            if not _NAME.fullmatch(name):
                raise Refused(f"export {arg[:40]}")
            script.exported.add(name)
            if eq:
                script.assign(name, value)
    elif program == "set":
        pairs = iter(args)
        for arg in pairs:
            if re.fullmatch(r"[-+][eux]*o", arg) and next(pairs, "") in _SET_OPTIONS:
                continue
            if not _SET_WORD.fullmatch(arg):
                raise Refused(f"set {arg[:40]} (only -e, -u, -x, -o errexit|nounset|pipefail)")
    elif program == "cd":
        if len(args) != 1 or not args[0].startswith("/"):
            raise Refused("cd to anything but one absolute folder")
        script.cwd = Path(args[0])
    elif program == "printf" and args[:1] and args[0].startswith("-"):
        raise Refused("printf with an option (printf -v assigns a variable)")
    return None


def _launch(
    prefix: dict[str, str], words: list[str], script: _Script, where: str
) -> tuple[ServerCommand, bool]:
    """The server a launch line starts, and whether it execs (nothing after it runs)."""
    env = {name: script.variables[name] for name in script.exported if name in script.variables}
    env.update(prefix)
    execs = words[0] == "exec"
    words = words[1:] if execs else words
    if not words or not starts_server(words):
        raise Refused(
            f"runs {words[0] if words else 'nothing'} (a deploy script starts serve or a server "
            "and runs no other program)"
        )
    command = ServerCommand(
        origin=where, argv=tuple(words), env=env, base_dir=script.cwd,
        search_path=env.get("PATH"),
    )  # fmt: skip
    return command, execs


def shell_commands(text: str, name: str) -> DeployRead:
    """The server a shell script starts, or the first line outside the allowlist."""
    problem = text_problem(text, name)
    if problem is not None:
        return DeployRead((), (problem,))
    script = _Script()
    commands: list[ServerCommand] = []
    budget = ServerBudget()
    for number, line in logical_lines(text):
        body = line.strip(" \t")
        if number == 1 and body.startswith("#!"):
            if not _SHEBANG.fullmatch(body):
                return _refuse(name, number, f"the #! line {body[:60]!r} (only sh or bash)")
            continue
        if not body or body.startswith("#"):
            continue
        try:
            launch = _statement(split_words(body), script)
            if launch is None:
                continue
            if commands:
                raise Refused(f"a second launch (the first is {commands[0].origin})")
            command, execs = _launch(*launch, script, f"{name}:{number}")
        except Refused as exc:
            return _refuse(name, number, str(exc))
        crossed = budget.spend(command.argv, command.env)
        if crossed is not None:
            return DeployRead((), (NotUnderstood(name, number, crossed, BUDGET_FIX),))
        commands.append(command)
        if execs:  # nothing after a successful exec runs; a failed one ends the script
            break
    return DeployRead(tuple(commands))


def _refuse(name: str, line: int, construct: str) -> DeployRead:
    return DeployRead((), (NotUnderstood(name, line, construct, _FIX),))
