"""Reading a systemd service inside a closed grammar, with every file systemd merges into it.

The files: the unit, then its drop-ins (``service.d/``, ``PREFIX-.service.d/`` for dashed
names, ``NAME.service.d/``; every ``*.conf``, sorted by file name across folders, a name in a
folder searched earlier masking the same name later; systemd.unit(5), "Description").
The folders searched are the unit's own folder and, when that is one of systemd's unit
folders, all of them (``/etc``, ``/run``, ``/usr/local/lib``, ``/usr/lib``).

Each line is empty, a comment (``#``/``;`` first), a section header or ``Key=value`` with a
key of :data:`KEYS` (systemd.syntax(5)). A ``\\`` at the end continues a line; a comment inside
a continuation is not understood (systemd versions differ). ``%`` specifiers, ``$`` outside
``ExecStart=`` and a backslash anywhere else are not understood. The service's environment is
every ``Environment=`` in order (an empty one resets), overridden by every ``EnvironmentFile=``
in order (:mod:`batch_invariance.deploy.readers.env_file`; ``-`` = absent is fine), minus
``UnsetEnvironment=`` (systemd.exec(5), "Environment"). ``ExecStart=`` (an empty one resets;
exactly one must remain) is split with systemd's quoting, ``$NAME`` as a whole word split at
whitespace, ``${NAME}`` not split (systemd.service(5), "Command lines").
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batch_invariance.deploy.readers.commands import DeployRead, NotUnderstood, ServerCommand
from batch_invariance.deploy.readers.env_file import NAME, read_env_file
from batch_invariance.deploy.readers.path_trust import TRUST_FIX, trust_problem
from batch_invariance.deploy.readers.source_bytes import (
    BLANKS,
    BOUND,
    BUDGET_FIX,
    MAX_EXPANDED,
    ServerBudget,
    read_source,
    split_blanks,
    text_problem,
)
from batch_invariance.deploy.readers.systemd_files import (
    UNIT_DIRS,
    WHITESPACE,
    drop_in_files,
    logical_lines,
    manager_environment,
)

#: Keys that change nothing the server computes, with the values they may take (``None``:
#: any plain value).
_NEUTRAL: dict[str, dict[str, frozenset[str] | None]] = {
    "Unit": {k: None for k in (
        "Description", "Documentation", "After", "Before", "Wants", "Requires", "BindsTo",
        "PartOf", "Conflicts", "StartLimitIntervalSec", "StartLimitBurst")},
    "Install": {k: None for k in ("WantedBy", "RequiredBy", "Alias", "Also")},
    "Service": {
        "Type": frozenset({"simple", "exec"}),
        "StandardOutput": frozenset({"journal", "null", "inherit", "journal+console"}),
        "StandardError": frozenset({"journal", "null", "inherit", "journal+console"}),
        **{k: None for k in (
            "Group", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
            "TimeoutSec", "KillSignal", "KillMode", "SuccessExitStatus", "LimitNOFILE",
            "LimitMEMLOCK", "SyslogIdentifier", "NoNewPrivileges", "PrivateTmp",
            "ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
            "ProtectControlGroups", "RestrictRealtime", "LockPersonality")},
    },
}  # fmt: skip
#: Keys read (modelled), all in ``[Service]``.
_READ = frozenset(
    {"ExecStart", "Environment", "EnvironmentFile", "UnsetEnvironment", "WorkingDirectory",
     "User"}
)  # fmt: skip
KEYS = {section: frozenset(keys) for section, keys in _NEUTRAL.items()}
_VALUE = re.compile(r"[A-Za-z0-9_./:,@+=\- ]*")
_FIX_UNIT = "keep the unit to the keys in docs/deploy.md, or ExecStart= batch-invariance serve"


@dataclass
class _Unit:
    """What the files of one service say, as systemd merges them."""

    environment: dict[str, str] = field(default_factory=dict)
    #: (path, optional, as written, (file, line)) of each ``EnvironmentFile=``.
    env_files: list[tuple[str, bool, str, tuple[str, int]]] = field(default_factory=list)
    unset: set[str] = field(default_factory=set)
    workdir: str = "/"
    user: str | None = None
    exec_start: list[tuple[tuple[str, int], str]] = field(default_factory=list)
    bad: list[NotUnderstood] = field(default_factory=list)
    #: (file, line) of the setting being read.
    where: tuple[str, int] = ("", 0)


def _read_file(unit: _Unit, text: str, shown: str) -> None:
    problem = text_problem(text, shown)
    if problem is not None:  # bytes systemd splits or reads otherwise than Python
        unit.bad.append(problem)
        return
    section = ""
    for number, line in logical_lines(text, shown, unit.bad):
        if line.startswith("["):
            section = line[1:-1] if line.endswith("]") else ""
            if section not in ("Unit", "Service", "Install"):
                unit.bad.append(NotUnderstood(shown, number, f"section {line}", _FIX_UNIT))
                return
            continue
        key, eq, value = (p.strip(WHITESPACE) for p in line.partition("="))
        try:
            if not eq or not section:
                raise _Refused(f"line {line[:60]!r} (not Key=value in a section)")
            if "%" in value:
                raise _Refused(f"a % specifier in {key}=", "write the value out")
            unit.where = (shown, number)
            _setting(unit, section, key, value)
        except _Refused as exc:
            unit.bad.append(NotUnderstood(shown, number, exc.construct, exc.fix or _FIX_UNIT))


class _Refused(Exception):
    def __init__(self, construct: str, fix: str = "") -> None:
        super().__init__(construct)
        self.construct, self.fix = construct, fix


def _setting(unit: _Unit, section: str, key: str, value: str) -> None:
    if section == "Service" and key in _READ:
        _SETTINGS[key](unit, value)
        return
    allowed = _NEUTRAL.get(section, {})
    if key not in allowed:
        raise _Refused(f"{key}= in [{section}] (not in the grammar)")
    choices = allowed[key]
    if "$" in value or "\\" in value or not _VALUE.fullmatch(value):
        raise _Refused(f"{key}={value[:40]} (only plain values)")
    if choices is not None and value not in choices:
        raise _Refused(f"{key}={value}", f"{key}= one of {', '.join(sorted(choices))}")


def _words(value: str, key: str) -> list[tuple[str, str]]:
    """(body, quote) of each word of a value split at blanks, as systemd's
    ``extract_first_word`` splits it, for the words on which it and this reader agree: a word
    quoted whole (``"A B"``, ``'A B'``) or not at all. A quote inside a word (``A="B C"``,
    ``"A"B``: systemd joins the pieces into one word) or an unterminated one is refused."""
    words: list[tuple[str, str]] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char in BLANKS:
            index += 1
            continue
        if char in "\"'":
            end = value.find(char, index + 1)
            if end < 0 or (end + 1 < len(value) and value[end + 1] not in BLANKS):
                raise _Refused(f"{key}= word {value[index : index + 40]} (a quote that does "
                               "not enclose a whole word)", "quote whole words only")  # fmt: skip
            words.append((value[index + 1 : end], char))
            index = end + 1
            continue
        end = index
        while end < len(value) and value[end] not in BLANKS:
            end += 1
        word = value[index:end]
        if '"' in word or "'" in word:
            raise _Refused(f"{key}= word {word[:40]} (a quote inside a word)",
                           "quote whole words only")  # fmt: skip
        words.append((word, ""))
        index = end
    return words


def _environment(unit: _Unit, value: str) -> None:
    if not value:
        unit.environment = {}
        return
    for body, quote in _words(value, "Environment"):
        name, eq, text = body.partition("=")
        if (
            not eq
            or quote == "'"
            or not NAME.fullmatch(name)
            or not _VALUE.fullmatch(text)
            or (not quote and " " in text)
        ):
            shown = f"{quote}{body}{quote}"[:40]
            raise _Refused(f"Environment= word {shown}", 'write NAME=VALUE or "NAME=A B"')
        unit.environment[name] = text


def _environment_file(unit: _Unit, value: str) -> None:
    optional = value.startswith("-")
    path = value[1:] if optional else value
    if not path.startswith("/") or not _VALUE.fullmatch(path) or " " in path:
        raise _Refused(f"EnvironmentFile={value} (an absolute path)")
    unit.env_files.append((path, optional, value, unit.where))


def _unset(unit: _Unit, value: str) -> None:
    for word in split_blanks(value):
        if not NAME.fullmatch(word):
            raise _Refused(f"UnsetEnvironment={word}", "UnsetEnvironment= NAME ...")
        unit.unset.add(word)


def _workdir(unit: _Unit, value: str) -> None:
    if not value.startswith("/") or not _VALUE.fullmatch(value) or " " in value:
        raise _Refused(f"WorkingDirectory={value}", "an absolute folder without - or ~")
    unit.workdir = value


def _user(unit: _Unit, value: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]*", value):
        raise _Refused(f"User={value}")
    unit.user = value


def _exec_start(unit: _Unit, value: str) -> None:
    if not value:
        unit.exec_start = []
        return
    unit.exec_start.append((unit.where, value))


_SETTINGS: dict[str, Callable[[_Unit, str], None]] = {
    "Environment": _environment, "EnvironmentFile": _environment_file,
    "UnsetEnvironment": _unset, "WorkingDirectory": _workdir, "User": _user,
    "ExecStart": _exec_start,
}  # fmt: skip


def exec_argv(value: str, env: dict[str, str]) -> list[str]:
    """An ``ExecStart=`` command line as systemd splits and expands it (the grammar's part)."""
    if value.startswith("-"):
        value = value[1:]
    if value[:1] in "@:+!|-" and value:
        raise _Refused(f"ExecStart= prefix {value[0]}", "no prefix other than -")
    if value[:1] in tuple(BLANKS):
        raise _Refused("ExecStart= with a blank after its prefix (systemd reads an empty path)")
    argv: list[str] = []
    spent = [0]

    def expanded(name: str) -> str:
        """A variable's value, counted: ``$A $A ...`` of a long ``A`` is work the unit's size
        does not show."""
        text = _variable(name, env)
        spent[0] += len(text)
        if spent[0] > MAX_EXPANDED:
            raise _Refused(f"ExecStart= expanding to more than {MAX_EXPANDED} characters ({BOUND})")
        return text

    for body, quote in _words(value, "ExecStart"):
        word = f"{quote}{body}{quote}"
        if "\\" in body or word == ";":
            raise _Refused(f"ExecStart= word {word[:40]}", "plain words, whole-word quotes")
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", body)
        if whole and not quote:
            # $NAME as a whole word: the value split at systemd's WHITESPACE.
            argv.extend(split_blanks(expanded(whole.group(1)), WHITESPACE))
            continue

        def braced(match: re.Match[str]) -> str:
            return expanded(match.group(1))

        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", braced, body)
        if "$" in text or not _VALUE.fullmatch(text):
            raise _Refused(f"ExecStart= word {word[:40]}", "only $NAME words and ${NAME}")
        argv.append(text)
    if not argv or not argv[0].startswith("/"):
        raise _Refused("ExecStart= whose program is not an absolute path", "write /usr/bin/...")
    return argv


def _variable(name: str, env: dict[str, str]) -> str:
    if name not in env:
        raise _Refused(f"${name}, which no Environment= of this unit sets")
    return env[name]


def _environment_files(unit: _Unit, env: dict[str, str]) -> list[str]:
    """Each ``EnvironmentFile=`` applied over ``env`` in order; the notes of optional ones
    absent here. A file named again is read once, where it is named last (what it sets is
    what it sets there: the later naming overrides every earlier one), so naming one file
    thousands of times is not thousands of reads."""
    last: dict[tuple[str, bool], tuple[str, bool, str, tuple[str, int]]] = {}
    for entry in reversed(unit.env_files):
        last.setdefault(entry[:2], entry)
    notes: list[str] = []
    for file, optional, written, where in reversed(list(last.values())):
        loaded = read_env_file(Path(file), file)
        if loaded is None:
            if optional and not os.path.lexists(file):
                problem = trust_problem("EnvironmentFile", file, may_be_absent=True)
                if problem is not None:  # absent, but others could create it
                    unit.bad.append(NotUnderstood(*where, problem, TRUST_FIX))
                    continue
                notes.append(f"EnvironmentFile={written} is absent here: nothing set from it")
                continue
            unit.bad.append(
                NotUnderstood(*where, f"EnvironmentFile={written}, which cannot be "
                              "read here", "put the file on this host, or write -PATH if it "
                              "is optional")
            )  # fmt: skip
            continue
        unit.bad.extend(loaded.not_understood)
        env.update(loaded.values)
    return notes


def _exec_lines(unit: _Unit) -> str:
    return ", ".join(f"{file}:{line}" for (file, line), _ in unit.exec_start)


def unit_commands(path: Path, text: str) -> DeployRead:
    """The server a unit (with its drop-ins) starts, with the environment systemd gives it."""
    unit = _Unit()
    if "@" in path.name:
        unit.bad.append(NotUnderstood(path.name, 0, "a template unit (its instance is a "
                                      "specifier)", "write a plain unit"))  # fmt: skip
    _read_file(unit, text, path.name)
    for conf in drop_in_files(path):
        body = read_source(conf, str(conf))
        if body is None:
            unit.bad.append(NotUnderstood(str(conf), 0, "a drop-in that cannot be read here"))
        elif isinstance(body, NotUnderstood):
            unit.bad.append(body)
        else:
            _read_file(unit, body, str(conf))
    unit.bad.extend(manager_environment())
    env = dict(unit.environment)
    notes = _environment_files(unit, env)
    for name in unit.unset:
        env.pop(name, None)
    if len(unit.exec_start) != 1:
        unit.bad.append(
            NotUnderstood(
                *(unit.exec_start[0][0] if unit.exec_start else (path.name, 0)),
                f"{len(unit.exec_start)} ExecStart= command lines after resets "
                f"({_exec_lines(unit)}; exactly one runs a server)",
                "reset with an empty ExecStart= before the one that runs",
            )
        )
        return DeployRead((), tuple(unit.bad))
    where, value = unit.exec_start[0]
    try:
        argv = exec_argv(value, env)
    except _Refused as exc:
        unit.bad.append(NotUnderstood(*where, exc.construct, exc.fix))
        return DeployRead((), tuple(unit.bad))
    crossed = ServerBudget().spend(argv, env)
    if crossed is not None:  # the gate checks every word of it
        unit.bad.append(NotUnderstood(*where, crossed, BUDGET_FIX))
        return DeployRead((), tuple(unit.bad))
    config_unknown = None
    if unit.user is not None and "XDG_CONFIG_HOME" not in env and "HOME" not in env:
        try:
            env_home = pwd.getpwnam(unit.user).pw_dir
        except KeyError:
            env_home = None
            config_unknown = (
                f"User={unit.user} is not a user here: its ~/.config/llama.cpp/config.ini cannot "
                "be looked up (set Environment=XDG_CONFIG_HOME=/nonexistent)"
            )
        if env_home is not None:
            env = {**env, "HOME": env_home}  # systemd sets HOME for User= (systemd.exec(5))
    elif unit.user is None and "HOME" not in env:
        env = {**env, "HOME": "/root"}  # runs as root: its config file is looked up
    command = ServerCommand(
        origin=f"{where[0]}:{where[1]}", argv=tuple(argv), env=env,
        base_dir=Path(unit.workdir), search_path=None, config_unknown=config_unknown,
        notes=tuple(notes),
    )  # fmt: skip
    return DeployRead((command,), tuple(unit.bad))


__all__ = ["KEYS", "UNIT_DIRS", "drop_in_files", "exec_argv", "unit_commands"]
