"""Reading a deploy file: which format it is, and the reader of that format.

* a shell script (:mod:`batch_invariance.deploy.shell`);
* a systemd unit with its drop-ins (:mod:`batch_invariance.deploy.systemd`);
* a compose project with its override files (:mod:`batch_invariance.deploy.compose`);
* a ``models.toml`` registry, read by the one registry reader (:mod:`profiles.models`), with the
  ``kv`` cache type applied as run-live applies it.

Each reader passes a file only when every line, word and key is inside its closed grammar;
the rest is returned as :attr:`DeployRead.not_understood`, and the deploy is not covered.
"""

from __future__ import annotations

import re
from pathlib import Path

from batch_invariance.deploy.commands import DeployRead, NotUnderstood, ServerCommand
from batch_invariance.deploy.compose import compose_commands
from batch_invariance.deploy.shell import ShellReader
from batch_invariance.deploy.systemd import unit_commands
from batch_invariance.errors import UsageError


def shell_commands(text: str, name: str, source_dir: Path | None = None) -> DeployRead:
    """The servers a shell script starts, read in order as bash runs it. ``source_dir``
    (``None`` in pure tests) is where a sourced file is looked up relative to: nothing, a
    sourced file's path must be absolute or relative to a known folder."""

    def source(file: str) -> str | None:
        try:
            return Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    reader = ShellReader(name, source)
    reader.run(text)
    commands = tuple(
        ServerCommand(
            origin=launch.where,
            argv=launch.argv,
            env=launch.env,
            base_dir=launch.cwd,
            search_path=launch.search_path,
        )
        for launch in reader.launches
    )
    bad = list(reader.not_understood)
    for written in reader.written:
        for command in commands:
            if _reads(command, written):
                bad.append(NotUnderstood(name, 0, f"output written to {written}, which "
                                         f"{command.origin} reads"))  # fmt: skip
    return DeployRead(commands, tuple(bad))


def _reads(command: ServerCommand, written: Path | str) -> bool:
    for word in command.argv:
        path = Path(word)
        if not path.is_absolute():
            if command.base_dir is None:
                continue
            path = command.base_dir / path
        if str(path) == str(written):
            return True
    return False


def is_unit(text: str) -> bool:
    return re.search(r"^\s*\[(Service|Unit|Install)\]\s*$", text, re.MULTILINE) is not None


def toml_commands(path: Path, text: str, models_dir: str | None) -> tuple[ServerCommand, ...]:
    """The servers of a ``models.toml``, read by the one registry reader."""
    from batch_invariance.profiles.models import (
        fill_models_dir,
        kv_flags,
        load_toml,
        parse_registry,
    )

    registry = parse_registry(load_toml(text, path.name), path.name)
    out: list[ServerCommand] = []
    for alias, entry in registry.models.items():
        gguf = fill_models_dir(entry, models_dir, registry.source)
        argv = ("llama-server", *entry.server_flags, *kv_flags(entry.kv))
        out.append(
            ServerCommand(
                origin=f"{path.name} [{alias}]",
                argv=argv,
                env={},
                model_override=str(gguf),
                alias=alias,
                base_dir=path.parent,
                binary_elsewhere=f"{path.name} names no server binary",
            )
        )
    return tuple(out)


def read_deploy_file(path: Path, models_dir: str | None = None) -> DeployRead:
    """Every llama-server a deploy file starts, and what in it is outside the grammar; a file
    that starts none and has nothing outside the grammar is a usage error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc}") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        read = DeployRead(toml_commands(path, text, models_dir))
    elif suffix in (".yml", ".yaml"):
        read = compose_commands(path, text)
    elif suffix in (".service",) or is_unit(text):
        read = unit_commands(path, text)
    else:
        read = shell_commands(text, path.name)
    if not read.commands and not read.not_understood:
        raise UsageError(
            f"{path.name}: no llama-server command line, compose service or [[models]] entry "
            "found; pass the file that starts the server"
        )
    return read
