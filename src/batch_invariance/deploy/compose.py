"""Reading a compose project inside a closed grammar: the compose file as `docker compose` picks
it, and the ``.env`` file it reads (the compose specification, "Interpolation").

Without ``-f``, `docker compose` reads the first of :data:`DEFAULT_FILES` in its folder, and
merges the first of :data:`OVERRIDES` beside it (compose-go ``WithDefaultConfigPath``). The
checker reads exactly one file, so a folder where compose could read another file than the one
given, or merge an override file into it, is not understood (naming that file).

A server service is one whose image is a llama.cpp ``:server*`` image (by tag, by tag and
digest; entrypoint ``/app/llama-server``) or whose ``entrypoint`` runs llama-server. Its keys
must be in :data:`SERVER_KEYS`; its volumes bind host folders (a named volume or tmpfs could
hold any file) and none lands on or above the server binary, a library it loads or a config
file it reads; its ``environment`` holds values (a name without one passes the caller's
through); its ``env_file`` entries are read as compose reads them (``required: false`` and
absent: skipped, with a note). Any ``$`` (interpolation from the caller's environment or
``.env``) is not understood. Other services may not mention a server and may not bind a
server's host folder writable.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from posixpath import normpath
from typing import Any

from batch_invariance.deploy.commands import (
    BindMount,
    DeployRead,
    NotUnderstood,
    ServerCommand,
)
from batch_invariance.deploy.compose_yaml import load, plain
from batch_invariance.deploy.env_file import NAME, PLAIN_VALUE, parse_env_file, read_env_file
from batch_invariance.deploy.path_trust import TRUST_FIX, trust_problem
from batch_invariance.engines.llama_server.env import SYSTEM_CONFIG

TRIGGER = re.compile(
    r"llama-server|llama\.cpp|llama_cpp|LLAMA_ARG_|\.gguf\b|batch-invariance", re.I
)
#: The files `docker compose` reads without ``-f``, in its order of preference (compose-go
#: ``cli.DefaultFileNames``): the first present wins.
DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
#: The override files it then merges into the winner, in its order (compose-go
#: ``cli.DefaultOverrideFileNames``): the first present is merged.
OVERRIDES = (
    "compose.override.yml", "compose.override.yaml", "docker-compose.override.yml",
    "docker-compose.override.yaml",
)  # fmt: skip
#: The binary of the published llama.cpp ``:server`` images (their entrypoint).
IMAGE_SERVER = "/app/llama-server"
#: The ``PATH`` a bare entrypoint is looked up on when the service sets none (Docker's default).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What the dynamic loader reads the server's libraries and its own configuration from.
LOADER_PATHS = (
    "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib",
    "/usr/local/cuda", "/etc/ld.so.preload", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
)  # fmt: skip
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TOP_KEYS = frozenset({"services", "volumes", "networks", "name", "version"})
SERVER_KEYS = frozenset(
    {"image", "command", "entrypoint", "environment", "env_file", "volumes", "working_dir",
     "ports", "expose", "restart", "container_name", "hostname", "networks", "depends_on",
     "labels", "stop_signal", "stop_grace_period", "init"}
)  # fmt: skip
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
        source, target = str(spec.get("source") or ""), str(spec.get("target") or "")
        if not source.startswith(("/", "./", "../")) or not target.startswith("/"):
            raise _Refused(line, f"bind mount {source or '(no source)'} at "
                           f"{target or '(no target)'}", "source: ./x, target: /y")  # fmt: skip
        read_only = spec.get("read_only", False)
        if read_only not in (True, False, "true", "false"):
            raise _Refused(line, f"read_only {read_only}", "read_only: true")
        return source, target, read_only in (True, "true")
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


def _services(data: dict[str, Any], shown: str) -> dict[str, _Service]:
    """The services of one compose file, ``environment`` as plain ``NAME -> value``."""
    services: dict[str, _Service] = {}
    for name, (spec, line) in data.items():
        if not isinstance(spec, dict):
            raise _Refused(line, f"service {name} that is not a mapping")
        service = services.setdefault(name, _Service(name))
        for key, (value, where) in spec.items():
            service.spec[key] = _environment(value, where) if key == "environment" else value
            service.lines[key] = (shown, where)
    return services


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def project_problems(path: Path) -> list[NotUnderstood]:
    """Another file compose would read in ``path``'s folder: a default-named compose file it
    reads instead of (or beside) ``path``, or an override file it merges into ``path``."""
    folder, name = path.parent, path.name
    if name in OVERRIDES:
        why = f"{name} is an override file: `docker compose` merges it into the compose file"
        return [NotUnderstood(name, 0, why, "pass the compose file")]
    out: list[NotUnderstood] = []
    present = [f for f in DEFAULT_FILES if (folder / f).is_file()]
    for other in present:
        if other == name or _same_file(folder / other, path):
            continue
        if other == present[0]:
            why = f"{other}, which `docker compose` in this folder reads instead of {name}"
        else:
            why = (f"{other} beside {name}: compose reads {present[0]} without -f (and warns "
                   "of the other), a -f reads either")  # fmt: skip
        out.append(NotUnderstood(other, 0, why, "keep one compose file in the folder"))
    if name in DEFAULT_FILES:
        for other in (f for f in OVERRIDES if (folder / f).is_file()):
            out.append(NotUnderstood(other, 0, f"override file {other}: `docker compose` merges "
                                     f"it into {name} when run without -f (-f {name} does not), "
                                     "and the checker does not merge files",
                                     f"fold it into {name}, or remove it"))  # fmt: skip
    return out


def _dot_env(folder: Path) -> list[NotUnderstood]:
    env = folder / ".env"
    if not os.path.lexists(env):  # absent: fine unless others could create it
        problem = trust_problem(".env", str(env), may_be_absent=True)
        return [] if problem is None else [NotUnderstood(str(env), 0, problem, TRUST_FIX)]
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
    """The llama-server services of a compose file, read as `docker compose` reads it."""
    shown = path.name
    bad: list[NotUnderstood] = [*project_problems(path), *_dot_env(path.parent)]
    services: dict[str, _Service] = {}
    if "$" in text:
        line = text[: text.index("$")].count("\n") + 1
        bad.append(NotUnderstood(shown, line, "a $ (compose interpolates it from the caller's "
                                 "environment or .env)", "write the value out"))  # fmt: skip
        return DeployRead((), tuple(bad))
    data = load(text, shown)
    if isinstance(data, NotUnderstood):
        return DeployRead((), (*bad, data))
    for key, (_, line) in data.items():
        if key not in TOP_KEYS:
            bad.append(NotUnderstood(shown, line, f"top-level key {key}", _FIX))
    raw = data.get("services", ({}, 0))[0]
    try:
        if not isinstance(raw, dict):
            raise _Refused(1, "services that is not a mapping")
        services = _services(raw, shown)
    except _Refused as exc:
        bad.append(NotUnderstood(shown, exc.line, exc.construct, exc.fix))
    commands: list[ServerCommand] = []
    server_hosts: list[str] = []
    others: list[_Service] = []
    for service in services.values():
        try:
            command = _server(service, path)
        except _Refused as exc:
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


def image_tag(image: str) -> tuple[str, str, str]:
    """``(repository, tag, digest)`` of an image reference ``REPO[:TAG][@DIGEST]`` (a part not
    given is empty)."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repo, _, tag = name.rpartition(":")
        return repo, tag, digest
    return name, "", digest


