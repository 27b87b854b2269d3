"""Reading a compose project on an allowlist: the one compose file `docker compose` picks, and
the ``.env`` it reads.

Without ``-f`` compose reads the first of :data:`DEFAULT_FILES` in its folder and merges the
first of :data:`OVERRIDES` (compose-go): another such file beside the one given is refused. A
server service runs serve (in an image pinned by digest) or llama-server
(:mod:`batch_invariance.deploy.readers.compose_service`). Any ``$`` (interpolation) is refused,
as is a ``.env`` setting ``COMPOSE_*`` or ``DOCKER_*``. Other services may not mention a server
nor bind a server's host folder writable.
"""

from __future__ import annotations

import re
from pathlib import Path

from batch_invariance.deploy.readers.compose_service import (
    FIX,
    Service,
    mentions_server,
    read_server,
    read_services,
)
from batch_invariance.deploy.readers.compose_yaml import Refused, load, plain
from batch_invariance.deploy.readers.source_bytes import BUDGET_FIX, ServerBudget
from batch_invariance.gate.server_command import DeployRead, NotUnderstood, ServerCommand

#: The files `docker compose` reads without ``-f``, in its order of preference (compose-go
#: ``cli.DefaultFileNames``): the first present wins.
DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
#: The override files it then merges into the winner, in its order (compose-go
#: ``cli.DefaultOverrideFileNames``): the first present is merged.
OVERRIDES = (
    "compose.override.yml", "compose.override.yaml", "docker-compose.override.yml",
    "docker-compose.override.yaml",
)  # fmt: skip
TOP_KEYS = frozenset({"services", "volumes", "networks", "name", "version"})


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
    try:
        text = env.read_text("ascii", "replace")
    except FileNotFoundError:
        return []
    except OSError:
        return [NotUnderstood(str(env), 0, ".env that cannot be read here")]
    found = re.search(r"^[ \t]*(export[ \t]+)?(COMPOSE_|DOCKER_)", text, re.M)
    if found is None:
        return []
    line = text.count("\n", 0, found.start()) + 1
    return [NotUnderstood(str(env), line, "COMPOSE_* or DOCKER_* in .env (it changes what "
                          "compose reads or runs)")]  # fmt: skip


def _ancestors(path: str) -> list[str]:
    parts = path.rstrip("/").split("/")
    return ["/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)]


def compose_commands(path: Path, text: str) -> DeployRead:
    """The llama-server services of a compose file, read as `docker compose` reads it."""
    shown = path.name
    bad: list[NotUnderstood] = [*project_problems(path), *_dot_env(path.parent)]
    services: dict[str, Service] = {}
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
            bad.append(NotUnderstood(shown, line, f"top-level key {key}", FIX))
    raw = data.get("services", ({}, 0))[0]
    try:
        if not isinstance(raw, dict):
            raise Refused(1, "services that is not a mapping")
        services = read_services(raw, shown)
    except Refused as exc:
        bad.append(NotUnderstood(shown, exc.line, exc.construct, exc.fix))
    commands: list[ServerCommand] = []
    server_hosts: set[str] = set()
    others: list[Service] = []
    budget = ServerBudget()
    for service in services.values():
        try:
            command = read_server(service, path)
        except Refused as exc:
            bad.append(NotUnderstood(shown, exc.line, f"[{service.name}] {exc.construct}",
                                     exc.fix or FIX))  # fmt: skip
            continue
        if command is None:
            others.append(service)
            continue
        crossed = budget.spend(command.argv, command.env)
        if crossed is not None:  # each server is a cell the gate checks, word by word
            file, line = next(iter(service.lines.values()), (shown, 0))
            bad.append(NotUnderstood(file, line, f"[{service.name}] {crossed}", BUDGET_FIX))
            break
        commands.append(command)
        server_hosts.update(m.host for m in command.mounts)
    # Each host folder a server binds and the folders above it: a bind on, above or below
    # one is found by looking up its own folders, in time proportional to the paths.
    above = {a for host in server_hosts for a in _ancestors(host)}
    servers = (server_hosts, above)
    for service in others:
        bad.extend(_other(service, servers, path))
    return DeployRead(tuple(commands), tuple(bad))


def _other(service: Service, servers: tuple[set[str], set[str]], path: Path) -> list[NotUnderstood]:
    """What of a service that starts no server is off the allowlist: a mention of a server,
    or a writable bind of a host folder on or above or below one a server reads
    (``servers``: their host folders)."""
    file, line = next(iter(service.lines.values()), (path.name, 0))
    if mentions_server(service.spec):
        return [NotUnderstood(file, line, f"[{service.name}] mentions a server but is not a "
                              "server service the reader reads", FIX)]  # fmt: skip
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
        overlaps = host.rstrip("/") in servers[1] or any(a in servers[0] for a in _ancestors(host))
        if overlaps and not read_only:
            out.append(NotUnderstood(file, line, f"[{service.name}] binds {source} "
                                     "writable, which a server reads"))  # fmt: skip
    return out
