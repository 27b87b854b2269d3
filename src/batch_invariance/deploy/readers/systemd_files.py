"""The files systemd merges into a service, the logical lines it reads in each, and the manager
settings that reach every service.

The drop-ins (systemd.unit(5), "Description"): ``service.d/``, ``PREFIX-.service.d/`` for
dashed names and ``NAME.service.d/``, every ``*.conf``, sorted by file name across folders, a
name in a folder searched earlier masking the same name later; the folders searched are the
unit's own folder and, when that is one of systemd's unit folders, all of them. The manager's
``DefaultEnvironment=`` (systemd-system.conf(5)) reaches every service: where it is set, a
unit's environment is not what its files say.
"""

from __future__ import annotations

from pathlib import Path

from batch_invariance.deploy.readers.commands import NotUnderstood
from batch_invariance.deploy.readers.source_bytes import BLANKS

#: systemd's ``WHITESPACE`` (``" \t\n\r"``): what it strips around keys and values and
#: splits ``$NAME`` at. Its CR is outside the bytes a file may hold, its newline ends a line.
WHITESPACE = " \t\n\r"

#: systemd's unit folders for system services, highest priority first (systemd.unit(5)).
UNIT_DIRS = (
    Path("/etc/systemd/system"), Path("/run/systemd/system"),
    Path("/usr/local/lib/systemd/system"), Path("/usr/lib/systemd/system"),
    Path("/lib/systemd/system"),
)  # fmt: skip
#: Files whose ``DefaultEnvironment=`` reaches every service (systemd-system.conf(5)): the
#: file, then the folders of its drop-ins.
MANAGER_CONF = (
    Path("/etc/systemd/system.conf"), Path("/etc/systemd/system.conf.d"),
    Path("/run/systemd/system.conf.d"), Path("/usr/local/lib/systemd/system.conf.d"),
    Path("/usr/lib/systemd/system.conf.d"),
)  # fmt: skip


def _escaped(text: str) -> bool:
    """The line ends in a backslash that escapes nothing: systemd's continuation (it scans the
    line, a backslash escaping the next character: so an odd run of them at the end)."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def logical_lines(text: str, shown: str, bad: list[NotUnderstood]) -> list[tuple[int, str]]:
    """Logical lines as systemd's ``config_parse`` forms them: a line whose first non-blank
    is ``#``/``;`` is a comment; a line ending in an unescaped ``\\`` has it replaced by a
    space and the next raw line appended; the result is stripped of whitespace."""
    out: list[tuple[int, str]] = []
    # The logical line so far, in pieces (joined once: re-joining and re-scanning it at each
    # continued line was quadratic in a line continued thousands of times).
    continuation: list[str] | None = None
    start = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        if raw.lstrip(BLANKS)[:1] in ("#", ";"):
            if continuation is not None:
                bad.append(NotUnderstood(shown, number, "a comment inside a \\ continuation",
                                         "move the comment above the setting"))  # fmt: skip
                return []
            continue
        if continuation is None:
            start = number
        # The pieces before end in a blank (the replaced backslash): only raw's own trailing
        # backslashes can escape.
        if _escaped(raw):
            continuation = [] if continuation is None else continuation
            continuation += (raw[:-1], " ")
            continue
        joined = raw if continuation is None else "".join((*continuation, raw))
        continuation = None
        line = joined.strip(WHITESPACE)
        if line:
            out.append((start, line))
    if continuation is not None:
        bad.append(NotUnderstood(shown, start, "a \\ continuation at the end of the file"))
    return out


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


def _manager_files() -> list[Path]:
    folders = [folder for folder in MANAGER_CONF[1:] if folder.is_dir()]
    chosen: dict[str, Path] = {}
    for folder in folders:  # a drop-in name earlier in the list masks the same name later
        for conf in folder.glob("*.conf"):
            chosen.setdefault(conf.name, conf)
    return [MANAGER_CONF[0], *(chosen[k] for k in sorted(chosen))]


def manager_environment() -> list[NotUnderstood]:
    """Every ``DefaultEnvironment=`` with a value in the service manager's configuration
    (read as bytes: a line is the setting when its key, stripped of systemd's whitespace, is
    that name; a file that exists but cannot be read is not understood)."""
    out: list[NotUnderstood] = []
    for path in _manager_files():
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError:
            out.append(NotUnderstood(str(path), 0, "a service manager configuration that "
                                     "cannot be read here (its DefaultEnvironment= reaches "
                                     "every service)"))  # fmt: skip
            continue
        for number, line in enumerate(data.split(b"\n"), start=1):
            key, eq, value = line.partition(b"=")
            if key.strip(b" \t\r") == b"DefaultEnvironment" and eq and value.strip(b" \t\r"):
                out.append(NotUnderstood(str(path), number, "DefaultEnvironment= of the "
                                         "service manager reaches every service"))  # fmt: skip
    return out


__all__ = ["MANAGER_CONF", "UNIT_DIRS", "WHITESPACE", "drop_in_files", "logical_lines",
           "manager_environment"]  # fmt: skip
