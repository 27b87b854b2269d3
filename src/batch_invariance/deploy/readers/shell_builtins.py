"""The statements of a deploy shell script that start no server and source no file (pure):
``export``, ``unset``, ``set``, ``cd``, ``echo``/``printf``, ``test``/``[ ]``, ``mkdir -p``,
``wait``/``true``/``:``, ``exit``, and the redirections any statement may carry. Each is
modelled completely over the script's :class:`~batch_invariance.deploy.readers.shell_expand.
ShellState`; anything else raises :class:`~batch_invariance.deploy.readers.shell_expand.
NotInGrammar`. Launches and ``.`` are the reader's own (:mod:`batch_invariance.deploy.readers.
shell`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from batch_invariance.deploy.readers.shell_dialect import Dialect
from batch_invariance.deploy.readers.shell_expand import (
    NAME,
    NotInGrammar,
    ShellState,
    assignment,
    expand,
    literal,
)
from batch_invariance.deploy.readers.shell_grammar import assignable
from batch_invariance.deploy.readers.shell_statements import Statement
from batch_invariance.deploy.readers.shell_words import Word
from batch_invariance.deploy.readers.shell_writes import Access
from batch_invariance.deploy.readers.source_bytes import is_decimal

_SET_LETTERS = re.compile(r"[-+](?:[euxa]+o?|o)")
_SET_NAMES = frozenset({"errexit", "nounset", "xtrace", "pipefail", "allexport"})
_TESTS = frozenset({"-e", "-f", "-d", "-x", "-r", "-s", "-w"})
_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


class Script(Protocol):
    """What a statement reads and changes of the script being read."""

    #: The file, as messages name it.
    name: str
    #: The grammar the file is read in (:mod:`batch_invariance.deploy.readers.shell_dialect`).
    dialect: Dialect
    state: ShellState
    #: Files and folders the script writes (:mod:`batch_invariance.deploy.readers.shell_writes`).
    written: list[Access]


def redirects(script: Script, s: Statement, allow: bool = True) -> None:
    if s.redirects and not allow:
        raise NotInGrammar("a redirection on this statement")
    for op, target in s.redirects:
        text = literal(target, script.state)
        if op.endswith(">&"):
            if not is_decimal(text) or len(text) > 1:
                raise NotInGrammar(f"{op}{text} (not a descriptor 0-9)")
        elif op.endswith("<"):
            if text != "/dev/null":
                raise NotInGrammar(f"input from {text}", "use < /dev/null or none")
        elif text not in _DEVICES:
            if not text.endswith(".log"):
                raise NotInGrammar(
                    f"output written to {text} (it could be a file the server reads)",
                    "send output to a .log file, /dev/null or the journal",
                )
            script.written.append(Access(written_path(script, text), script.name, s.line, "output"))


def written_path(script: Script, text: str) -> str:
    """The absolute path a write lands on; a relative one in a folder the reader could not
    follow could be any file."""
    path = path_in(script, text)
    if path is None:
        raise NotInGrammar(
            f"writing {text}, relative to a folder the reader could not follow (it could "
            "be a file the server reads)",
            "write an absolute path, or cd /DIR || exit 1 before it",
        )
    return str(path)


def path_in(script: Script, text: str) -> Path | None:
    if text.startswith("/"):
        return Path(text)
    return None if script.state.cwd is None else script.state.cwd / text


def export(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
    for word in args:
        pair = assignment(word, script.state)
        if pair is not None:
            script.state.assign(*pair, s.line)
            script.state.exported.add(pair[0])
            continue
        name = word.literal or ""
        if not NAME.fullmatch(name):
            raise NotInGrammar(f"export {word.source}", "export NAME or NAME=VALUE only")
        if name not in script.state.variables:
            raise NotInGrammar(f"export {name} of a variable this file does not set")
        script.state.exported.add(name)


def unset(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
    for word in args:
        name = word.literal or ""
        if not NAME.fullmatch(name) or not assignable(name):
            raise NotInGrammar(f"unset {word.source}")
        script.state.variables.pop(name, None)
        script.state.exported.discard(name)


def set_options(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
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
                raise NotInGrammar(f"set {word} {option or ''}".strip(" "))
            if option == "pipefail" and script.dialect == "sh":
                raise NotInGrammar(
                    "set -o pipefail in an sh script (dash has no pipefail: set fails and "
                    "the script exits)",
                    "drop pipefail, or start the file with #!/bin/bash",
                )
            letters.add({"errexit": "e", "allexport": "a"}.get(option or "", ""))
            index += 1
        if "e" in letters:
            script.state.errexit = on
        if "a" in letters:
            script.state.allexport = on
        index += 1


def cd(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
    if len(args) != 1:
        raise NotInGrammar("cd without exactly one folder")
    target = literal(args[0], script.state)
    if not target.startswith("/"):
        raise NotInGrammar(f"cd {target} (relative)", "cd to an absolute folder")
    guarded = script.state.errexit or s.or_exit is not None
    script.state.cwd = Path(target) if guarded else None


def output(script: Script, args: list[Word], s: Statement) -> None:
    fields = [f for w in args for f in expand(w, script.state)]
    if fields and fields[0].startswith("-"):
        raise NotInGrammar(f"{s.words[0].literal} {fields[0]}", "no options")
    redirects(script, s)


def test(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
    head = s.words[-len(args) - 1].literal
    fields = [literal(w, script.state) for w in args]
    if head == "[":
        if not fields or fields[-1] != "]":
            raise NotInGrammar("[ without ]")
        fields = fields[:-1]
    if len(fields) != 2 or fields[0] not in _TESTS:
        raise NotInGrammar(f"{head} {' '.join(fields)}", "one unary file test: test -x FILE")


def mkdir(script: Script, args: list[Word], s: Statement) -> None:
    redirects(script, s, allow=False)
    if "PATH" in script.state.variables:
        raise NotInGrammar(
            "mkdir after PATH is set (which program runs depends on it)",
            "create folders before the deploy, or set PATH after mkdir",
        )
    fields = [literal(w, script.state) for w in args]
    if not fields or fields[0] != "-p" or any(f.startswith("-") for f in fields[1:]):
        raise NotInGrammar("mkdir without -p, or with other options", "mkdir -p DIR ...")
    for folder in fields[1:]:
        script.written.append(Access(written_path(script, folder), script.name, s.line, "folder"))


def plain(script: Script, args: list[Word], s: Statement) -> None:
    if args:
        raise NotInGrammar(f"{s.words[0].literal} {args[0].source}")
    redirects(script, s, allow=False)


def exit_(script: Script, args: list[Word], s: Statement) -> None:
    if len(args) > 1 or (args and not is_decimal(args[0].literal or "")):
        raise NotInGrammar("exit with other than one number")
    script.state.stopped = True


#: The statements by their command word (``.`` and ``source`` are the reader's: they read
#: another file with it).
BUILTINS: dict[str, Callable[[Script, list[Word], Statement], None]] = {
    "export": export,
    "unset": unset,
    "set": set_options,
    "cd": cd,
    "echo": output,
    "printf": output,
    "test": test,
    "[": test,
    "mkdir": mkdir,
    "wait": plain,
    "true": plain,
    ":": plain,
    "exit": exit_,
}
