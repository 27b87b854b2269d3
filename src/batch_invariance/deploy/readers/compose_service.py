"""A server service of a compose file read on an allowlist (its keys: :data:`SERVER_KEYS`),
and what the compose and Kubernetes readers share of a container: which program it starts
(:func:`container_program`: serve in an image pinned by digest, or llama-server, read to name
its cell), the mounts that may not cover what the image runs (:func:`program_mount`) and the
command it becomes (:func:`container_command`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from posixpath import normpath
from typing import Any

from batch_invariance.deploy.readers.compose_yaml import Refused, plain
from batch_invariance.deploy.readers.shell import starts_server
from batch_invariance.gate.serve_line import is_serve
from batch_invariance.gate.server_command import BindMount, ServerCommand

#: The binary of the published llama.cpp ``:server`` images (their entrypoint).
IMAGE_SERVER = "/app/llama-server"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
#: What names a server, a model file or this tool: a container or service that mentions it
#: and starts none the readers read is refused.
TRIGGER = re.compile(
    r"llama-server|llama\.cpp|llama_cpp|LLAMA_ARG_|\.gguf\b|batch-invariance", re.I
)
PIN = "pin the image as NAME:TAG@sha256:<64 hex>"
MOUNT_FIX = "mount models and certs at /models, /certs"
SERVER_KEYS = frozenset(
    {"image", "command", "entrypoint", "environment", "volumes", "working_dir", "ports",
     "expose", "restart", "container_name", "hostname", "networks", "depends_on", "labels",
     "stop_signal", "stop_grace_period", "init", "healthcheck", "logging", "deploy", "ulimits",
     "mem_limit", "memswap_limit", "cpus", "cpu_shares", "shm_size", "oom_score_adj",
     "read_only", "user", "stdin_open", "tty"}
)  # fmt: skip
#: Folders of a serve image a volume may not cover: the programs, what the dynamic loader
#: and Python load, and their configuration (``/etc/ld.so.preload``).
IMAGE_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/app", "/opt", "/etc")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:,@%+=\- ]*")
FIX = "keep the service to the keys in docs/deploy.md, or entrypoint batch-invariance serve"


def _words(value: Any, line: int, key: str) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value)
    if not re.fullmatch(r"[A-Za-z0-9_./:,@%+=\- ]*", text):
        raise Refused(line, f"{key}: string with quotes or special characters",
                       f"write {key} as a YAML list")  # fmt: skip
    return text.split()


def _environment(value: Any, line: int) -> dict[str, str]:
    pairs: dict[str, str] = {}
    items = value.items() if isinstance(value, dict) else None
    if items is not None:
        for name, (text, where) in items:
            if text is None:
                raise Refused(where, f"environment {name} without a value (it passes the "
                               "caller's through)", f"write {name}: VALUE")  # fmt: skip
            if isinstance(text, (list, dict)):
                raise Refused(where, f"environment {name}: not a value")
            pairs[name] = str(text)
    elif isinstance(value, list):
        for item in value:
            name, eq, text = str(item).partition("=")
            if not eq:
                raise Refused(line, f"environment entry {name} without a value (it passes the "
                               "caller's through)", f"write {name}=VALUE")  # fmt: skip
            pairs[name] = text
    else:
        raise Refused(line, "environment that is neither a map nor a list")
    for name, text in pairs.items():
        if not _NAME.fullmatch(name) or not _PLAIN_VALUE.fullmatch(text):
            raise Refused(line, f"environment {name}={text[:40]}", "plain NAME=VALUE")
    return pairs


def _volume(item: Any, line: int) -> tuple[str, str, bool]:
    """(host source as written, container target, read-only) of a bind mount."""
    if isinstance(item, dict):
        spec = plain(item)
        if spec.get("type") != "bind" or set(spec) - {"type", "source", "target", "read_only"}:
            raise Refused(line, "a volume that is not a bind mount (its content is unknown)")
        source, target = str(spec.get("source") or ""), str(spec.get("target") or "")
        if not source.startswith(("/", "./", "../")) or not target.startswith("/"):
            raise Refused(line, f"bind mount {source or '(no source)'} at "
                           f"{target or '(no target)'}", "source: ./x, target: /y")  # fmt: skip
        read_only = spec.get("read_only", False)
        if read_only not in (True, False, "true", "false"):
            raise Refused(line, f"read_only {read_only}", "read_only: true")
        return source, target, read_only in (True, "true")
    source, _, rest = str(item).partition(":")
    target, _, mode = rest.partition(":")
    if not source.startswith(("/", "./", "../")) or not target.startswith("/"):
        raise Refused(line, f"volume {item} (a named volume or a relative target; its content "
                       "is unknown)", "bind a host folder: ./models:/models:ro")  # fmt: skip
    if mode and not set(mode.split(",")) <= {"ro", "rw", "z", "Z"}:
        raise Refused(line, f"volume mode {mode}")
    return source, target, "ro" in mode.split(",")


@dataclass
class Service:
    name: str
    spec: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, tuple[str, int]] = field(default_factory=dict)


def read_services(data: dict[str, Any], shown: str) -> dict[str, Service]:
    """The services of one compose file, ``environment`` as plain ``NAME -> value``."""
    services: dict[str, Service] = {}
    for name, (spec, line) in data.items():
        if not isinstance(spec, dict):
            raise Refused(line, f"service {name} that is not a mapping")
        service = services.setdefault(name, Service(name))
        for key, (value, where) in spec.items():
            service.spec[key] = _environment(value, where) if key == "environment" else value
            service.lines[key] = (shown, where)
    return services


def image_tag(image: str) -> tuple[str, str, str]:
    """``(repository, tag, digest)`` of an image reference ``REPO[:TAG][@DIGEST]`` (a part not
    given is empty)."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repo, _, tag = name.rpartition(":")
        return repo, tag, digest
    return name, "", digest


