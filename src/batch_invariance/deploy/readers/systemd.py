"""Reading a systemd service (pure, but for reading its drop-ins): an allowlist of keys.

The files: the unit, then the drop-ins this host shows for it, found and ordered as systemd
does (systemd.unit(5)). What the manager adds at run time (``transient``, generators,
``DefaultEnvironment=``) is on the serving host only (docs/deploy.md says so).

Each line is empty, a comment, a section header or ``Key=value`` (``\\`` continues it). Read:
``ExecStart=`` (an empty one resets; exactly one must remain; no prefix but ``-``; split with
systemd's quoting, written out: no ``$``), ``Environment=`` and ``WorkingDirectory=``. Allowed:
keys that change nothing serve runs (:data:`_NEUTRAL`). Any other key, a ``%`` specifier or a
``$`` is refused with its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from batch_invariance.deploy.readers.source_bytes import (
    BLANKS,
    BUDGET_FIX,
    ServerBudget,
    read_source,
    text_problem,
)
from batch_invariance.gate.server_command import DeployRead, NotUnderstood, ServerCommand

#: systemd's ``WHITESPACE``: what it strips around keys and values.
WHITESPACE = " \t\n\r"
#: systemd's unit folders for system services, highest priority first (systemd.unit(5)).
UNIT_DIRS = (
    Path("/etc/systemd/system"), Path("/run/systemd/system"),
    Path("/usr/local/lib/systemd/system"), Path("/usr/lib/systemd/system"),
    Path("/lib/systemd/system"),
)  # fmt: skip
_ANY = None
#: Keys that change nothing serve runs, with the values they may take (``None``: any plain
#: value).
_NEUTRAL: dict[str, dict[str, frozenset[str] | None]] = {
    "Unit": dict.fromkeys((
        "Description", "Documentation", "After", "Before", "Wants", "Requires", "BindsTo",
        "PartOf", "Conflicts", "StartLimitIntervalSec", "StartLimitBurst"), _ANY),
    "Install": dict.fromkeys(("WantedBy", "RequiredBy", "Alias", "Also"), _ANY),
    "Service": {
        "Type": frozenset({"simple", "exec"}),
        "StandardOutput": frozenset({"journal", "null", "inherit", "journal+console"}),
        "StandardError": frozenset({"journal", "null", "inherit", "journal+console"}),
        **dict.fromkeys((
            "User", "Group", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
            "TimeoutSec", "KillSignal", "KillMode", "SuccessExitStatus", "SyslogIdentifier",
            "Nice", "CPUQuota", "CPUWeight", "MemoryMax", "MemoryHigh", "TasksMax",
            "OOMScoreAdjust",
            "LimitNOFILE", "LimitMEMLOCK", "LimitNPROC", "LimitCORE", "LimitAS", "LimitSTACK",
            "NoNewPrivileges", "PrivateTmp", "ProtectSystem", "ProtectHome",
            "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
            "RestrictRealtime", "LockPersonality"), _ANY),
    },
}  # fmt: skip
_VALUE = re.compile(r"[A-Za-z0-9_./:,@+=%\- ]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIX_UNIT = "keep the unit to the keys in docs/deploy.md and ExecStart=batch-invariance serve ..."


class _Refused(Exception):
    def __init__(self, construct: str, fix: str = "") -> None:
        super().__init__(construct)
        self.construct, self.fix = construct, fix


@dataclass
class _Unit:
    """What the files of one service say, as systemd merges them."""

    environment: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    exec_start: list[tuple[tuple[str, int], str]] = field(default_factory=list)
    bad: list[NotUnderstood] = field(default_factory=list)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Logical lines as systemd forms them, in one pass: a comment line is dropped; an odd
    run of backslashes at a line's end becomes a space and the next line is appended."""
    out: list[tuple[int, str]] = []
    pieces: list[str] = []
    start = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        if raw.lstrip(BLANKS)[:1] in ("#", ";"):
            if pieces:
                raise _Refused("a comment inside a \\ continuation", "move it above the setting")
            continue
        start = start if pieces else number
        if (len(raw) - len(raw.rstrip("\\"))) % 2:
            pieces += (raw[:-1], " ")
            continue
        line = "".join((*pieces, raw)).strip(WHITESPACE)
        pieces = []
        if line:
            out.append((start, line))
    if pieces:
        raise _Refused("a \\ continuation at the end of the file")
    return out


def drop_in_files(unit_path: Path, root: Path = Path("/")) -> list[Path]:
    """The drop-ins systemd merges into ``unit_path`` that this host shows, in the order it
    applies them (``root``: where systemd's unit folders are, as ``systemd-analyze --root``)."""
    name = unit_path.name
    kind = name.rsplit(".", 1)[-1]
    parts = name[: -len(kind) - 1].split("-")
    names = [f"{kind}.d", *(f"{'-'.join(parts[:i])}-.{kind}.d" for i in range(1, len(parts)))]
    names.append(f"{name}.d")
    systemd_dirs = [root / d.relative_to("/") for d in UNIT_DIRS]
    folders = systemd_dirs if unit_path.parent in systemd_dirs else [unit_path.parent]
    chosen: dict[str, Path] = {}
    for folder in folders:
        for sub in names:
            for conf in (folder / sub).glob("*.conf"):
                chosen.setdefault(conf.name, conf)
    return [chosen[k] for k in sorted(chosen)]


