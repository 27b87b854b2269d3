"""Reading a deploy file: its format by its name (:func:`deploy_format`), its bytes checked
(:mod:`batch_invariance.deploy.readers.source_bytes`), then the reader of that format: shell,
systemd unit with drop-ins, compose project or Kubernetes manifest. Each is an allowlist; what
is off it is :attr:`DeployRead.not_understood` and the deploy is not covered. A ``.toml`` file
(run-live's model registry) starts no serve and is a usage error.
"""

from __future__ import annotations

from pathlib import Path

from batch_invariance.deploy.readers.compose import compose_commands
from batch_invariance.deploy.readers.kubernetes import is_manifest, kubernetes_commands
from batch_invariance.deploy.readers.shell import shell_commands
from batch_invariance.deploy.readers.source_bytes import decode
from batch_invariance.deploy.readers.systemd import unit_commands
from batch_invariance.errors import UsageError
from batch_invariance.gate.server_command import DeployRead, NotUnderstood

#: What a ``.toml`` deploy config gets (``{name}``: its file name).
TOML_REFUSED = (
    "{name}: a .toml file is a model registry, not a deploy: it starts no batch-invariance "
    "serve, so it never passes; pass the script, unit, compose file or manifest that starts "
    "serve (measure a registry's model with run-live or sweep --model-alias A --models-file "
    "{name})"
)
#: systemd unit types other than a service: not a deploy of a server this reader reads.
_OTHER_UNITS = frozenset(
    {".socket", ".timer", ".target", ".path", ".mount", ".automount", ".swap", ".slice",
     ".scope", ".device", ".conf"}
)  # fmt: skip


def deploy_format(path: Path) -> str:
    """The format of a deploy file, decided by its name as the program that runs it decides:
    ``.service`` is a systemd unit (systemd loads it by name, whatever it holds), ``.yml`` /
    ``.yaml`` a compose file (``docker compose -f``), ``.toml`` a models registry (run-live's,
    never a deploy); any other systemd unit type or a lone drop-in (``.conf``) is not read;
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


def _read_format(path: Path, data: bytes) -> DeployRead:
    text = decode(data, path.name)
    if isinstance(text, NotUnderstood):
        return DeployRead((), (text,))
    kind = deploy_format(path)
    if kind == "compose":
        if is_manifest(text):  # kubectl applies any YAML file; compose would refuse these keys
            return kubernetes_commands(path, text)
        return compose_commands(path, text)
    if kind == "unit":
        return unit_commands(path, text)
    if kind == "other":
        return DeployRead((), (NotUnderstood(
            path.name, 0, f"a {path.suffix} file (not a service unit, compose file, Kubernetes "
            "manifest or shell script)", "pass the .service unit (its drop-ins are read with it)",
        ),))  # fmt: skip
    return shell_commands(text, path.name)


def read_deploy_file(path: Path) -> DeployRead:
    """Every llama-server a deploy file starts, and what in it is off the allowlist; a file
    that starts none and has nothing off it, or a models registry, is a usage error."""
    if deploy_format(path) == "toml":  # it names no binary and starts no serve: never a pass
        raise UsageError(TOML_REFUSED.format(name=path.name))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc}") from None
    read = _read_format(path, data)
    if not read.commands and not read.not_understood:
        raise UsageError(
            f"{path.name}: no llama-server command line, compose service or container found; "
            "pass the file that starts the server"
        )
    return read