def container_program(argv: list[str], image: str, line: int) -> list[str] | None:
    """``argv`` (``[]``: the image's entrypoint) when it starts serve or llama-server, else
    ``None``; serve only in an image pinned by digest."""
    repo, tag, digest = image_tag(image)
    if not argv and "llama.cpp" in repo and tag.startswith("server"):
        argv = [IMAGE_SERVER]  # the published :server images' entrypoint
    if not starts_server(argv):
        return None
    if is_serve(argv) and not _DIGEST.fullmatch(digest):
        raise Refused(line, f"serve in image {image[:80]}, not pinned by digest", PIN)
    return argv


def mentions_server(value: Any) -> bool:
    """Any key or value under ``value`` names a server, a model file or this tool."""
    return bool(TRIGGER.search(repr(value)))


def container_command(
    origin: str, argv: list[str], env: dict[str, str], workdir: str, mounts: list[BindMount],
    image: str,
) -> ServerCommand:  # fmt: skip
    """The server a container starts; its mounts longest container path first."""
    return ServerCommand(
        origin=origin, argv=tuple(argv), env=env, base_dir=Path(workdir),
        mounts=tuple(sorted(mounts, key=lambda m: len(m.container), reverse=True)),
        binary_elsewhere=f"runs inside the container image {image}", image=image,
    )  # fmt: skip


def _covers(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def program_mount(target: str, program: str) -> str | None:
    """Why a volume at ``target`` could replace what a container's program runs or loads
    (on or above its folder or one of :data:`IMAGE_FOLDERS`), or ``None``."""
    for folder in (str(PurePosixPath(program).parent), *IMAGE_FOLDERS):
        if target == "/" or _covers(target, folder) or _covers(folder, target):
            return f"volume at {target}, on, above or below {folder} (it replaces what runs)"
    return None


def read_server(service: Service, path: Path) -> ServerCommand | None:
    spec, lines = service.spec, service.lines
    image = str(spec.get("image", ""))
    line = lines.get("image", ("", 0))[1]
    digest = image_tag(image)[2]
    if digest and not _DIGEST.fullmatch(digest):
        raise Refused(line, f"image digest {digest[:80]} (not sha256:<64 hex>)", PIN)
    entrypoint = spec.get("entrypoint")
    words = [] if entrypoint is None else _words(entrypoint, line, "entrypoint")
    program = container_program(words, image, line)
    if program is None or (entrypoint is not None and not words):
        return None
    for key in spec:
        if key not in SERVER_KEYS:
            raise Refused(lines[key][1], f"key {key} of a server service")
    command = _words(spec.get("command", []), lines.get("command", ("", 0))[1], "command")
    mounts: list[BindMount] = []
    volumes_line = lines.get("volumes", ("", 0))[1]
    for item in spec.get("volumes", []):
        source, target, _ = _volume(item, volumes_line)
        if (problem := program_mount(normpath(target), program[0])) is not None:
            raise Refused(volumes_line, problem, MOUNT_FIX)
        host = Path(source) if source.startswith("/") else (path.parent / source).resolve()
        mounts.append(BindMount(normpath(target), str(host).rstrip("/") or "/"))
    workdir = str(spec.get("working_dir", "/"))
    if not workdir.startswith("/"):
        raise Refused(lines["working_dir"][1], f"working_dir {workdir}")
    return container_command(
        f"{path.name} [{service.name}]", [*program, *command],
        dict(spec.get("environment", {})), workdir, mounts, image or "(built here)",
    )  # fmt: skip
