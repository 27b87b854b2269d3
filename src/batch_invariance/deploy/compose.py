"""Reading a compose project inside a closed grammar: the compose file, the override files
compose merges into it, and the ``.env`` file it reads (the compose specification, "Merge and
override" and "Interpolation"; `docker compose` reads ``compose.override.yaml`` beside a
``compose.yaml`` when no ``-f`` is given).

A server service is one whose image is a llama.cpp ``:server*`` image (entrypoint
``/app/llama-server``) or whose ``entrypoint`` runs llama-server. Its keys must be in
:data:`SERVER_KEYS`; its volumes bind host folders (a named volume or tmpfs could hold any
file); its ``environment`` holds values (a name without one passes the caller's through).
Any ``$`` (interpolation from the caller's environment or ``.env``) is not understood. Other
services may not mention a server and may not bind a server's host folder writable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from batch_invariance.deploy.commands import (
    BindMount,
    DeployRead,
    NotUnderstood,
    ServerCommand,
)
from batch_invariance.deploy.compose_yaml import load, plain
from batch_invariance.deploy.env_file import NAME, PLAIN_VALUE, parse_env_file, read_env_file
from batch_invariance.engines.llama_server.env import SYSTEM_CONFIG

TRIGGER = re.compile(
    r"llama-server|llama\.cpp|llama_cpp|LLAMA_ARG_|\.gguf\b|batch-invariance", re.I
)
DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")
OVERRIDES = (
    "compose.override.yaml", "compose.override.yml", "docker-compose.override.yaml",
    "docker-compose.override.yml",
)  # fmt: skip
TOP_KEYS = frozenset({"services", "volumes", "networks", "name", "version"})
SERVER_KEYS = frozenset(
    {"image", "command", "entrypoint", "environment", "env_file", "volumes", "working_dir",
     "ports", "expose", "restart", "container_name", "hostname", "networks", "depends_on",
     "labels", "stop_signal", "stop_grace_period", "init"}
)  # fmt: skip
#: Merged by key across files; the rest are replaced (the specification's merge rules).
_APPENDED = frozenset({"ports", "expose", "env_file"})
_FIX = "keep the service to the keys in docs/deploy.md, or entrypoint batch-invariance serve"


class _Refused(Exception):
    def __init__(self, line: int, construct: str, fix: str = "") -> None:
        super().__init__(construct)
        self.line, self.construct, self.fix = line, construct, fix


def _mentions(value: Any) -> bool:
    """Any key or value under ``value`` names a server, a model file or this tool."""
    if isinstance(value, tuple):  # (value, line) as loaded
        return _mentions(value[0])
    if isinstance(value, dict):
        return any(TRIGGER.search(k) or _mentions(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_mentions(v) for v in value)
    return bool(TRIGGER.search(str(value)))


def _words(value: Any, line: int, key: str) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value)
    if not re.fullmatch(r"[A-Za-z0-9_./:,@%+=\- ]*", text):
        raise _Refused(line, f"{key}: string with quotes or special characters",
                       f"write {key} as a YAML list")  # fmt: skip
    return text.split()


def _environment(value: Any, line: int) -> dict[str, str]:
    pairs: dict[str, str] = {}
    items = value.items() if isinstance(value, dict) else None
    if items is not None:
        for name, (text, where) in items:
            if text is None:
                raise _Refused(where, f"environment {name} without a value (it passes the "
                               "caller's through)", f"write {name}: VALUE")  # fmt: skip
            if isinstance(text, (list, dict)):
                raise _Refused(where, f"environment {name}: not a value")
            pairs[name] = str(text)
    elif isinstance(value, list):
        for item in value:
            name, eq, text = str(item).partition("=")
            if not eq:
                raise _Refused(line, f"environment entry {name} without a value (it passes the "
                               "caller's through)", f"write {name}=VALUE")  # fmt: skip
            pairs[name] = text
    else:
        raise _Refused(line, "environment that is neither a map nor a list")
    for name, text in pairs.items():
        if not NAME.fullmatch(name) or not PLAIN_VALUE.fullmatch(text):
            raise _Refused(line, f"environment {name}={text[:40]}", "plain NAME=VALUE")
    return pairs


def _volume(item: Any, line: int) -> tuple[str, str, bool]:
    """(host source as written, container target, read-only) of a bind mount."""
    if isinstance(item, dict):
        spec = plain(item)
        if spec.get("type") != "bind" or set(spec) - {"type", "source", "target", "read_only"}:
            raise _Refused(line, "a volume that is not a bind mount (its content is unknown)")
        return (
            str(spec.get("source", "")),
            str(spec.get("target", "")),
            spec.get("read_only") == "true",
        )
    source, _, rest = str(item).partition(":")
    target, _, mode = rest.partition(":")
    if not source.startswith(("/", "./", "../")) or not target.startswith("/"):
        raise _Refused(line, f"volume {item} (a named volume or a relative target; its content "
                       "is unknown)", "bind a host folder: ./models:/models:ro")  # fmt: skip
    if mode and not set(mode.split(",")) <= {"ro", "rw", "z", "Z"}:
        raise _Refused(line, f"volume mode {mode}")
    return source, target, "ro" in mode.split(",")


@dataclass
class _Service:
    name: str
    spec: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, tuple[str, int]] = field(default_factory=dict)


def _merge(services: dict[str, _Service], data: dict[str, Any], shown: str) -> None:
    for name, (spec, line) in data.items():
        if not isinstance(spec, dict):
            raise _Refused(line, f"service {name} that is not a mapping")
        service = services.setdefault(name, _Service(name))
        for key, (value, where) in spec.items():
            old = service.spec.get(key)
            if key == "environment":  # merged by name; kept as plain NAME -> value
                service.spec[key] = {**(old or {}), **_environment(value, where)}
            elif key == "labels":
                service.spec[key] = {**(old or {}), **plain(value)} if isinstance(
                    value, dict) else value  # fmt: skip
            elif key in _APPENDED and isinstance(old, list) and isinstance(value, list):
                service.spec[key] = [*old, *value]
            elif key == "volumes" and isinstance(old, list) and isinstance(value, list):
                targets = {_volume(v, where)[1] for v in value}
                service.spec[key] = [v for v in old if _volume(v, where)[1] not in targets]
                service.spec[key].extend(value)
            else:
                service.spec[key] = value
            service.lines[key] = (shown, where)


def project_files(path: Path) -> list[Path]:
    """The compose file and the override files compose merges into it, in order."""
    files = [path]
    if path.name in DEFAULT_FILES:
        files += [path.parent / o for o in OVERRIDES if (path.parent / o).is_file()]
    return files


def _dot_env(folder: Path) -> list[NotUnderstood]:
    env = folder / ".env"
    if not env.exists():
        return []
    read = read_env_file(env, str(env))
    if read is None:
        return [NotUnderstood(str(env), 0, ".env that cannot be read here")]
    bad = list(read.not_understood)
    for name in read.values:
        if name.startswith(("COMPOSE_", "DOCKER_")):
            bad.append(NotUnderstood(str(env), 0, f"{name} in .env (it changes what compose "
                                     "reads or runs)"))  # fmt: skip
    return bad


def compose_commands(path: Path, text: str) -> DeployRead:
    """The llama-server services of a compose project, merged as compose merges them."""
    bad: list[NotUnderstood] = list(_dot_env(path.parent))
    services: dict[str, _Service] = {}
    for file in project_files(path):
        shown = file.name
        body = text if file == path else file.read_text(encoding="utf-8")
        if "$" in body:
            line = body[: body.index("$")].count("\n") + 1
            bad.append(
                NotUnderstood(
                    shown,
                    line,
                    "a $ (compose interpolates it from the caller's environment or .env)",
                    "write the value out",
                )
            )
            continue
        data = load(body, shown)
        if isinstance(data, NotUnderstood):
            bad.append(data)
            continue
        for key, (_, line) in data.items():
            if key not in TOP_KEYS:
                bad.append(NotUnderstood(shown, line, f"top-level key {key}", _FIX))
        raw = data.get("services", ({}, 0))[0]
        try:
            if not isinstance(raw, dict):
                raise _Refused(1, "services that is not a mapping")
            _merge(services, raw, shown)
        except _Refused as exc:
            bad.append(NotUnderstood(shown, exc.line, exc.construct, exc.fix))
    commands: list[ServerCommand] = []
    server_hosts: list[str] = []
    others: list[_Service] = []
    for service in services.values():
        try:
            command = _server(service, path.parent)
        except _Refused as exc:
            shown = next(iter(service.lines.values()), (path.name, 0))[0]
            bad.append(NotUnderstood(shown, exc.line, f"[{service.name}] {exc.construct}",
                                     exc.fix or _FIX))  # fmt: skip
            continue
        if command is None:
            others.append(service)
            continue
        commands.append(command)
        server_hosts += [m.host for m in command.mounts]
    for service in others:
        bad.extend(_other(service, server_hosts, path))
    return DeployRead(tuple(commands), tuple(bad))


def _program(spec: dict[str, Any], line: int) -> list[str] | None:
    image = str(spec.get("image", ""))
    entrypoint = spec.get("entrypoint")
    if entrypoint is not None:
        words = _words(entrypoint, line, "entrypoint")
        if words and PurePosixPath(words[0]).name.startswith("llama-server"):
            return words
        return None
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    if "llama.cpp" in image and tag.startswith("server"):
        return ["/app/llama-server"]  # the published :server images' entrypoint
    return None


def _server(service: _Service, base: Path) -> ServerCommand | None:
    spec = service.spec
    line = service.lines.get("image", ("", 0))[1]
    program = _program(spec, line)
    if program is None:
        return None
    for key in spec:
        if key not in SERVER_KEYS:
            raise _Refused(service.lines[key][1], f"key {key} of a server service")
    command = _words(spec.get("command", []), service.lines.get("command", ("", 0))[1], "command")
    env: dict[str, str] = {}
    notes: list[str] = []
    for item in (
        spec.get("env_file", [])
        if isinstance(spec.get("env_file"), list)
        else ([spec["env_file"]] if "env_file" in spec else [])
    ):
        where = service.lines["env_file"][1]
        path, required = (
            (str(item.get("path")), item.get("required") != "false")
            if isinstance(item, dict)
            else (str(item), True)
        )
        file = Path(path) if path.startswith("/") else base / path
        read = read_env_file(file, str(file))
        if read is None:
            if not required and not file.exists():
                notes.append(f"env_file {path} is absent here (required: false): nothing set")
                continue
            raise _Refused(where, f"env_file {path}, which cannot be read here")
        if read.not_understood:
            raise _Refused(where, f"env_file {path}: {read.not_understood[0]}")
        env.update(read.values)
    env.update(spec.get("environment", {}))
    mounts: list[BindMount] = []
    for item in spec.get("volumes", []):
        source, target, _ = _volume(item, service.lines["volumes"][1])
        host = Path(source) if source.startswith("/") else (base / source).resolve()
        mounts.append(BindMount(target.rstrip("/") or "/", str(host).rstrip("/") or "/"))
    mounts.sort(key=lambda m: len(m.container), reverse=True)
    workdir = str(spec.get("working_dir", "/"))
    if not workdir.startswith("/"):
        raise _Refused(service.lines["working_dir"][1], f"working_dir {workdir}")
    _config_mounts(mounts, env, service.lines.get("volumes", ("", 0))[1])
    image = str(spec.get("image", "(built here)"))
    return ServerCommand(
        origin=f"{service.lines.get('image', (base.name, 0))[0]} [{service.name}]",
        argv=(*program, *command), env=env, base_dir=Path(workdir), mounts=tuple(mounts),
        in_container=True, binary_elsewhere=f"runs inside the container image {image}",
        notes=tuple(notes),
    )  # fmt: skip


def _config_mounts(mounts: list[BindMount], env: dict[str, str], line: int) -> None:
    """A bind mount that shows a config file llama-server would read in the container."""
    home = env.get("HOME", "/root")  # the published images run as root
    user = f"{env.get('XDG_CONFIG_HOME', home + '/.config')}/llama.cpp/config.ini"
    for mount in mounts:
        for path in (SYSTEM_CONFIG, user):
            if path == mount.container or path.startswith(mount.container.rstrip("/") + "/"):
                host = Path(mount.host + path[len(mount.container.rstrip("/")) :])
                if host.exists():
                    raise _Refused(
                        line,
                        f"a bind mount at {mount.container} shows {host} as "
                        f"{path}, which the server reads",
                        "mount only model files",
                    )
        if ".config" in mount.container or "llama.cpp" in mount.container:
            raise _Refused(line, f"a bind mount at {mount.container} (a config folder)",
                           "mount only the model folder")  # fmt: skip


def _other(service: _Service, server_hosts: list[str], path: Path) -> list[NotUnderstood]:
    file, line = next(iter(service.lines.values()), (path.name, 0))
    if _mentions(service.spec):
        return [NotUnderstood(file, line, f"[{service.name}] mentions a server but is not a "
                              "llama-server service of the grammar", _FIX)]  # fmt: skip
    out: list[NotUnderstood] = []
    if "volumes_from" in service.spec or "extends" in service.spec:
        out.append(NotUnderstood(file, line, f"[{service.name}] volumes_from/extends"))
    for item in service.spec.get("volumes", []) if isinstance(service.spec.get("volumes"),
                                                              list) else []:  # fmt: skip
        text = str(plain(item) if isinstance(item, dict) else item)
        source = text.partition(":")[0]
        host = str(Path(source) if source.startswith("/") else (path.parent / source).resolve())
        for server in server_hosts:
            overlaps = (host + "/").startswith(server + "/") or (server + "/").startswith(
                host + "/"
            )
            if overlaps and not text.endswith(":ro"):
                out.append(NotUnderstood(file, line, f"[{service.name}] binds {source} "
                                             "writable, which a server reads"))  # fmt: skip
    return out


__all__ = ["OVERRIDES", "SERVER_KEYS", "compose_commands", "parse_env_file", "project_files"]