def _program(spec: dict[str, Any], line: int) -> list[str] | None:
    image = str(spec.get("image", ""))
    entrypoint = spec.get("entrypoint")
    if entrypoint is not None:
        words = _words(entrypoint, line, "entrypoint")
        if words and PurePosixPath(words[0]).name.startswith("llama-server"):
            return words
        return None
    repo, tag, digest = image_tag(image)
    if digest and not _DIGEST.fullmatch(digest):
        raise _Refused(line, f"image digest {digest[:80]} (not sha256:<64 hex>)",
                       "pin the image as NAME:TAG@sha256:<64 hex>")  # fmt: skip
    if "llama.cpp" in repo and tag.startswith("server"):
        return [IMAGE_SERVER]  # the published :server images' entrypoint
    return None


def _env_files(value: Any, line: int, base: Path) -> tuple[dict[str, str], list[str]]:
    """The variables of a service's ``env_file`` entries, in order (a later file wins), and a
    note per optional file that is absent here. An entry is a path, or ``{path, required}``
    (compose's long form; ``required`` defaults to true)."""
    env: dict[str, str] = {}
    notes: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict):
            entry = plain(item)
            if set(entry) - {"path", "required"} or not isinstance(entry.get("path"), str):
                raise _Refused(line, f"env_file entry with keys {', '.join(sorted(entry))}",
                               "env_file: [{path: ./a.env, required: false}]")  # fmt: skip
            path, required = entry["path"], entry.get("required", True)
            if required not in (True, False, "true", "false"):
                raise _Refused(line, f"env_file {path}: required {required}",
                               "required: true or required: false")  # fmt: skip
            required = required in (True, "true")
        elif isinstance(item, str):
            path, required = item, True
        else:
            raise _Refused(line, "env_file that is neither a path nor {path, required}")
        if path.startswith("~"):
            raise _Refused(line, f"env_file {path} (compose expands ~ with its caller's HOME)",
                           "write the path absolute or relative to the compose file")  # fmt: skip
        file = Path(path) if path.startswith("/") else base / path
        if not required and not os.path.lexists(file):
            if problem := trust_problem("env_file", str(file), may_be_absent=True):
                raise _Refused(line, problem, TRUST_FIX)
            notes.append(f"env_file {path} is absent here (required: false): nothing set")
            continue
        read = read_env_file(file, str(file))
        if read is None:
            raise _Refused(line, f"env_file {path}, which cannot be read here")
        if read.not_understood:
            raise _Refused(line, f"env_file {path}: {read.not_understood[0]}")
        env.update(read.values)
    return env, notes


