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
in order (:mod:`batch_invariance.deploy.env_file`; ``-`` = absent is fine), minus
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

from batch_invariance.deploy.commands import DeployRead, NotUnderstood, ServerCommand
from batch_invariance.deploy.env_file import NAME, read_env_file

#: systemd's unit folders for system services, highest priority first (systemd.unit(5)).
UNIT_DIRS = (
    Path("/etc/systemd/system"), Path("/run/systemd/system"),
    Path("/usr/local/lib/systemd/system"), Path("/usr/lib/systemd/system"),
    Path("/lib/systemd/system"),
)  # fmt: skip
#: Files whose ``DefaultEnvironment=`` reaches every service (systemd-system.conf(5)).
MANAGER_CONF = (Path("/etc/systemd/system.conf"), Path("/etc/systemd/system.conf.d"))
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
_EXEC_WORD = re.compile(r'"[^"]*"|\'[^\']*\'|\S+')
_FIX_UNIT = "keep the unit to the keys in docs/deploy.md, or ExecStart= batch-invariance serve"


@dataclass
class _Unit:
    """What the files of one service say, as systemd merges them."""

    environment: dict[str, str] = field(default_factory=dict)
    #: (path, optional, as written, ``file:line``) of each ``EnvironmentFile=``.
    env_files: list[tuple[str, bool, str, str]] = field(default_factory=list)
    unset: set[str] = field(default_factory=set)
    workdir: str = "/"
    user: str | None = None
    exec_start: list[tuple[str, str]] = field(default_factory=list)
    bad: list[NotUnderstood] = field(default_factory=list)
    #: ``file:line`` of the setting being read.
    where: str = ""


def _lines(text: str, shown: str, bad: list[NotUnderstood]) -> list[tuple[int, str]]:
    """Logical lines (continuations joined with a space), comments and blanks dropped."""
    out: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        if "\r" in raw or re.search(r"[\x00-\x08\x0b-\x1f]", raw):
            bad.append(NotUnderstood(shown, number, "a CR byte or control character",
                                     "convert with dos2unix"))  # fmt: skip
            return []
        line = raw.strip()
        if buffer and line.startswith(("#", ";")):
            bad.append(NotUnderstood(shown, number, "a comment inside a \\ continuation",
                                     "move the comment above the setting"))  # fmt: skip
            return []
        if not buffer:
            start = number
            if not line or line.startswith(("#", ";")):
                continue
        if line.endswith("\\"):
            buffer.append(line[:-1])
            continue
        buffer.append(line)
        out.append((start, " ".join(buffer)))
        buffer = []
    if buffer:
        bad.append(NotUnderstood(shown, start, "a \\ continuation at the end of the file"))
    return out


def _read_file(unit: _Unit, text: str, shown: str) -> None:
    section = ""
    for number, line in _lines(text, shown, unit.bad):
        if line.startswith("["):
            section = line.strip()[1:-1] if line.endswith("]") else ""
            if section not in ("Unit", "Service", "Install"):
                unit.bad.append(NotUnderstood(shown, number, f"section {line}", _FIX_UNIT))
                return
            continue
        key, eq, value = (p.strip() for p in line.partition("="))
        try:
            if not eq or not section:
                raise _Refused(f"line {line[:60]!r} (not Key=value in a section)")
            if "%" in value:
                raise _Refused(f"a % specifier in {key}=", "write the value out")
            unit.where = f"{shown}:{number}"
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


def _environment(unit: _Unit, value: str) -> None:
    if not value:
        unit.environment = {}
        return
    for word in _EXEC_WORD.findall(value):
        body = word[1:-1] if word[:1] == '"' and word.endswith('"') else word
        name, eq, text = body.partition("=")
        if (
            not eq
            or not NAME.fullmatch(name)
            or not _VALUE.fullmatch(text)
            or (body is word and " " in text)
        ):
            raise _Refused(f"Environment= word {word[:40]}", 'write NAME=VALUE or "NAME=A B"')
        unit.environment[name] = text


def _environment_file(unit: _Unit, value: str) -> None:
    optional = value.startswith("-")
    path = value[1:] if optional else value
    if not path.startswith("/") or not _VALUE.fullmatch(path) or " " in path:
        raise _Refused(f"EnvironmentFile={value} (an absolute path)")
    unit.env_files.append((path, optional, value, unit.where))


