"""Running a deploy shell script the way bash runs it, far enough to know its servers.

Commands are taken in order, with the state bash keeps: shell variables and which of them are
exported (``export``, ``set -a``), the working folder (``cd``), sourced files, prefix
assignments (``N=1 llama-server -np $N`` expands ``$N`` before the prefix applies, and the
prefix reaches only that command's environment) and wrappers that change the environment
(``sudo`` and ``env -i`` reset it, ``env -u`` drops a variable, ``exec -c`` clears it).

The reader fails closed: a command it does not model (inside a loop, conditional, function or
subshell, a ``bash -c``, a variable as the command word, ``docker run``, a word with ``$(...)``
...) is recorded as not modelled when it mentions llama-server, a llama.cpp image,
``LLAMA_ARG_``, a ``.gguf`` file or ``batch-invariance serve``; a variable assigned where the
reader cannot follow is unknown from then on, and a server that uses it is not covered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from batch_invariance.deploy.shell_words import REDIRECTS, Op, Token, Word, tokenize
from batch_invariance.deploy.shell_wrappers import WRAPPERS, Unmodelled, unwrap

#: What makes an unmodelled line matter.
TRIGGER = re.compile(
    r"llama-server|llama\.cpp|llama_cpp|LLAMA_ARG_|\.gguf\b|batch-invariance\s+serve", re.I
)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_OPENERS = frozenset({"if", "for", "while", "until", "case", "select", "{", "function"})
_CLOSERS = frozenset({"fi", "done", "esac", "}"})
#: Commands that run nothing and change nothing a server reads (without a redirection).
INERT = frozenset(
    {"echo", "printf", "logger", "systemctl", "journalctl", "curl", "wget", "pgrep", "pkill",
     "kill", "sleep", "wait", "true", ":", "mkdir", "chmod", "chown", "ls", "test", "[",
     "ulimit", "umask", "trap", "set", "shopt", "exit"}
)  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """One command the script runs that starts a server (``llama-server`` or ``serve``)."""

    where: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path | None
    #: Variables of the server's environment whose value the reader could not follow.
    unknown_env: tuple[str, ...] = ()


class CommandWordUnknown(Unmodelled):
    """The command word is a variable the reader cannot resolve to a harmless program."""


def _assigns(word: Word) -> bool:
    """``NAME=...`` with the name and ``=`` unquoted (a quoted name is a command word)."""
    first = word.parts[0] if word.parts else None
    return (
        first is not None
        and not first.quoted
        and not first.variable
        and bool(_ASSIGN.match(first.text))
    )


@dataclass
class ShellState:
    variables: dict[str, str] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    #: Variables whose value the reader lost (assigned where it cannot follow).
    unknown: set[str] = field(default_factory=set)
    cwd: Path | None = None
    allexport: bool = False
    depth: list[str] = field(default_factory=list)
    stopped: bool = False

    def environment(self) -> tuple[dict[str, str], tuple[str, ...]]:
        env = {k: v for k, v in self.variables.items() if k in self.exported}
        unknown = tuple(sorted(k for k in self.unknown if k in self.exported))
        return env, unknown

    def assign(self, name: str, value: str) -> None:
        self.variables[name] = value
        self.unknown.discard(name)
        if self.allexport:
            self.exported.add(name)


def starts_server(argv: Sequence[str]) -> bool:
    """True when ``argv`` runs llama-server or ``batch-invariance serve`` (by program name)."""
    program = PurePosixPath(argv[0]).name if argv else ""
    return program.startswith("llama-server") or (
        program == "batch-invariance" and argv[1:2] in (["serve"], ("serve",))
    )


def is_serve(argv: Sequence[str]) -> bool:
    return bool(argv) and PurePosixPath(argv[0]).name == "batch-invariance"


def expand(word: Word, state: ShellState, split: bool = True) -> list[str]:
    """The fields a word expands to; an unknown or unset variable raises Unmodelled."""
    if word.problem:
        raise Unmodelled(word.problem)
    fields: list[str] = []
    current: str | None = None
    for part in word.parts:
        if not part.variable:
            current = (current or "") + part.text
            continue
        if part.text in state.unknown or part.text not in state.variables:
            why = (
                "is assigned where the reader cannot follow"
                if part.text in state.unknown
                else ("is not set in this file (it would come from the caller's environment)")
            )
            raise Unmodelled(f"${part.text} {why}")
        value = state.variables[part.text]
        if part.quoted or not split:
            current = (current or "") + value
            continue
        pieces = value.split()
        if not pieces:
            continue
        if value[:1].isspace() and current is not None:
            fields.append(current)
            current = None
        for index, piece in enumerate(pieces):
            if index:
                fields.append(current or "")
                current = None
            current = (current or "") + piece
        if value[-1:].isspace():
            fields.append(current or "")
            current = None
    if current is not None or (not fields and any(p.quoted for p in word.parts)):
        fields.append(current or "")
    return fields


def _commands(tokens: Sequence[Token]) -> list[list[Word | Op]]:
    """Simple commands: words up to an operator; redirections and their targets dropped
    (``Op("(")`` / ``Op(")")`` are kept as their own commands to track subshells)."""
    out: list[list[Word | Op]] = [[]]
    skip_next = False
    previous: Token | None = None
    for token in tokens:
        if isinstance(token, Op):
            if token.text in REDIRECTS:
                if isinstance(previous, Word) and previous.end == token.start:
                    text = previous.literal or ""
                    if text.isdigit() and out[-1] and out[-1][-1] is previous:
                        out[-1].pop()
                skip_next = True
                out[-1].append(token)
            elif token.text in ("(", ")"):
                out.append([token])
                out.append([])
            else:
                out.append([])
        elif skip_next:
            skip_next = False
        else:
            out[-1].append(token)
        previous = token
    return [c for c in out if c]


@dataclass
class ShellReader:
    """Reads one script (and the files it sources) into launches and unmodelled lines."""

    name: str
    lines: list[str]
    source_file: Callable[[str, ShellState], str | None]
    state: ShellState = field(default_factory=ShellState)
    launches: list[Launch] = field(default_factory=list)
    unmodelled: list[str] = field(default_factory=list)
    unread_files: list[str] = field(default_factory=list)

    def _where(self, line: int) -> str:
        return f"{self.name}:{line}"

    def _fail(self, line: int, why: str, words: Sequence[Word] = (), always: bool = False) -> None:
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        said = " ".join([text, *(w.source for w in words)])
        if always or TRIGGER.search(said):
            self.unmodelled.append(f"{self._where(line)}: {why}: {text[:120]}")

    def run(self, text: str) -> None:
        script = tokenize(text, self.name)
        for line, body in script.heredoc_lines:
            if TRIGGER.search(body):
                self._fail(line, "a here-document (its text may become a script)")
        for command in _commands(script.tokens):
            if self.state.stopped:
                return
            self._command(command)

    def _command(self, command: list[Word | Op]) -> None:
        first = command[0]
        line = first.line
        if isinstance(first, Op):  # a subshell opens or closes
            if first.text == "(":
                self.state.depth.append("(")
            elif self.state.depth and self.state.depth[-1] == "(":
                self.state.depth.pop()
            return
        words = [t for t in command if isinstance(t, Word)]
        redirected = any(isinstance(t, Op) for t in command)
        head = words[0].literal
        if head in _OPENERS or (head in _CLOSERS and self.state.depth):
            self._compound(head, words)
            if head in _OPENERS:
                return self._inside(words, line, f"inside {head} ... (not modelled)")
            return None
        if self.state.depth:
            return self._inside(words, line, f"inside {self.state.depth[-1]} ... (not modelled)")
        try:
            self._simple(words, line, redirected)
        except CommandWordUnknown as exc:
            self._fail(line, str(exc), words, always=True)
        except Unmodelled as exc:
            self._fail(line, str(exc), words)

    def _compound(self, head: str | None, words: list[Word]) -> None:
        if head in _OPENERS and head != "function":
            self.state.depth.append(str(head))
        elif head in _CLOSERS and self.state.depth:
            self.state.depth.pop()
        for word in words[1:]:  # ``if x; then y; fi`` on one line closes itself
            if word.literal in _CLOSERS and self.state.depth:
                self.state.depth.pop()

    def _inside(self, words: list[Word], line: int, why: str) -> None:
        for word in words:  # what a compound assigns is unknown afterwards
            match = _ASSIGN.match(word.source)
            if match:
                self.state.unknown.add(match.group(1))
            if word.literal == "cd":
                self.state.cwd = None
        self._fail(line, why)

    def _simple(self, words: list[Word], line: int, redirected: bool) -> None:
        state = self.state
        index = 0
        prefix: dict[str, str] = {}
        while index < len(words) and _assigns(words[index]):
            name, value = _split_assignment(words[index], state)
            prefix[name] = value
            index += 1
        if index == len(words):
            for name, value in prefix.items():
                state.assign(name, value)
            return
        rest = words[index:]
        head = rest[0].literal
        if head is None:
            try:
                value = " ".join(expand(rest[0], state))
            except Unmodelled as exc:
                raise CommandWordUnknown(f"a variable as the command word ({exc})") from None
            if TRIGGER.search(value) or value.rsplit("/", 1)[-1] in ("bash", "sh", "env"):
                raise CommandWordUnknown(f"a variable as the command word ({value})")
        if head == "export":
            return self._export(rest[1:])
        if head == "unset":
            for word in rest[1:]:
                state.variables.pop(word.literal or "", None)
                state.exported.discard(word.literal or "")
            return None
        if head == "cd":
            return self._cd(rest[1:])
        if head in ("source", "."):
            return self._source(rest[1:], line)
        if head == "set":
            flags = [w.literal for w in rest[1:]]
            state.allexport = "-a" in flags or (state.allexport and "+a" not in flags)
        if head == "exit" and not state.depth:
            state.stopped = True
        env, unknown = state.environment()
        env = {**env, **prefix}
        unknown = tuple(u for u in unknown if u not in prefix)
        self._run(rest, env, unknown, line, redirected)

    def _run(
        self, words: list[Word], env: dict[str, str], unknown: tuple[str, ...], line: int,
        redirected: bool,
    ) -> None:  # fmt: skip
        state = self.state
        argv = [field_ for w in words for field_ in expand(w, state)]
        cwd = state.cwd
        while argv:
            name = PurePosixPath(argv[0]).name
            if starts_server(argv):
                self.launches.append(Launch(self._where(line), tuple(argv), env, cwd, unknown))
                return
            wrapper = WRAPPERS.get(name)
            if wrapper is None:
                if name in INERT and not redirected:
                    return
                raise Unmodelled(f"{name} runs something the reader does not model")
            argv, env, cwd, unknown = unwrap(name, wrapper, argv[1:], env, cwd, unknown)

    def _export(self, words: list[Word]) -> None:
        for word in words:
            if word.literal is not None and word.literal.startswith("-"):
                raise Unmodelled(f"export {word.literal}")
            if _assigns(word):
                name, value = _split_assignment(word, self.state)
                self.state.assign(name, value)
            else:
                name = word.literal or ""
            self.state.exported.add(name)

    def _cd(self, words: list[Word]) -> None:
        try:
            target = expand(words[0], self.state, split=False)[0] if words else None
        except Unmodelled:
            target = None
        if target is None or target == "-" or target.startswith("~"):
            self.state.cwd = None
            return
        path = Path(target)
        if path.is_absolute():
            self.state.cwd = path
        elif self.state.cwd is not None:
            self.state.cwd = self.state.cwd / path

    def _source(self, words: list[Word], line: int) -> None:
        name = words[0].literal if words else None
        text = None if name is None else self.source_file(name, self.state)
        if text is None:
            self.unread_files.append(name or words[0].source if words else "?")
            return
        inner = ShellReader(name or "?", text.splitlines(), self.source_file, self.state)
        inner.run(text)
        self.launches.extend(inner.launches)
        self.unmodelled.extend(inner.unmodelled)
        self.unread_files.extend(inner.unread_files)


def _split_assignment(word: Word, state: ShellState) -> tuple[str, str]:
    """``NAME=value`` with the value expanded (no field splitting, as bash assigns)."""
    match = _ASSIGN.match(word.source)
    assert match is not None
    name = match.group(1)
    rest = Word(parts=list(word.parts), line=word.line, problem=word.problem)
    # Drop the ``NAME=`` characters from the leading literal parts.
    drop = len(name) + 1
    while drop and rest.parts:
        part = rest.parts[0]
        if len(part.text) <= drop:
            drop -= len(part.text)
            rest.parts.pop(0)
        else:
            rest.parts[0] = type(part)(part.text[drop:], part.quoted, part.variable)
            drop = 0
    try:
        return name, "".join(expand(rest, state, split=False))
    except Unmodelled:
        state.unknown.add(name)
        raise