def _read_file(unit: _Unit, text: str, shown: str) -> None:
    problem = text_problem(text, shown)
    if problem is not None:  # bytes systemd splits or reads otherwise than Python
        unit.bad.append(problem)
        return
    try:
        lines = logical_lines(text)
    except _Refused as exc:
        unit.bad.append(NotUnderstood(shown, 0, exc.construct, exc.fix))
        return
    section = ""
    for number, line in lines:
        if line.startswith("["):
            section = line[1:-1] if line.endswith("]") else line
            if section not in _NEUTRAL:
                unit.bad.append(NotUnderstood(shown, number, f"section {line}", _FIX_UNIT))
                return
            continue
        key, eq, value = (p.strip(WHITESPACE) for p in line.partition("="))
        try:
            if not eq or not section:
                raise _Refused(f"line {line[:60]!r} (not Key=value in a section)")
            if "%" in value:
                raise _Refused(f"a % specifier in {key}=", "write the value out")
            _setting(unit, section, key, value, (shown, number))
        except _Refused as exc:
            unit.bad.append(NotUnderstood(shown, number, exc.construct, exc.fix or _FIX_UNIT))


def _setting(unit: _Unit, section: str, key: str, value: str, where: tuple[str, int]) -> None:
    read = section == "Service"
    if read and key == "ExecStart":
        unit.exec_start = [*unit.exec_start, (where, value)] if value else []
    elif read and key == "Environment":
        _environment(unit, value)
    elif read and key == "WorkingDirectory":
        if not value.startswith("/") or not _VALUE.fullmatch(value) or " " in value:
            raise _Refused(f"WorkingDirectory={value}", "an absolute folder without - or ~")
        unit.workdir = value
    elif key not in _NEUTRAL[section]:
        raise _Refused(f"{key}= in [{section}] (not on the allowlist)")
    elif "$" in value or "\\" in value or not _VALUE.fullmatch(value):
        raise _Refused(f"{key}={value[:40]} (only plain values)")
    elif (choices := _NEUTRAL[section][key]) is not None and value not in choices:
        raise _Refused(f"{key}={value}", f"{key}= one of {', '.join(sorted(choices))}")


def _environment(unit: _Unit, value: str) -> None:
    if not value:
        unit.environment = {}
        return
    for body, quote in _words(value, "Environment"):
        name, eq, text = body.partition("=")
        if (
            not eq
            or quote == "'"
            or not _NAME.fullmatch(name)
            or not _VALUE.fullmatch(text)
            or (not quote and " " in text)
        ):
            shown = f"{quote}{body}{quote}"[:40]
            raise _Refused(f"Environment= word {shown}", 'write NAME=VALUE or "NAME=A B"')
        unit.environment[name] = text


def _words(value: str, key: str) -> list[tuple[str, str]]:
    """(body, quote) of each word of a value split at blanks, as systemd's
    ``extract_first_word`` splits it, for the words on which it and this reader agree: a word
    quoted whole (``"A B"``, ``'A B'``) or not at all. A quote inside a word (``A="B C"``,
    ``"A"B``: systemd joins the pieces into one word) or an unterminated one is refused."""
    words: list[tuple[str, str]] = []
    for token in re.findall(r"""(?:"[^"]*"|'[^']*'|[^ \t"'])+|["']""", value):
        quote = token[0] if token[0] in "\"'" else ""
        body = token[1:-1] if quote else token
        if (quote and (len(token) < 2 or token[-1] != quote or quote in body)) or (
            not quote and ('"' in token or "'" in token)
        ):
            raise _Refused(f"{key}= word {token[:40]} (a quote that does not enclose a whole "
                           "word)", "quote whole words only")  # fmt: skip
        words.append((body, quote))
    return words


def exec_argv(value: str) -> list[str]:
    """An ``ExecStart=`` command line as systemd splits it (the allowlist's part)."""
    if value.startswith("-"):
        value = value[1:]
    if value[:1] in "@:+!|-" and value:
        raise _Refused(f"ExecStart= prefix {value[0]}", "no prefix other than -")
    if value[:1] in tuple(BLANKS):
        raise _Refused("ExecStart= with a blank after its prefix (systemd reads an empty path)")
    argv: list[str] = []
    for body, quote in _words(value, "ExecStart"):
        word = f"{quote}{body}{quote}"
        if "$" in body:  # systemd expands it, quoted or not: the serve line is written out
            raise _Refused(f"ExecStart= word {word[:40]} (a $ expansion)", "write the value out")
        if "\\" in body or word == ";" or not _VALUE.fullmatch(body):
            raise _Refused(f"ExecStart= word {word[:40]}", "plain words, whole-word quotes")
        argv.append(body)
    if not argv or not argv[0].startswith("/"):
        raise _Refused("ExecStart= whose program is not an absolute path", "write /usr/bin/...")
    return argv


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
    env = dict(unit.environment)
    if len(unit.exec_start) != 1:
        lines = ", ".join(f"{file}:{line}" for (file, line), _ in unit.exec_start)
        unit.bad.append(NotUnderstood(
            *(unit.exec_start[0][0] if unit.exec_start else (path.name, 0)),
            f"{len(unit.exec_start)} ExecStart= command lines after resets ({lines}; exactly "
            "one runs a server)", "reset with an empty ExecStart= before the one that runs",
        ))  # fmt: skip
        return DeployRead((), tuple(unit.bad))
    where, value = unit.exec_start[0]
    try:
        argv = exec_argv(value)
    except _Refused as exc:
        unit.bad.append(NotUnderstood(*where, exc.construct, exc.fix))
        return DeployRead((), tuple(unit.bad))
    crossed = ServerBudget().spend(argv, env)
    if crossed is not None:  # the gate checks every word of it
        unit.bad.append(NotUnderstood(*where, crossed, BUDGET_FIX))
        return DeployRead((), tuple(unit.bad))
    command = ServerCommand(
        origin=f"{where[0]}:{where[1]}", argv=tuple(argv), env=env,
        base_dir=Path(unit.workdir), search_path=None,
    )  # fmt: skip
    return DeployRead((command,), tuple(unit.bad))