def _unset(unit: _Unit, value: str) -> None:
    for word in value.split():
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
    if value[:1] in "@:+!|" and value:
        raise _Refused(f"ExecStart= prefix {value[0]}", "no prefix other than -")
    argv: list[str] = []
    for word in _EXEC_WORD.findall(value):
        quoted = word[:1] in "\"'" and word.endswith(word[:1]) and len(word) > 1
        body = word[1:-1] if quoted else word
        if "\\" in body or word == ";" or ("'" in body or '"' in body):
            raise _Refused(f"ExecStart= word {word[:40]}", "plain words, whole-word quotes")
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", body)
        if whole and not quoted:
            argv.extend(_variable(whole.group(1), env).split())
            continue

        def braced(match: re.Match[str]) -> str:
            return _variable(match.group(1), env)

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


def drop_in_files(unit_path: Path, root: Path = Path("/")) -> list[Path]:
    """The drop-ins systemd merges into ``unit_path``, in the order it applies them (``root``:
    the file system root systemd's unit folders are under, as ``systemd-analyze --root``)."""
    name = unit_path.name
    kind = name.rsplit(".", 1)[-1]
    stem = name[: -len(kind) - 1]
    names = [f"{kind}.d"]
    parts = stem.split("-")
    names += [f"{'-'.join(parts[:i])}-.{kind}.d" for i in range(1, len(parts))]
    names.append(f"{name}.d")
    folders = [unit_path.parent]
    systemd_dirs = [root / d.relative_to("/") for d in UNIT_DIRS]
    if unit_path.parent in systemd_dirs:
        folders = systemd_dirs
    chosen: dict[str, Path] = {}
    for folder in folders:
        for sub in names:
            directory = folder / sub
            if directory.is_dir():
                for conf in directory.glob("*.conf"):
                    chosen.setdefault(conf.name, conf)
    return [chosen[k] for k in sorted(chosen)]


def _manager_environment() -> list[NotUnderstood]:
    out: list[NotUnderstood] = []
    files = [MANAGER_CONF[0], *sorted(MANAGER_CONF[1].glob("*.conf"))]
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for number, line in enumerate(text.split("\n"), start=1):
            if re.match(r"\s*DefaultEnvironment\s*=\s*\S", line):
                out.append(NotUnderstood(str(path), number, "DefaultEnvironment= of the "
                                         "service manager reaches every service"))  # fmt: skip
    return out


def _where(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def unit_commands(path: Path, text: str) -> DeployRead:
    """The server a unit (with its drop-ins) starts, with the environment systemd gives it."""
    unit = _Unit()
    if "@" in path.name:
        unit.bad.append(NotUnderstood(path.name, 0, "a template unit (its instance is a "
                                      "specifier)", "write a plain unit"))  # fmt: skip
    _read_file(unit, text, path.name)
    for conf in drop_in_files(path):
        try:
            _read_file(unit, conf.read_text(encoding="utf-8"), str(conf))
        except (OSError, UnicodeDecodeError):
            unit.bad.append(NotUnderstood(str(conf), 0, "a drop-in that cannot be read here"))
    unit.bad.extend(_manager_environment())
    env = dict(unit.environment)
    notes: list[str] = []
    for file, optional, written, where in unit.env_files:
        loaded = read_env_file(Path(file), file)
        if loaded is None:
            if optional and not os.path.lexists(file):
                notes.append(f"EnvironmentFile={written} is absent here: nothing set from it")
                continue
            shown, _, line = where.rpartition(":")
            unit.bad.append(
                NotUnderstood(shown, int(line), f"EnvironmentFile={written}, which cannot be "
                              "read here", "put the file on this host, or write -PATH if it "
                              "is optional")
            )  # fmt: skip
            continue
        unit.bad.extend(loaded.not_understood)
        env.update(loaded.values)
    for name in unit.unset:
        env.pop(name, None)
    if len(unit.exec_start) != 1:
        unit.bad.append(
            NotUnderstood(
                *_where(unit.exec_start[0][0] if unit.exec_start else f"{path.name}:0"),
                f"{len(unit.exec_start)} ExecStart= command lines after resets "
                f"({', '.join(w for w, _ in unit.exec_start)}; exactly one runs a server)",
                "reset with an empty ExecStart= before the one that runs",
            )
        )
        return DeployRead((), tuple(unit.bad))
    where, value = unit.exec_start[0]
    try:
        argv = exec_argv(value, env)
    except _Refused as exc:
        file, _, line = where.rpartition(":")
        unit.bad.append(NotUnderstood(file, int(line), exc.construct, exc.fix))
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
        origin=where, argv=tuple(argv), env=env,
        base_dir=Path(unit.workdir), search_path=None, config_unknown=config_unknown,
        notes=tuple(notes),
    )  # fmt: skip
    return DeployRead((command,), tuple(unit.bad))


__all__ = ["KEYS", "UNIT_DIRS", "drop_in_files", "exec_argv", "unit_commands"]
