"""Reading a systemd unit the way systemd starts its service.

Only the ``[Service]`` section runs anything. Its environment is every ``Environment=`` in
order (an empty one resets the list), then every ``EnvironmentFile=`` in order, which
override ``Environment=`` wherever they appear (systemd.exec(5)); ``UnsetEnvironment=`` drops
names. ``ExecStart=`` is split with systemd's quoting and ``$NAME`` / ``${NAME}`` expanded from
that environment; ``WorkingDirectory=`` (``/`` when absent) is where a relative model path
points. Another ``Exec*=`` that mentions a server, a ``PassEnvironment=`` of a variable the
server reads, a ``%`` specifier or an unreadable environment file are not modelled, and the
deploy is not covered.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from batch_invariance.deploy.config import DeployRead, ServerCommand, read_env_file
from batch_invariance.deploy.shell import (
    INERT,
    TRIGGER,
    ShellState,
    expand,
    starts_server,
)
from batch_invariance.deploy.shell_words import Word, tokenize
from batch_invariance.deploy.shell_wrappers import Unmodelled
from batch_invariance.engines.llama_server.env import is_engine_variable

_KEY = re.compile(r"^([A-Za-z]+)\s*=\s*(.*)$")


def _unit_lines(text: str) -> list[tuple[int, str]]:
    """Logical lines: comments (``#``/``;`` first) dropped, ``\\`` continues a line."""
    out: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer:
            start = number
            if stripped.startswith(("#", ";")):
                continue
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        out.append((start, " ".join(buffer)))
        buffer = []
    if buffer:
        out.append((start, " ".join(buffer)))
    return out


def _words(value: str, name: str) -> list[Word]:
    return [t for t in tokenize(value, name).tokens if isinstance(t, Word)]


def unit_commands(text: str, name: str, base_dir: Path) -> DeployRead:
    """The server a unit's ``ExecStart=`` starts, with the environment systemd gives it."""
    section = ""
    environment: dict[str, str] = {}
    env_files: list[str] = []
    unset: set[str] = set()
    workdir: Path | None = Path("/")
    execs: list[tuple[int, str, str]] = []
    unmodelled: list[str] = []
    for number, line in _unit_lines(text):
        where = f"{name}:{number}"
        if line.startswith("["):
            section = line.strip("[] ")
            continue
        match = _KEY.match(line)
        if section != "Service" or match is None:
            if TRIGGER.search(line) and section == "Service":
                unmodelled.append(f"{where}: not a unit setting: {line[:120]}")
            continue
        key, value = match.groups()
        if key == "Environment":
            if not value.strip():
                environment = {}
            for word in _words(value, where):
                literal = word.literal or ""
                if "=" in literal:
                    k, _, v = literal.partition("=")
                    environment[k] = v
        elif key == "EnvironmentFile":
            env_files.append(value.strip())
        elif key == "UnsetEnvironment":
            unset.update(value.split())
        elif key == "WorkingDirectory":
            folder = value.strip().lstrip("-")
            workdir = Path(folder) if folder.startswith("/") else None
        elif key == "PassEnvironment":
            passed = [
                v for v in value.split() if v.startswith("LLAMA_ARG_") or is_engine_variable(v)
            ]
            if passed:
                unmodelled.append(
                    f"{where}: PassEnvironment={' '.join(passed)} takes values from the "
                    "service manager, which the unit does not show"
                )
        elif key.startswith("Exec"):
            execs.append((number, key, value))
    unread: list[str] = []
    for file in env_files:
        loaded = read_env_file(Path(file.lstrip("-")))
        if loaded is None:
            unread.append(file.lstrip("-"))
        else:
            environment.update(loaded)
    for name_ in unset:
        environment.pop(name_, None)
    commands: list[ServerCommand] = []
    state = ShellState(variables=dict(environment), exported=set(environment))
    for number, key, value in execs:
        where = f"{name}:{number}"
        try:
            argv = _exec_argv(value.lstrip("-@:+!|"), where, state)
        except Unmodelled as exc:
            if TRIGGER.search(value):
                unmodelled.append(f"{where}: {key}= {exc}: {value[:120]}")
            continue
        program = PurePosixPath(argv[0]).name if argv else ""
        if key == "ExecStart" and starts_server(argv):
            commands.append(
                ServerCommand(where, tuple(argv), dict(environment), base_dir=workdir,
                              unread_env_files=tuple(unread))
            )  # fmt: skip
        elif TRIGGER.search(value) and program not in INERT:
            unmodelled.append(f"{where}: {key}= runs {program or 'nothing'} (not modelled)")
    return DeployRead(tuple(commands), tuple(unmodelled))


def _exec_argv(value: str, where: str, state: ShellState) -> list[str]:
    if re.search(r"(?<!%)%[A-Za-z]", value):
        raise Unmodelled("a % specifier")
    argv = [f for w in _words(value, where) for f in expand(w, state)]
    if argv and PurePosixPath(argv[0]).name in ("sh", "bash", "dash", "zsh", "env"):
        raise Unmodelled(f"{argv[0]} runs a command the reader does not model")
    return argv
