"""Reading a deploy shell script inside a closed grammar, the way bash runs it (pure; the
files it sources come through a callback).

Every statement must be one of these forms (each modelled completely; docs/deploy.md has the
table); anything else is *not understood*, naming the file, the line and the construct:

* ``NAME=WORD ...`` (variables; ``set -a`` exports them), ``export NAME[=WORD] ...``,
  ``unset NAME ...``;
* ``set`` with ``-e``/``-u``/``-x``/``-a`` (``+`` too) or ``-o`` one of errexit, nounset,
  xtrace, pipefail, allexport;
* ``cd /ABSOLUTE`` (the folder is known only when a failed ``cd`` stops the script:
  ``set -e`` in effect, or ``cd DIR || exit N``);
* ``echo``/``printf`` (no options) whose output goes nowhere or to a ``.log`` file,
  ``test``/``[ ]`` with one unary file test (optionally ``|| exit N``), ``mkdir -p DIR...``,
  ``wait``, ``true``, ``:``, ``exit [N]`` (nothing after it runs), ``. FILE``/``source FILE``
  (read with this same grammar);
* a launch: ``[NAME=WORD ...] [exec] [nohup] [env [-i] [NAME=WORD ...]] PROGRAM ARGS
  [REDIRECTIONS] [&]`` where PROGRAM is ``llama-server`` or ``batch-invariance serve`` (a path,
  or a bare name looked up with the ``PATH`` the file sets); after ``exec PROGRAM`` nothing runs.

Redirections go to ``/dev/null``, ``/dev/stdout``, ``/dev/stderr``, another descriptor, or a
``.log`` file. Words are those of :mod:`batch_invariance.deploy.shell_grammar`.
What the file cannot show is the environment it is started with; that boundary is documented.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from batch_invariance.deploy.commands import NotUnderstood
from batch_invariance.deploy.shell_grammar import GLOB, assignable, word_problem
from batch_invariance.deploy.shell_words import REDIRECTS, Op, Token, Word, tokenize
from batch_invariance.engines.llama_server.env import is_engine_variable
from batch_invariance.errors import UsageError

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_SET_LETTERS = re.compile(r"[-+](?:[euxa]+o?|o)")
_SET_NAMES = frozenset({"errexit", "nounset", "xtrace", "pipefail", "allexport"})
_TESTS = frozenset({"-e", "-f", "-d", "-x", "-r", "-s", "-w"})
_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_ENV_CLEAR = frozenset({"-i", "-", "--ignore-environment"})
_MAX_SOURCE_DEPTH = 8
_WRAPPERS = frozenset(
    {"exec", "nohup", "env", "/usr/bin/env", "/bin/env", "/usr/bin/nohup", "/bin/nohup"}
)


class NotInGrammar(Exception):
    """A statement outside the grammar (the message names the construct)."""

    def __init__(self, construct: str, fix: str = "", line: int = 0) -> None:
        super().__init__(construct)
        self.construct = construct
        self.fix = fix
        self.line = line


@dataclass(frozen=True)
class Launch:
    """One server the script starts."""

    where: str
    argv: tuple[str, ...]
    env: dict[str, str]
    #: The folder it starts in; ``None`` when the file does not fix it.
    cwd: Path | None
    #: ``PATH`` as the file set it (a bare program is looked up with it), else ``None``.
    search_path: str | None


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

    def assign(self, name: str, value: str, where: int) -> None:
        if not assignable(name):
            raise NotInGrammar(f"assigning {name} (bash itself reads it)")
        if name == "PATH" and not all(p.startswith("/") for p in value.split(":")):
            raise NotInGrammar(
                f"PATH={value} (every folder must be absolute)", "write PATH=/abs/bin:/usr/bin"
            )
        self.variables[name] = value
        self.assigned_at[name] = where
        if self.allexport or name == "PATH":
            self.exported.add(name)  # PATH is in every caller's environment: always exported

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in self.variables.items() if k in self.exported}


def starts_server(argv: Sequence[str]) -> bool:
    """True when ``argv`` runs llama-server or ``batch-invariance serve`` (by program name;
    what the program is, is checked by content elsewhere)."""
    program = PurePosixPath(argv[0]).name if argv else ""
    return program.startswith("llama-server") or is_serve(argv)


def is_serve(argv: Sequence[str]) -> bool:
    return (
        len(argv) > 1 and PurePosixPath(argv[0]).name == "batch-invariance" and argv[1] == "serve"
    )


def expand(word: Word, state: ShellState, split: bool = True) -> list[str]:
    """The fields a word expands to (bash's rules for the grammar's words)."""
    problem = word_problem(word)
    if problem:
        raise NotInGrammar(problem)
    fields: list[str] = []
    current: str | None = None
    for part in word.parts:
        if not part.variable:
            current = (current or "") + part.text
            continue
        if part.text not in state.variables:
            raise NotInGrammar(
                f"${part.text}, which this file does not set (the caller's environment decides)",
                f"set {part.text} in the file before this line",
            )
        value = state.variables[part.text]
        if part.quoted or not split:
            current = (current or "") + value
            continue
        if GLOB.search(value):
            raise NotInGrammar(f"unquoted ${part.text} holds a pattern character", "quote it")
        pieces = value.split()
        if value[:1].isspace() and current is not None:
            fields.append(current)
            current = None
        for index, piece in enumerate(pieces):
            if index:
                fields.append(current or "")
                current = None
            current = (current or "") + piece
        if value[-1:].isspace() and current is not None:
            fields.append(current)
            current = None
    if current is not None or (not fields and any(p.quoted for p in word.parts)):
        fields.append(current or "")
    return fields


def _literal(word: Word, state: ShellState) -> str:
    fields = expand(word, state, split=False)
    return fields[0] if fields else ""


def _assignment(word: Word, state: ShellState) -> tuple[str, str] | None:
    """``NAME=value`` (name and ``=`` unquoted) with the value expanded as bash assigns."""
    first = word.parts[0] if word.parts else None
    if first is None or first.quoted or first.variable:
        return None
    match = _ASSIGN.match(first.text)
    if match is None:
        return None
    name = match.group(1)
    rest = Word(parts=list(word.parts), line=word.line)
    head = first.text[len(name) + 1 :]
    rest.parts[0] = type(first)(head, first.quoted, first.variable)
    if not head:
        rest.parts.pop(0)
    return name, "".join(expand(rest, state, split=False))


@dataclass(frozen=True)
class _Statement:
    words: list[Word]
    redirects: list[tuple[str, Word]]
    background: bool
    #: The ``exit [N]`` after ``||`` (``None``: no ``||``).
    or_exit: list[Word] | None
    line: int


def _statements(tokens: Sequence[Token]) -> list[_Statement | NotInGrammar]:
    out: list[_Statement | NotInGrammar] = []
    current: list[Token] = []
    for token in [*tokens, Op("\n", -1, -1)]:
        if isinstance(token, Op) and token.text in ("\n", ";", "&"):
            if current:
                out.append(_statement(current, background=token.text == "&"))
            elif token.text != "\n":
                out.append(
                    NotInGrammar(f"{token.text!r} with no command before it", "", token.line)
                )
            current = []
        else:
            current.append(token)
    return out


def _statement(tokens: list[Token], background: bool) -> _Statement | NotInGrammar:
    found = _parse_statement(tokens, background)
    if isinstance(found, NotInGrammar):
        found.line = found.line or tokens[0].line
    return found


def _parse_statement(tokens: list[Token], background: bool) -> _Statement | NotInGrammar:
    line = tokens[0].line
    words: list[Word] = []
    redirects: list[tuple[str, Word]] = []
    or_exit: list[Word] | None = None
    target: list[Word] = words
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if isinstance(token, Word):
            target.append(token)
        elif token.text == "||" and or_exit is None and words:
            or_exit = []
            target = or_exit
        elif token.text in (">", ">>", "&>", "&>>", ">&", "<"):
            fd = ""
            if target and target[-1].end == token.start and (target[-1].literal or "").isdigit():
                fd = target.pop().literal or ""
            nxt = tokens[index + 1] if index + 1 < len(tokens) else None
            if not isinstance(nxt, Word):
                return NotInGrammar(f"redirection {token.text} without a target")
            redirects.append((fd + token.text, nxt))
            index += 1
        else:
            what = "a here-document" if token.text.startswith("<<") else f"operator {token.text}"
            return NotInGrammar(what, "one simple command per line")
        index += 1
    if or_exit is not None and (
        not or_exit or or_exit[0].literal != "exit" or len(or_exit) > 2 or background
    ):
        return NotInGrammar("|| followed by something other than exit [N]")
    if not words:
        return NotInGrammar("a redirection with no command")
    return _Statement(words, redirects, background, or_exit, line)


@dataclass
class ShellReader:
    """Reads one script (and the files it sources) into launches and constructs outside the
    grammar."""

    name: str
    source_file: Callable[[str], str | None]
    state: ShellState = field(default_factory=ShellState)
    launches: list[Launch] = field(default_factory=list)
    not_understood: list[NotUnderstood] = field(default_factory=list)
    #: ``.log`` files the script writes (checked against what its servers read).
    written: list[Path | str] = field(default_factory=list)
    depth: int = 0

    def run(self, text: str) -> None:
        for number, line in enumerate(text.split("\n"), start=1):
            if "\r" in line:
                self._refuse(number, "a CR byte (Windows line ends)", "convert with dos2unix")
                return
        try:
            script = tokenize(text, self.name)
        except UsageError as exc:  # an unterminated quote, named with its line
            self._refuse(0, str(exc).removeprefix(f"{self.name}:"))
            return
        for item in _statements(script.tokens):
            if isinstance(item, NotInGrammar):
                self._refuse(item.line, item.construct, item.fix)
                return
            try:
                self._run(item)
            except NotInGrammar as exc:
                self._refuse(exc.line or item.line, exc.construct, exc.fix)
                return  # what follows depends on a state the reader no longer knows
            if self.state.stopped:
                return

    def _refuse(self, line: int, construct: str, fix: str = "") -> None:
        self.not_understood.append(NotUnderstood(self.name, line, construct, fix))

    def _run(self, s: _Statement) -> None:
        state = self.state
        prefix: dict[str, str] = {}
        index = 0
        while index < len(s.words):
            pair = _assignment(s.words[index], state)
            if pair is None:
                break
            if not assignable(pair[0]):
                raise NotInGrammar(f"assigning {pair[0]} (bash itself reads it)")
            prefix[pair[0]] = pair[1]
            index += 1
        words = s.words[index:]
        if not words:
            self._redirects(s, allow=False)
            for name, value in prefix.items():
                state.assign(name, value, s.line)
            return
        head = words[0].literal or ""
        if words[0].literal is None:
            expand(words[0], state)  # a variable command word: named when the file lacks it
        if s.or_exit is not None and head not in ("test", "[", "cd"):
            raise NotInGrammar(
                f"{words[0].source} ... || exit", "only test, [ ] and cd take || exit"
            )
        if head in _WRAPPERS or self._is_launch(words):
            if head == "exec" and len(words) == 1 and not prefix:
                self._redirects(s)  # ``exec >>log 2>&1``: the shell's own output
                return
            self._launch(words, prefix, s)
            return
        if prefix:
            raise NotInGrammar(f"an assignment before {words[0].source}")
        if s.background:
            raise NotInGrammar(f"{words[0].source} & (in the background)")
        builtin = _BUILTINS.get(head)
        if builtin is None:
            raise NotInGrammar(
                f"running {words[0].source} (not in the grammar)",
                "the grammar runs llama-server or batch-invariance serve; do other work "
                "outside the deploy file",
            )
        builtin(self, words[1:], s)

    # ---- statements ----------------------------------------------------------------------
    def _is_launch(self, words: list[Word]) -> bool:
        try:
            return starts_server([_literal(w, self.state) for w in words[:2]])
        except NotInGrammar:
            return False

    def _redirects(self, s: _Statement, allow: bool = True) -> None:
        if s.redirects and not allow:
            raise NotInGrammar("a redirection on this statement")
        for op, target in s.redirects:
            text = _literal(target, self.state)
            if op.endswith(">&"):
                if not text.isdigit():
                    raise NotInGrammar(f"{op}{text} (not a descriptor)")
            elif op.endswith("<"):
                if text != "/dev/null":
                    raise NotInGrammar(f"input from {text}", "use < /dev/null or none")
            elif text not in _DEVICES:
                if not text.endswith(".log"):
                    raise NotInGrammar(
                        f"output written to {text} (it could be a file the server reads)",
                        "send output to a .log file, /dev/null or the journal",
                    )
                self.written.append(self._path(text) or text)

    def _path(self, text: str) -> Path | None:
        if text.startswith("/"):
            return Path(text)
        return None if self.state.cwd is None else self.state.cwd / text

    def _export(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        for word in args:
            pair = _assignment(word, self.state)
            if pair is not None:
                self.state.assign(*pair, s.line)
                self.state.exported.add(pair[0])
                continue
            name = word.literal or ""
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise NotInGrammar(f"export {word.source}", "export NAME or NAME=VALUE only")
            if name not in self.state.variables:
                raise NotInGrammar(f"export {name} of a variable this file does not set")
            self.state.exported.add(name)

    def _unset(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        for word in args:
            name = word.literal or ""
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not assignable(name):
                raise NotInGrammar(f"unset {word.source}")
            self.state.variables.pop(name, None)
            self.state.exported.discard(name)

    def _set(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        index = 0
        while index < len(args):
            word = args[index].literal or ""
            if not _SET_LETTERS.fullmatch(word):
                raise NotInGrammar(f"set {word}", "set -e, -u, -x, -a or -o NAME only")
            on = word[0] == "-"
            letters = set(word[1:])
            if word.endswith("o"):
                option = args[index + 1].literal if index + 1 < len(args) else None
                if option not in _SET_NAMES:
                    raise NotInGrammar(f"set {word} {option or ''}".strip())
                letters.add({"errexit": "e", "allexport": "a"}.get(option or "", ""))
                index += 1
            if "e" in letters:
                self.state.errexit = on
            if "a" in letters:
                self.state.allexport = on
            index += 1

    def _cd(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        if len(args) != 1:
            raise NotInGrammar("cd without exactly one folder")
        target = _literal(args[0], self.state)
        if not target.startswith("/"):
            raise NotInGrammar(f"cd {target} (relative)", "cd to an absolute folder")
        guarded = self.state.errexit or s.or_exit is not None
        self.state.cwd = Path(target) if guarded else None

    def _output(self, args: list[Word], s: _Statement) -> None:
        fields = [f for w in args for f in expand(w, self.state)]
        if fields and fields[0].startswith("-"):
            raise NotInGrammar(f"{s.words[0].literal} {fields[0]}", "no options")
        self._redirects(s)

    def _test(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        head = s.words[-len(args) - 1].literal
        fields = [_literal(w, self.state) for w in args]
        if head == "[":
            if not fields or fields[-1] != "]":
                raise NotInGrammar("[ without ]")
            fields = fields[:-1]
        if len(fields) != 2 or fields[0] not in _TESTS:
            raise NotInGrammar(f"{head} {' '.join(fields)}", "one unary file test: test -x FILE")

    def _mkdir(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        if "PATH" in self.state.variables:
            raise NotInGrammar(
                "mkdir after PATH is set (which program runs depends on it)",
                "create folders before the deploy, or set PATH after mkdir",
            )
        fields = [_literal(w, self.state) for w in args]
        if not fields or fields[0] != "-p" or any(f.startswith("-") for f in fields[1:]):
            raise NotInGrammar("mkdir without -p, or with other options", "mkdir -p DIR ...")

    def _plain(self, args: list[Word], s: _Statement) -> None:
        if args:
            raise NotInGrammar(f"{s.words[0].literal} {args[0].source}")
        self._redirects(s, allow=False)

    def _exit(self, args: list[Word], s: _Statement) -> None:
        if len(args) > 1 or (args and not (args[0].literal or "x").isdigit()):
            raise NotInGrammar("exit with other than one number")
        self.state.stopped = True

    def _source(self, args: list[Word], s: _Statement) -> None:
        self._redirects(s, allow=False)
        if len(args) != 1:
            raise NotInGrammar(". with arguments")
        written = _literal(args[0], self.state)
        if "/" not in written:
            raise NotInGrammar(
                f". {written} (bash looks it up on PATH first)",
                f"write . ./{written} or an absolute path",
            )
        path = self._path(written)
        text = None if path is None else self.source_file(str(path))
        if text is None or self.depth >= _MAX_SOURCE_DEPTH:
            raise NotInGrammar(f"sourcing {args[0].source}, which cannot be read here")
        inner = ShellReader(str(path), self.source_file, self.state, depth=self.depth + 1)
        inner.run(text)
        self.launches.extend(inner.launches)
        self.not_understood.extend(inner.not_understood)
        self.written.extend(inner.written)
        if inner.not_understood:
            raise NotInGrammar(f"sourced file {path} is not understood")

    # ---- launches ------------------------------------------------------------------------
    def _launch(self, words: list[Word], prefix: dict[str, str], s: _Statement) -> None:
        state = self.state
        env = {**state.environment(), **prefix}
        argv = [f for w in words for f in expand(w, state)]
        replaced = False
        if argv[:1] == ["exec"]:
            replaced, argv = True, argv[1:]
        if argv and self._external(argv[0]) == "nohup":
            argv = argv[1:]
        lookup: str | None = None
        if argv and self._external(argv[0]) == "env":
            argv, env = _env(argv[1:], env)
            # env execvp()s the program with its new environment: glibc searches that PATH,
            # or its default /bin:/usr/bin when the new environment has none.
            lookup = env.get("PATH", "/bin:/usr/bin")
        if not starts_server(argv):
            raise NotInGrammar(
                f"running {argv[0] if argv else 'nothing'} (not in the grammar)",
                "the grammar runs llama-server or batch-invariance serve; do other work "
                "outside the deploy file",
            )
        self._redirects(s)
        _check_unexported(prefix, state)
        search = state.variables.get("PATH") if "PATH" in state.exported else None
        if "PATH" in prefix:  # bash looks the program up with a prefix PATH
            if not all(p.startswith("/") for p in prefix["PATH"].split(":")):
                raise NotInGrammar(f"PATH={prefix['PATH']} (every folder must be absolute)")
            search = prefix["PATH"]
        if lookup is not None:
            search = lookup
        self.launches.append(Launch(f"{self.name}:{s.line}", tuple(argv), env, state.cwd, search))
        if replaced:
            state.stopped = True  # exec: the shell is gone; nothing after it runs

    def _external(self, word: str) -> str | None:
        """``env`` or ``nohup`` as a wrapper: a system path, or a bare name while the file
        sets no ``PATH`` (with a ``PATH`` of the file's, a bare name could be any program)."""
        name = PurePosixPath(word).name
        if name not in ("env", "nohup"):
            return None
        if word in (f"/usr/bin/{name}", f"/bin/{name}"):
            return name
        if word == name and "PATH" not in self.state.variables:
            return name
        raise NotInGrammar(
            f"{word} (which program that is depends on PATH)", f"write /usr/bin/{name}"
        )


def _check_unexported(prefix: dict[str, str], state: ShellState) -> None:
    """A variable the server reads assigned without ``export``: whether the server gets it
    depends on whether the caller exported it."""
    for name in state.variables:
        reads = name.startswith("LLAMA_ARG_") or is_engine_variable(name)
        if reads and name not in state.exported and name not in prefix:
            raise NotInGrammar(
                f"{name} assigned without export (the caller's environment decides whether the "
                "server gets it)",
                f"write export {name}=...",
                line=state.assigned_at.get(name, 0),
            )


def _env(args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    index = 0
    while index < len(args):
        word = args[index]
        if word in _ENV_CLEAR:
            env = {}
        elif word == "--":
            index += 1
            break
        elif word.startswith("-"):
            raise NotInGrammar(f"env {word}", "env takes only -i and NAME=VALUE words")
        elif _ASSIGN.match(word):
            key, _, value = word.partition("=")
            env = {**env, key: value}
        else:
            break
        index += 1
    return args[index:], env


_BUILTINS: dict[str, Callable[[ShellReader, list[Word], _Statement], None]] = {
    "export": ShellReader._export,
    "unset": ShellReader._unset,
    "set": ShellReader._set,
    "cd": ShellReader._cd,
    "echo": ShellReader._output,
    "printf": ShellReader._output,
    "test": ShellReader._test,
    "[": ShellReader._test,
    "mkdir": ShellReader._mkdir,
    "wait": ShellReader._plain,
    "true": ShellReader._plain,
    ":": ShellReader._plain,
    "exit": ShellReader._exit,
    ".": ShellReader._source,
    "source": ShellReader._source,
}

__all__ = ["REDIRECTS", "Launch", "NotInGrammar", "ShellReader", "ShellState", "expand",
           "is_serve", "starts_server"]  # fmt: skip
