"""What a launch line of a deploy script starts: the server programs, ``env``'s own words, and
the variables a server reads that the file assigned without exporting (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from batch_invariance.deploy.readers.shell_expand import NAME, NotInGrammar, ShellState

_ENV_CLEAR = frozenset({"-i", "-", "--ignore-environment"})


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


def starts_server(argv: Sequence[str]) -> bool:
    """True when ``argv`` runs llama-server or ``batch-invariance serve`` (by program name;
    what the program is, is checked by content elsewhere)."""
    program = PurePosixPath(argv[0]).name if argv else ""
    return program.startswith("llama-server") or is_serve(argv)


def is_serve(argv: Sequence[str]) -> bool:
    return (
        len(argv) > 1 and PurePosixPath(argv[0]).name == "batch-invariance" and argv[1] == "serve"
    )


def check_unexported(prefix: dict[str, str], state: ShellState) -> None:
    """A variable the server reads assigned without ``export``: whether the server gets it
    depends on whether the caller exported it."""
    unexported = (state.variables.keys() & state.server_reads) - state.exported - prefix.keys()
    if not unexported:
        return  # the usual case, found with set operations (no loop over every variable)
    for name in state.variables:  # the first, in the order the file assigned them
        if name in unexported:
            raise NotInGrammar(
                f"{name} assigned without export (the caller's environment decides whether the "
                "server gets it)",
                f"write export {name}=...",
                line=state.assigned_at.get(name, 0),
            )


def env_words(args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The program words after ``env``'s own (``-i``, ``--``, ``NAME=VALUE``), and the
    environment it gives them (coreutils env takes every word with ``=`` as an assignment)."""
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
        elif "=" in word:  # env takes every word with = as an assignment
            key, _, value = word.partition("=")
            if not NAME.fullmatch(key):
                raise NotInGrammar(f"env {word} (not NAME=VALUE)", "env NAME=VALUE ... PROGRAM")
            env = {**env, key: value}
        else:
            break
        index += 1
    return args[index:], env


__all__ = ["Launch", "check_unexported", "env_words", "is_serve", "starts_server"]
