"""Reading a deploy shell script inside a closed grammar, the way bash or dash runs it (pure;
the files it sources come through a callback).

The file's bytes are checked first (:mod:`batch_invariance.deploy.readers.source_bytes`), its
dialect is its ``#!`` line's (:mod:`batch_invariance.deploy.readers.shell_dialect`). Every
statement must be one of these forms (each modelled completely; docs/deploy.md has the
table); anything else is *not understood*, naming the file, the line and the construct:

* ``NAME=WORD ...`` (variables, assigned left to right; ``set -a`` exports them),
  ``export NAME[=WORD] ...``, ``unset NAME ...``;
* ``set`` with ``-e``/``-u``/``-x``/``-a`` (``+`` too) or ``-o`` one of errexit, nounset,
  xtrace, pipefail (bash only), allexport;
* ``cd /ABSOLUTE`` (the folder is known only when a failed ``cd`` stops the script:
  ``set -e`` in effect, or ``cd DIR || exit N``);
* ``echo``/``printf`` (no options) whose output goes nowhere or to a ``.log`` file,
  ``test``/``[ ]`` with one unary file test (optionally ``|| exit N``), ``mkdir -p DIR...``,
  ``wait``, ``true``, ``:``, ``exit [N]`` (nothing after it runs), ``. FILE`` (and, in bash,
  ``source FILE``; read with this same grammar);
* a launch: ``[NAME=WORD ...] [exec] [nohup] [env [-i] [NAME=WORD ...]] PROGRAM ARGS
  [REDIRECTIONS] [&]`` where PROGRAM is ``llama-server`` or ``batch-invariance serve`` (a path,
  or a bare name looked up with the ``PATH`` the file sets); after ``exec PROGRAM`` nothing
  runs, unless it is in the background (``exec PROGRAM &`` execs in a subshell).

Redirections go to ``/dev/null``, ``/dev/stdout``, ``/dev/stderr``, another descriptor, or a
``.log`` file. Words are those of :mod:`batch_invariance.deploy.readers.shell_grammar`; the
statements other than launches and ``.`` are :mod:`batch_invariance.deploy.readers.shell_builtins`.
What the file cannot show is the environment it is started with; that boundary is documented.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from batch_invariance.deploy.readers.commands import NotUnderstood
from batch_invariance.deploy.readers.shell_builtins import BUILTINS, path_in, redirects
from batch_invariance.deploy.readers.shell_dialect import Dialect
from batch_invariance.deploy.readers.shell_expand import (
    NotInGrammar,
    ShellState,
    absolute_path_list,
    assignment,
    expand,
    literal,
)
from batch_invariance.deploy.readers.shell_grammar import assignable
from batch_invariance.deploy.readers.shell_launch import (
    Launch,
    check_unexported,
    env_words,
    is_serve,
    starts_server,
)
from batch_invariance.deploy.readers.shell_statements import Statement, statements
from batch_invariance.deploy.readers.shell_words import REDIRECTS, Word, tokenize
from batch_invariance.deploy.readers.shell_writes import Access
from batch_invariance.deploy.readers.source_bytes import (
    BOUND,
    BUDGET_FIX,
    MAX_STATEMENTS,
    ServerBudget,
    text_problem,
)
from batch_invariance.errors import UsageError

#: What a sourced file's callback returns: its text, what in its bytes is not understood, or
#: ``None`` when it cannot be read.
SourceText = str | NotUnderstood | None
#: A file read into statements (or what in its bytes or quotes is not understood; ``None``:
#: a sourced file that cannot be read).
Parsed = list[Statement | NotInGrammar] | NotUnderstood | None
_MAX_SOURCE_DEPTH = 8
_WRAPPERS = frozenset(
    {"exec", "nohup", "env", "/usr/bin/env", "/bin/env", "/usr/bin/nohup", "/bin/nohup"}
)


@dataclass
class ReadWork:
    """What every reader of one read shares: each sourced file's statements, read and parsed
    once by its path, and the statements and servers run so far (bounded)."""

    files: dict[str, Parsed] = field(default_factory=dict)
    statements: int = 0
    servers: ServerBudget = field(default_factory=ServerBudget)


def parse(text: str, name: str, dialect: Dialect) -> list[Statement | NotInGrammar] | NotUnderstood:
    """A file's statements, or what in its bytes or quoting is not understood."""
    problem = text_problem(text, name)
    if problem is not None:  # a byte the shells split or read otherwise than Python
        return problem
    try:
        script = tokenize(text, name)
    except UsageError as exc:  # an unterminated quote, named with its line
        return NotUnderstood(name, 0, str(exc).removeprefix(f"{name}:"))
    return statements(script.tokens, dialect)


