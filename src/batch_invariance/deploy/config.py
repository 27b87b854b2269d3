"""Reading deploy files: which ``llama-server`` processes a deploy starts, with what argv and
environment, the way bash, systemd and compose start them.

* a shell script (:mod:`batch_invariance.deploy.shell`): commands in order, with exported
  variables, prefix assignments, ``cd``, sourced files and environment-resetting wrappers;
* a systemd unit (:mod:`batch_invariance.deploy.systemd`): ``Environment=`` then
  ``EnvironmentFile=``, ``ExecStart=``, ``WorkingDirectory=``;
* a compose file (one YAML document with ``services:``): each service whose entrypoint is
  llama-server, or a llama.cpp ``:server*`` image; ``environment:`` over ``env_file:``;
  container model paths mapped back through the bind mount with the longest container path;
* a ``models.toml`` registry, read by the one registry reader (:mod:`profiles.models`), with the
  ``kv`` cache type applied as run-live applies it.

What is not modelled and mentions a server (llama-server, a llama.cpp image, ``LLAMA_ARG_``,
a ``.gguf`` file, ``batch-invariance serve``) is returned in :attr:`DeployRead.unmodelled`,
and the deploy is not covered: the reader never lets "the rest passed" stand for the file.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from batch_invariance.deploy.shell import TRIGGER
from batch_invariance.errors import UsageError

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class BindMount(NamedTuple):
    """A compose bind mount: the path inside the container and the host path it shows."""

    container: str
    host: str


@dataclass(frozen=True)
class ServerCommand:
    """One llama-server (or ``batch-invariance serve``) a deploy file starts."""

    #: Where it came from, for messages (``deploy.sh:3``, ``compose.yml [llm]``).
    origin: str
    argv: tuple[str, ...]
    #: The environment it runs with, as the shell / systemd / compose would give it.
    env: Mapping[str, str]
    #: A models.toml ``gguf`` (placeholder filled) that replaces ``-m``.
    model_override: str | None = None
    alias: str | None = None
    #: Folder relative model paths are resolved against (``None``: unknown, after a ``cd``
    #: the reader cannot follow).
    base_dir: Path | None = Path(".")
    #: Container-path -> host-path prefixes from compose ``volumes:`` (bind mounts only).
    mounts: tuple[BindMount, ...] = ()
    #: The server runs in a container: a model path outside every bind mount is not here.
    in_container: bool = False
    #: Environment files that could not be read (their variables are unknown).
    unread_env_files: tuple[str, ...] = field(default_factory=tuple)
    #: Variables of its environment whose value the reader could not follow.
    unknown_env: tuple[str, ...] = ()
    #: Why ``argv[0]`` names no file on this host (inside a container image; a registry that
    #: names no binary); ``None`` when it does. The build then cannot be checked here.
    binary_elsewhere: str | None = None


@dataclass(frozen=True)
class DeployRead:
    """What a deploy file starts, and what in it the reader could not turn into a cell."""

    commands: tuple[ServerCommand, ...]
    #: ``file:line: why: text`` for each construct that mentions a server but is not
    #: modelled; any one makes the deploy not covered.
    unmodelled: tuple[str, ...] = ()


def _assignments(tokens: Sequence[str]) -> dict[str, str]:
    return dict(t.partition("=")[::2] for t in tokens if _ASSIGN.match(t))


def read_env_file(path: Path) -> dict[str, str] | None:
    """``KEY=VALUE`` lines of an environment file (``#`` comments, optional ``export``,
    quotes removed); ``None`` when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    env: dict[str, str] = {}
    for line in text.splitlines():
        body = line.strip().removeprefix("export ").strip()
        if body and not body.startswith(("#", ";")) and _ASSIGN.match(body):
            key, _, value = body.partition("=")
            env[key] = value.strip().strip("'\"")
    return env


def _load_env_file(name: str, base_dir: Path, env: dict[str, str], unread: list[str]) -> None:
    """Merge an ``env_file:`` into ``env``, or record it as unread."""
    path = Path(name).expanduser()
    loaded = read_env_file(path if path.is_absolute() else base_dir / path)
    if loaded is None:
        unread.append(name)
    else:
        env.update(loaded)


def shell_commands(text: str, name: str, base_dir: Path) -> DeployRead:
    """The servers a shell script starts, read in order as bash runs it."""
    from batch_invariance.deploy.shell import ShellReader, ShellState

    def source(file: str, state: ShellState) -> str | None:
        path = Path(file)
        if not path.is_absolute():
            if state.cwd is None:
                return None
            path = state.cwd / path
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    reader = ShellReader(name, text.splitlines(), source, ShellState(cwd=base_dir))
    reader.run(text)
    commands = tuple(
        ServerCommand(
            origin=launch.where,
            argv=launch.argv,
            env=launch.env,
            base_dir=launch.cwd,
            unread_env_files=tuple(reader.unread_files),
            unknown_env=launch.unknown_env,
        )
        for launch in reader.launches
    )
    return DeployRead(commands, tuple(reader.unmodelled))


def text_commands(text: str, name: str, base_dir: Path) -> DeployRead:
    """The servers of a shell script or a systemd unit."""
    if re.search(r"^\s*\[(Service|Unit|Install)\]\s*$", text, re.MULTILINE):
        from batch_invariance.deploy.systemd import unit_commands

        return unit_commands(text, name, base_dir)
    return shell_commands(text, name, base_dir)