def _server(service: _Service, path: Path) -> ServerCommand | None:
    spec, base = service.spec, path.parent
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
    if "env_file" in spec:
        env, notes = _env_files(spec["env_file"], service.lines["env_file"][1], base)
    env.update(spec.get("environment", {}))
    mounts: list[BindMount] = []
    volumes_line = service.lines.get("volumes", ("", 0))[1]
    for item in spec.get("volumes", []):
        source, target, _ = _volume(item, volumes_line)
        host = Path(source) if source.startswith("/") else (base / source).resolve()
        mounts.append(BindMount(normpath(target), str(host).rstrip("/") or "/"))
    mounts.sort(key=lambda m: len(m.container), reverse=True)
    workdir = str(spec.get("working_dir", "/"))
    if not workdir.startswith("/"):
        raise _Refused(service.lines["working_dir"][1], f"working_dir {workdir}")
    _binary_mounts(mounts, _binaries(program[0], env, workdir), workdir, volumes_line)
    _config_mounts(mounts, env, volumes_line)
    _loader_mounts(mounts, volumes_line)
    image = str(spec.get("image", "(built here)"))
    return ServerCommand(
        origin=f"{path.name} [{service.name}]",
        argv=(*program, *command), env=env, base_dir=Path(workdir), mounts=tuple(mounts),
        in_container=True, binary_elsewhere=f"runs inside the container image {image}",
        notes=tuple(notes),
    )  # fmt: skip


