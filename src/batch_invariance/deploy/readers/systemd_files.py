"""The files systemd merges into a service, and the manager settings that reach every service.

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


__all__ = ["MANAGER_CONF", "UNIT_DIRS", "drop_in_files", "manager_environment"]