def _compose_env(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return {str(k): _yaml_text(v) for k, v in raw.items() if v is not None}
    if isinstance(raw, list):
        return _assignments([str(item) for item in raw])
    raise UsageError(f"{where}: environment must be a map or a list of KEY=VALUE")


def _yaml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _compose_words(raw: Any, where: str, key: str) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return shlex.split(raw)  # compose splits a string form shell-like, without a shell
    if isinstance(raw, list):
        return [_yaml_text(v) for v in raw]
    raise UsageError(f"{where}: {key} must be a string or a list")


def _strings(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [str(value)]


def _bind_mounts(volumes: Any, base_dir: Path) -> tuple[BindMount, ...]:
    """Every bind mount, longest container path first (the mount that wins for a path under
    two of them)."""
    mounts: list[BindMount] = []
    for volume in volumes or []:
        if isinstance(volume, Mapping) and volume.get("type") == "bind":
            source, target = str(volume.get("source") or ""), str(volume.get("target") or "")
        elif isinstance(volume, str):
            source, _, rest = volume.partition(":")
            target = rest.split(":", 1)[0]
        else:
            continue
        if source.startswith((".", "/", "~")) and target.startswith("/"):
            host = Path(source).expanduser()
            host = host if host.is_absolute() else base_dir / host
            mounts.append(BindMount(target.rstrip("/") or "/", str(host).rstrip("/") or "/"))
    return tuple(sorted(mounts, key=lambda m: len(m.container), reverse=True))


def _compose_server(spec: Mapping[str, Any], where: str) -> tuple[str, ...] | str:
    """The argv a service runs, or why it is not modelled."""
    image = str(spec.get("image") or "")
    entrypoint = _compose_words(spec.get("entrypoint"), where, "entrypoint")
    command = _compose_words(spec.get("command"), where, "command")
    words = [*entrypoint, *command]
    if any(re.search(r"(?<!\$)\$(?!\$)", w) for w in words):
        return "a $VARIABLE that compose fills in from the caller's environment or .env"
    if entrypoint:
        program = entrypoint[0].rsplit("/", 1)[-1]
        if program.startswith("llama-server"):
            return tuple(words)
        return f"entrypoint {entrypoint[0]} is not llama-server"
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    if "llama.cpp" in image and tag.startswith("server"):
        return ("llama-server", *command)  # the :server* images' entrypoint is llama-server
    if command and command[0].rsplit("/", 1)[-1].startswith("llama-server"):
        return tuple(command)
    return f"image {image or '(none)'} with command {' '.join(command)[:60]} is not modelled"


def compose_commands(data: Mapping[str, Any], name: str, base_dir: Path) -> DeployRead:
    """The llama-server services of a compose file (pure over the decoded YAML); a service
    that mentions a server but is not modelled is named."""
    services = data.get("services")
    if not isinstance(services, Mapping):
        return DeployRead(())
    out: list[ServerCommand] = []
    unmodelled: list[str] = []
    for service, spec in services.items():
        if not isinstance(spec, Mapping):
            continue
        where = f"{name} [{service}]"
        mentions = any(TRIGGER.search(text) for text in _strings(spec))
        argv = _compose_server(spec, where)
        if isinstance(argv, str):
            if mentions:
                unmodelled.append(f"{where}: {argv}")
            continue
        env = _compose_env(spec.get("environment"), where)
        unread: list[str] = []
        files = spec.get("env_file")
        from_files: dict[str, str] = {}
        for item in [files] if isinstance(files, str) else files or []:
            file = str(item.get("path") if isinstance(item, Mapping) else item)
            _load_env_file(file, base_dir, from_files, unread)
        workdir = str(spec.get("working_dir") or "/")
        image = str(spec.get("image") or "")
        out.append(
            ServerCommand(
                origin=where,
                argv=argv,
                env={**from_files, **env},  # environment: beats env_file:
                base_dir=Path(workdir) if workdir.startswith("/") else None,
                mounts=_bind_mounts(spec.get("volumes"), base_dir),
                in_container=True,
                unread_env_files=tuple(unread),
                binary_elsewhere=f"runs inside the container image {image or '(built here)'}",
            )
        )
    return DeployRead(tuple(out), tuple(unmodelled))


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


def _yaml_commands(text: str, name: str, base: Path) -> DeployRead:
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{name}: not valid YAML ({' '.join(str(exc).split())})") from None
    composes = [d for d in documents if isinstance(d, Mapping) and "services" in d]
    if len(documents) == 1 and composes:
        return compose_commands(composes[0], name, base)
    # Kubernetes manifests and any other YAML: not modelled; every line that mentions a
    # server makes the deploy not covered.
    return DeployRead((), _mentions(text, name, "YAML that is not one compose file"))


def _mentions(text: str, name: str, what: str) -> tuple[str, ...]:
    return tuple(
        f"{name}:{number}: {what} (not modelled): {line.strip()[:120]}"
        for number, line in enumerate(text.splitlines(), start=1)
        if TRIGGER.search(line)
    )


def read_deploy_file(path: Path, models_dir: str | None = None) -> DeployRead:
    """Every llama-server a deploy file starts, and what it could not read; a file that
    starts none and mentions none is a usage error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc}") from None
    base = path.parent
    suffix = path.suffix.lower()
    if suffix == ".toml":
        read = DeployRead(toml_commands(path, text, models_dir))
    elif suffix in (".yml", ".yaml") or re.search(r"^services:\s*$", text, re.MULTILINE):
        read = _yaml_commands(text, path.name, base)
    else:
        read = text_commands(text, path.name, base)
    if not read.commands and not read.unmodelled:
        raise UsageError(
            f"{path.name}: no llama-server command line, compose service or [[models]] entry "
            "found; pass the file that starts the server"
        )
    return read
