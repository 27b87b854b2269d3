"""Reading a deploy file: its format by its name (:func:`deploy_format`), its bytes checked
(:mod:`batch_invariance.deploy.readers.source_bytes`), then the reader of that format: shell,
systemd unit with drop-ins, compose project, Kubernetes manifest, or ``models.toml`` (read by
the one registry reader, :mod:`profiles.models`). Each is an allowlist; what is off it is
:attr:`DeployRead.not_understood` and the deploy is not covered.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from batch_invariance.deploy.readers.compose import compose_commands
from batch_invariance.deploy.readers.kubernetes import is_manifest, kubernetes_commands
from batch_invariance.deploy.readers.shell import shell_commands
from batch_invariance.deploy.readers.source_bytes import BUDGET_FIX, ServerBudget, decode
from batch_invariance.deploy.readers.systemd import unit_commands
from batch_invariance.errors import UsageError
from batch_invariance.gate.server_command import DeployRead, NotUnderstood, ServerCommand

#: A ``[[models]]`` header line of a registry.
_MODELS_ROW = re.compile(r"^[ \t]*\[\[[ \t]*models[ \t]*\]\]", re.M)
#: systemd unit types other than a service: not a deploy of a server this reader reads.
_OTHER_UNITS = frozenset(
    {".socket", ".timer", ".target", ".path", ".mount", ".automount", ".swap", ".slice",
     ".scope", ".device", ".conf"}
)  # fmt: skip


def toml_commands(path: Path, text: str, models_dir: str | None) -> DeployRead:
    """The servers of a ``models.toml``, read by the one registry reader. A ``gguf`` that
    starts with ``~`` is not understood: run-live expands it with its own user's HOME."""
    from batch_invariance.profiles.models import (
        fill_models_dir,
        kv_flags,
        load_toml,
        parse_registry,
    )

    registry = parse_registry(load_toml(text, path.name), path.name)
    out: list[ServerCommand] = []
    bad: list[NotUnderstood] = []
    budget = ServerBudget()
    for row, (alias, entry) in enumerate(registry.models.items()):
        if entry.gguf.startswith("~"):
            bad.append(NotUnderstood(
                path.name, 0, f"[{alias}] gguf {entry.gguf} (~ is the HOME of whoever runs "
                "run-live, not known here)", "write the path absolute or with {MODELS_DIR}",
            ))  # fmt: skip
            continue
        gguf = fill_models_dir(entry, models_dir, registry.source)
        argv = ("llama-server", *entry.server_flags, *kv_flags(entry.kv))
        crossed = budget.spend(argv, {})
        if crossed is not None:  # each server is a cell the gate checks, word by word
            bad.append(NotUnderstood(path.name, _row_line(text, row), f"[{alias}] {crossed}",
                                     BUDGET_FIX))  # fmt: skip
            break
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
    return DeployRead(tuple(out), tuple(bad))


def _row_line(text: str, index: int) -> int:
    """The line of the ``[[models]]`` header of row ``index`` (from 0), or 0."""
    found = itertools.islice(_MODELS_ROW.finditer(text), index, None)
    row = next(found, None)
    return 0 if row is None else text.count("\n", 0, row.start()) + 1


def deploy_format(path: Path) -> str:
    """The format of a deploy file, decided by its name as the program that runs it decides:
    ``.service`` is a systemd unit (systemd loads it by name, whatever it holds), ``.yml`` /
    ``.yaml`` a compose file (``docker compose -f``), ``.toml`` a models registry (run-live's
    ``--models``); any other systemd unit type or a lone drop-in (``.conf``) is not read;
    everything else is a shell script (sh or bash by its ``#!`` line). No header line
    inside the file decides it: a ``[Service]`` line in ``run.sh`` is a shell word, not a unit."""
    suffix = path.suffix.lower()
    if suffix == ".service":
        return "unit"
    if suffix in (".yml", ".yaml"):
        return "compose"
    if suffix == ".toml":
        return "toml"
    if suffix in _OTHER_UNITS:
        return "other"
    return "shell"


def _read_format(path: Path, data: bytes, models_dir: str | None) -> DeployRead:
    text = decode(data, path.name)
    if isinstance(text, NotUnderstood):
        return DeployRead((), (text,))
    kind = deploy_format(path)
    if kind == "toml":
        return toml_commands(path, text, models_dir)
    if kind == "compose":
        if is_manifest(text):  # kubectl applies any YAML file; compose would refuse these keys
            return kubernetes_commands(path, text)
        return compose_commands(path, text)
    if kind == "unit":
        return unit_commands(path, text)
    if kind == "other":
        return DeployRead((), (NotUnderstood(
            path.name, 0, f"a {path.suffix} file (not a service unit, compose file, models.toml "
            "or shell script)", "pass the .service unit (its drop-ins are read with it)",
        ),))  # fmt: skip
    return shell_commands(text, path.name)


def read_deploy_file(path: Path, models_dir: str | None = None) -> DeployRead:
    """Every llama-server a deploy file starts, and what in it is off the allowlist; a file
    that starts none and has nothing off it is a usage error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc}") from None
    read = _read_format(path, data, models_dir)
    if not read.commands and not read.not_understood:
        raise UsageError(
            f"{path.name}: no llama-server command line, compose service or [[models]] entry "
            "found; pass the file that starts the server"
        )
    return read