def _covers(mount: str, path: str) -> bool:
    """A bind mount at container path ``mount`` lands on ``path`` or on a folder above it."""
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def _config_mounts(mounts: list[BindMount], env: dict[str, str], line: int) -> None:
    """A bind mount on or above a config file llama-server would read in the container, or
    at a config folder."""
    home = env.get("HOME", "/root")  # the published images run as root
    user = f"{env.get('XDG_CONFIG_HOME', home + '/.config')}/llama.cpp/config.ini"
    for mount in mounts:
        for path in (SYSTEM_CONFIG, user):
            if not _covers(mount.container, path):
                continue
            host = Path(mount.host + path[len(mount.container.rstrip("/")) :])
            shows = f"shows {host} as" if host.exists() else "lands on or above"
            raise _Refused(line, f"a bind mount at {mount.container} {shows} {path}, which the "
                           "server reads", "mount only model files")  # fmt: skip
        if ".config" in mount.container or "llama.cpp" in mount.container:
            raise _Refused(line, f"a bind mount at {mount.container} (a config folder)",
                           "mount only the model folder")  # fmt: skip


def _binaries(program: str, env: dict[str, str], workdir: str) -> list[str]:
    """Where the container's server binary may be: the entrypoint's path, or for a bare name
    each folder of the service's ``PATH`` (else Docker's default)."""
    if program.startswith("/"):
        return [normpath(program)]
    if "/" in program:
        return [normpath(f"{workdir}/{program}")]
    folders = env.get("PATH") or DEFAULT_PATH
    return [normpath(f"{f}/{program}") for f in folders.split(":") if f.startswith("/")]


_IMAGE_FIX = "mount only model folders: the server binary and its libraries come from the image"


def _binary_mounts(mounts: list[BindMount], binaries: list[str], workdir: str, line: int) -> None:
    """A bind mount that would replace the server the container runs: on or above its binary,
    or at a library beside it (or in the working folder, where ggml looks for its backends)."""
    fix = _IMAGE_FIX
    for mount in mounts:
        target = mount.container
        for binary in binaries:
            if _covers(target, binary):
                raise _Refused(line, f"a bind mount at {target} lands on or above the server "
                               f"binary {binary} of the image", fix)  # fmt: skip
        folder, name = target.rsplit("/", 1)
        beside = {b.rsplit("/", 1)[0] or "/" for b in binaries} | {workdir.rstrip("/") or "/"}
        if (folder or "/") in beside and (name.startswith("lib") or ".so" in name):
            raise _Refused(line, f"a bind mount at {target}, a library the server loads from "
                           "its folder", fix)  # fmt: skip


def _loader_mounts(mounts: list[BindMount], line: int) -> None:
    """A bind mount on, above or inside a folder the dynamic loader reads libraries from."""
    fix = _IMAGE_FIX
    for mount in mounts:
        target = mount.container
        for path in LOADER_PATHS:
            if _covers(target, path) or _covers(path, target):
                raise _Refused(line, f"a bind mount at {target} over {path}, which the dynamic "
                               "loader reads the server's libraries from", fix)  # fmt: skip


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
        if isinstance(item, dict):
            spec = plain(item)
            source, read_only = str(spec.get("source") or ""), spec.get("read_only") in (
                True, "true")  # fmt: skip
        else:
            text = str(item)
            source, read_only = text.partition(":")[0], text.endswith(":ro")
        host = str(Path(source) if source.startswith("/") else (path.parent / source).resolve())
        for server in server_hosts:
            overlaps = (host + "/").startswith(server + "/") or (server + "/").startswith(
                host + "/"
            )
            if overlaps and not read_only:
                out.append(NotUnderstood(file, line, f"[{service.name}] binds {source} "
                                             "writable, which a server reads"))  # fmt: skip
    return out


__all__ = [
    "DEFAULT_FILES",
    "IMAGE_SERVER",
    "OVERRIDES",
    "SERVER_KEYS",
    "compose_commands",
    "image_tag",
    "parse_env_file",
    "project_problems",
]