@dataclass
class ShellReader:
    """Reads one script (and the files it sources) into launches and constructs outside the
    grammar."""

    name: str
    source_file: Callable[[str], SourceText]
    #: The grammar the file is read in (:mod:`batch_invariance.deploy.readers.shell_dialect`).
    dialect: Dialect = "bash"
    state: ShellState = field(default_factory=ShellState)
    launches: list[Launch] = field(default_factory=list)
    not_understood: list[NotUnderstood] = field(default_factory=list)
    #: Files and folders the script writes, and files it sources (checked against each other
    #: and what its servers read: :mod:`batch_invariance.deploy.readers.shell_writes`).
    written: list[Access] = field(default_factory=list)
    sourced: list[Access] = field(default_factory=list)
    depth: int = 0
    work: ReadWork = field(default_factory=ReadWork)

    def run(self, text: str) -> None:
        self.run_parsed(parse(text, self.name, self.dialect))

    def run_parsed(self, parsed: list[Statement | NotInGrammar] | NotUnderstood) -> None:
        if isinstance(parsed, NotUnderstood):
            self.not_understood.append(parsed)
            return
        for item in parsed:
            if isinstance(item, NotInGrammar):
                self._refuse(item.line, item.construct, item.fix)
                return
            try:
                self._count()
                self._run(item)
            except NotInGrammar as exc:
                self._refuse(exc.line or item.line, exc.construct, exc.fix)
                return  # what follows depends on a state the reader no longer knows
            if self.state.stopped:
                return

    def _refuse(self, line: int, construct: str, fix: str = "") -> None:
        self.not_understood.append(NotUnderstood(self.name, line, construct, fix))

    def _count(self) -> None:
        self.work.statements += 1
        if self.work.statements > MAX_STATEMENTS:
            raise NotInGrammar(
                f"more than {MAX_STATEMENTS} statements run, each sourced file counted each "
                f"time it is sourced ({BOUND})",
                "source each file once, and keep the deploy short",
            )

    def _run(self, s: Statement) -> None:
        state = self.state
        prefix: dict[str, str] = {}
        index = 0
        while index < len(s.words):
            # Assignments apply left to right: a later one sees an earlier one's value.
            pair = assignment(s.words[index], state, extra=prefix)
            if pair is None:
                break
            if not assignable(pair[0]):
                raise NotInGrammar(f"assigning {pair[0]} (the shell itself reads it)")
            prefix[pair[0]] = pair[1]
            index += 1
        words = s.words[index:]
        if not words:
            redirects(self, s, allow=False)
            for name, value in prefix.items():
                state.assign(name, value, s.line)  # each expanded after the ones before it
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
                redirects(self, s)  # ``exec >>log 2>&1``: the shell's own output
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
            return starts_server([literal(w, self.state) for w in words[:2]])
        except NotInGrammar:
            return False

    def _source(self, args: list[Word], s: Statement) -> None:
        redirects(self, s, allow=False)
        if s.words[0].literal == "source" and self.dialect == "sh":
            raise NotInGrammar(
                "source in an sh script (dash has no source builtin: it runs a program of "
                "that name)",
                "write . FILE",
            )
        if len(args) != 1:
            raise NotInGrammar(". with arguments")
        named = literal(args[0], self.state)
        if "/" not in named:
            raise NotInGrammar(
                f". {named} (the shell looks it up on PATH first)",
                f"write . ./{named} or an absolute path",
            )
        path = path_in(self, named)
        if path is not None:
            self.sourced.append(Access(str(path), self.name, s.line, "source"))
        if self.depth >= _MAX_SOURCE_DEPTH:
            raise NotInGrammar(
                f"sourcing {args[0].source} from a file sourced {self.depth} deep (the reader "
                f"follows . at most {_MAX_SOURCE_DEPTH} files deep)",
                "source the files from the script itself",
            )
        parsed = None if path is None else self._parsed(str(path))
        if isinstance(parsed, NotUnderstood):
            self.not_understood.append(parsed)
            raise NotInGrammar(f"sourced file {path} is not understood")
        if parsed is None:
            raise NotInGrammar(f"sourcing {args[0].source}, which cannot be read here")
        inner = ShellReader(str(path), self.source_file, self.dialect, self.state,
                            depth=self.depth + 1, work=self.work)  # fmt: skip
        inner.run_parsed(parsed)
        self.launches.extend(inner.launches)
        self.not_understood.extend(inner.not_understood)
        self.written.extend(inner.written)
        self.sourced.extend(inner.sourced)
        if inner.not_understood:
            raise NotInGrammar(f"sourced file {path} is not understood")

    def _parsed(self, path: str) -> Parsed:
        """A sourced file's statements, read and parsed the first time it is sourced only."""
        if path not in self.work.files:
            text = self.source_file(path)
            if isinstance(text, str):
                self.work.files[path] = parse(text, path, self.dialect)
            else:
                self.work.files[path] = text
        return self.work.files[path]

    # ---- launches ------------------------------------------------------------------------
    def _launch(self, words: list[Word], prefix: dict[str, str], s: Statement) -> None:
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
            argv, env = env_words(argv[1:], env)
            # env execvp()s the program with its new environment: glibc searches that PATH,
            # or its default /bin:/usr/bin when the new environment has none.
            lookup = env.get("PATH", "/bin:/usr/bin")
        if not starts_server(argv):
            raise NotInGrammar(
                f"running {argv[0] if argv else 'nothing'} (not in the grammar)",
                "the grammar runs llama-server or batch-invariance serve; do other work "
                "outside the deploy file",
            )
        crossed = self.work.servers.spend(argv, env)
        if crossed is not None:  # before anything reads its words
            raise NotInGrammar(crossed, BUDGET_FIX)
        redirects(self, s)
        check_unexported(prefix, state)
        search = state.variables.get("PATH") if "PATH" in state.exported else None
        if "PATH" in prefix:  # the shell looks the program up with a prefix PATH
            if not absolute_path_list(prefix["PATH"]):
                raise NotInGrammar(f"PATH={prefix['PATH']} (every folder must be absolute)")
            search = prefix["PATH"]
        if lookup is not None:
            search = lookup
        self.launches.append(Launch(f"{self.name}:{s.line}", tuple(argv), env, state.cwd, search))
        if replaced and not s.background:
            state.stopped = True  # exec: the shell is gone; nothing after it runs
        # ``exec PROGRAM &`` execs in the background subshell: the script goes on.

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


_BUILTINS: dict[str, Callable[[ShellReader, list[Word], Statement], None]] = {
    **BUILTINS,
    ".": ShellReader._source,
    "source": ShellReader._source,
}

__all__ = ["REDIRECTS", "Launch", "NotInGrammar", "ReadWork",
           "ShellReader", "ShellState", "expand", "is_serve", "parse", "starts_server"]  # fmt: skip
