"""Commands that run the rest of their words as a command (``sudo``, ``env``, ``nohup`` ...),
and how each changes the environment and folder of the command it runs (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")


class Unmodelled(Exception):
    """A command the reader cannot follow (the message says what)."""


@dataclass(frozen=True)
class Wrapper:
    """A command that runs the rest of its words as a command."""

    #: Options that take the next word as their value.
    value_options: frozenset[str] = frozenset()
    #: Options that take no value.
    flags: frozenset[str] = frozenset()
    #: Positional words before the command (``taskset MASK``, ``timeout 5``).
    positionals: int = 0
    #: It starts the command with an empty environment (``sudo``'s env_reset).
    resets_env: bool = False


WRAPPERS: dict[str, Wrapper] = {
    "exec": Wrapper(frozenset({"-a"}), frozenset({"-l"})),
    "nohup": Wrapper(),
    "setsid": Wrapper(flags=frozenset({"-f", "-w", "-c"})),
    "time": Wrapper(flags=frozenset({"-p"})),
    "command": Wrapper(flags=frozenset({"-p"})),
    "nice": Wrapper(frozenset({"-n"})),
    "ionice": Wrapper(frozenset({"-c", "-n"}), frozenset({"-t"})),
    "taskset": Wrapper(flags=frozenset({"-a", "-c", "--cpu-list", "--all-tasks"}), positionals=1),
    "numactl": Wrapper(frozenset({"-N", "-m", "-C", "-i", "-P"}), frozenset({"-l", "-a"})),
    "chrt": Wrapper(flags=frozenset({"-f", "-r", "-o", "-b", "-i", "-d", "-a"}), positionals=1),
    "timeout": Wrapper(frozenset({"-s", "-k"}), frozenset({"-v", "--foreground"}), 1),
    "stdbuf": Wrapper(frozenset({"-i", "-o", "-e"})),
    "sudo": Wrapper(
        frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T"}),
        frozenset({"-b", "-n", "-H", "-k", "-S", "-A", "-P"}),
        resets_env=True,
    ),
    "doas": Wrapper(frozenset({"-u", "-C"}), frozenset({"-n"}), resets_env=True),
    "env": Wrapper(frozenset({"-u", "-C"}), frozenset({"-0", "-v"})),
}


#: (wrapper, option) pairs that start the command with an empty environment.
_CLEARS_ENV = frozenset(
    {("env", "-i"), ("env", "-"), ("env", "--ignore-environment"), ("exec", "-c")}
)


def _plain_option(name: str, wrapper: Wrapper, word: str) -> bool:
    """An option of the wrapper that takes no separate value (``--x=y`` included)."""
    if word in wrapper.flags or (word.startswith("--") and "=" in word):
        return True
    if name == "nice":
        return re.fullmatch(r"-\d+", word) is not None
    return name == "stdbuf" and re.fullmatch(r"-[ioe]\S+", word) is not None


def unwrap(
    name: str, wrapper: Wrapper, args: list[str], env: dict[str, str], cwd: Path | None,
    unknown: tuple[str, ...],
) -> tuple[list[str], dict[str, str], Path | None, tuple[str, ...]]:  # fmt: skip
    """The command a wrapper runs, with the environment and folder it runs it in."""
    if wrapper.resets_env:
        env, unknown = {}, ()
    index = 0
    positionals = wrapper.positionals
    while index < len(args):
        word = args[index]
        option = word.split("=", 1)[0]
        if word == "--":
            index += 1
            break
        if (name, word) in _CLEARS_ENV:
            env, unknown = {}, ()
        elif name == "sudo" and (word == "-E" or option == "--preserve-env"):
            raise Unmodelled("sudo keeps the caller's environment, which the file does not show")
        elif name in ("env", "sudo") and word in ("-C", "-D", "--chdir") and index + 1 < len(args):
            cwd = Path(args[index + 1]) if args[index + 1].startswith("/") else None
            index += 1
        elif name == "env" and word == "-u" and index + 1 < len(args):
            env = {k: v for k, v in env.items() if k != args[index + 1]}
            index += 1
        elif word in wrapper.value_options:
            index += 1
        elif _plain_option(name, wrapper, word):
            pass
        elif word.startswith("-"):
            raise Unmodelled(f"{name} {word} is not modelled")
        elif _ASSIGN.match(word) and name in ("env", "sudo", "doas"):
            key, _, value = word.partition("=")
            env = {**env, key: value}
        elif positionals:
            positionals -= 1
        else:
            break
        index += 1
    return args[index:], env, cwd, unknown
