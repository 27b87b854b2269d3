"""The shell state a deploy script builds and how its words expand (pure).

Variables, exports and the few options the grammar models; a word's fields as bash and dash
produce them: quotes removed, ``$NAME``/``${NAME}`` of a variable the file set, an unquoted
expansion split at the default ``IFS`` (space, tab, newline: exactly those, never another
blank). A value that would undergo pathname expansion (``*?[``, or a ``\\`` that bash 5.0
treats as a pattern) is refused unquoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from batch_invariance.deploy.readers.shell_grammar import assignable, word_problem
from batch_invariance.deploy.readers.shell_words import Part, Word
from batch_invariance.deploy.readers.source_bytes import BOUND, IFS, MAX_EXPANDED, split_blanks
from batch_invariance.engines.llama_server.env import is_engine_variable

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
#: Characters of an unquoted expansion's value that make the shell treat it as a pattern.
_PATTERN = re.compile(r"[*?\[\\]")


class NotInGrammar(Exception):
    """A statement outside the grammar (the message names the construct)."""

    def __init__(self, construct: str, fix: str = "", line: int = 0) -> None:
        super().__init__(construct)
        self.construct = construct
        self.fix = fix
        self.line = line


def absolute_path_list(value: str) -> bool:
    """Every folder of a ``PATH`` value is absolute."""
    return all(p.startswith("/") for p in value.split(":"))


@dataclass
class ShellState:
    variables: dict[str, str] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    cwd: Path | None = None
    allexport: bool = False
    errexit: bool = False
    stopped: bool = False
    #: The line each variable was last assigned on (named when it is refused later).
    assigned_at: dict[str, int] = field(default_factory=dict)
    #: Characters expanded so far (bounded by :data:`MAX_EXPANDED`).
    expanded: int = 0
    #: Every variable assigned that a server reads (kept as assigned, so that each launch
    #: finds the unexported ones with set operations, not by classifying every variable).
    server_reads: set[str] = field(default_factory=set)

    def assign(self, name: str, value: str, where: int) -> None:
        if not assignable(name):
            raise NotInGrammar(f"assigning {name} (the shell itself reads it)")
        if name == "PATH" and not absolute_path_list(value):
            raise NotInGrammar(
                f"PATH={value} (every folder must be absolute)", "write PATH=/abs/bin:/usr/bin"
            )
        self.variables[name] = value
        self.assigned_at[name] = where
        if name.startswith("LLAMA_ARG_") or is_engine_variable(name):
            self.server_reads.add(name)
        if self.allexport or name == "PATH":
            self.exported.add(name)  # PATH is in every caller's environment: always exported

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in self.variables.items() if k in self.exported}

    def spend(self, text: str) -> str:
        """``text``, counted against :data:`~batch_invariance.deploy.readers.source_bytes.
        MAX_EXPANDED` (``X=$X$X`` doubles a value each line; a long value expanded on many
        lines is work the file does not show)."""
        self.expanded += len(text)
        if self.expanded > MAX_EXPANDED:
            raise NotInGrammar(
                f"words that expand to more than {MAX_EXPANDED} characters in all ({BOUND})",
                "keep values short; do not build them by repeated expansion",
            )
        return text


def _value(name: str, state: ShellState, extra: dict[str, str] | None) -> str:
    if extra and name in extra:
        return extra[name]
    if name not in state.variables:
        raise NotInGrammar(
            f"${name}, which this file does not set (the caller's environment decides)",
            f"set {name} in the file before this line",
        )
    return state.variables[name]


def expand(
    word: Word, state: ShellState, split: bool = True, extra: dict[str, str] | None = None
) -> list[str]:
    """The fields a word expands to (the shell's rules for the grammar's words); ``extra``:
    variables assigned earlier on the same line (a prefix ``A=1 B=$A`` sees ``A=1``)."""
    problem = word_problem(word)
    if problem:
        raise NotInGrammar(problem)
    fields: list[str] = []
    # The field being built, in pieces (None: none started).
    current: list[str] | None = None
    for part in word.parts:
        value = state.spend(_value(part.text, state, extra) if part.variable else part.text)
        if not part.variable or part.quoted or not split:
            current = [] if current is None else current
            current.append(value)
            continue
        if _PATTERN.search(value):
            raise NotInGrammar(f"unquoted ${part.text} holds a pattern character", "quote it")
        if value[:1] in tuple(IFS) and current is not None:
            fields.append("".join(current))
            current = None
        for index, piece in enumerate(split_blanks(value, IFS)):
            if index and current is not None:
                fields.append("".join(current))
                current = None
            current = [] if current is None else current
            current.append(piece)
        if value[-1:] in tuple(IFS) and current is not None:
            fields.append("".join(current))
            current = None
    if current is not None or (not fields and any(p.quoted for p in word.parts)):
        fields.append("".join(current or ()))
    return fields


def literal(word: Word, state: ShellState) -> str:
    fields = expand(word, state, split=False)
    return fields[0] if fields else ""


def assignment(
    word: Word, state: ShellState, extra: dict[str, str] | None = None
) -> tuple[str, str] | None:
    """``NAME=value`` (name and ``=`` unquoted) with the value expanded as the shell assigns."""
    first = word.parts[0] if word.parts else None
    if first is None or first.quoted or first.variable:
        return None
    match = ASSIGN.match(first.text)
    if match is None:
        return None
    name = match.group(1)
    # The value keeps the word's problem: ``NP=$'a'`` is ANSI-C quoting in bash (found by the
    # differential test against real bash; it was read as an empty value).
    rest = Word(parts=list(word.parts), line=word.line, problem=word.problem)
    head = first.text[len(name) + 1 :]
    rest.parts[0] = Part(head, first.quoted, first.variable)
    if not head:
        rest.parts.pop(0)
    return name, "".join(expand(rest, state, split=False, extra=extra))


__all__ = ["ASSIGN", "NAME", "NotInGrammar", "ShellState", "absolute_path_list", "assignment",
           "expand", "literal"]  # fmt: skip
