"""Reading deploy files: which ``llama-server`` processes a deploy starts, with what argv and
environment.

Four kinds of file are read, each with the environment of the whole file, unit or service:

* a shell script or any text with command lines: ``export X=..`` and bare ``LLAMA_ARG_*=..``
  anywhere in the file, plus ``X=.. llama-server ..`` on the line itself (which wins);
* a systemd unit (a ``[Service]`` section): ``Environment=`` lines, ``EnvironmentFile=`` when
  readable, and the ``ExecStart=`` command;
* a compose file (``.yml``/``.yaml`` with ``services:``): each service whose image is
  llama.cpp's or whose entrypoint/command runs llama-server; ``environment:`` as a map or a
  list, ``command:`` as a string or a list, container model paths mapped back through
  ``volumes:``;
* a ``models.toml`` registry, read by the one registry reader (:mod:`profiles.models`), with the
  ``kv`` cache type applied as run-live applies it.

A line is a server only when a ``llama-server`` executable is in command position (after
environment assignments and wrappers such as ``exec``/``nohup``/``taskset``): ``python3 -m
venv`` or ``Description=llama-server`` are not servers. An environment file that cannot be
read is recorded, and the gate fails the cell closed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_invariance.errors import UsageError

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = frozenset(
    {"exec", "nohup", "sudo", "env", "nice", "ionice", "taskset", "numactl", "time", "stdbuf",
     "setsid", "chrt", "command", "timeout", "doas", "runuser", "su", "-u"}
)  # fmt: skip
_OPERATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&"})
_WRAPPER_VALUE = re.compile(r"^[0-9][0-9,.\-:a-z]*$")


@dataclass(frozen=True)
class ServerCommand:
    """One llama-server a deploy file starts."""

    #: Where it came from, for messages (``deploy.sh:3``, ``compose.yml [llm]``).
    origin: str
    argv: tuple[str, ...]
    #: The environment it runs with (file-wide, then per-command; later wins).
    env: Mapping[str, str]
    #: A models.toml ``gguf`` (placeholder filled) that replaces ``-m``.
    model_override: str | None = None
    alias: str | None = None
    #: Folder relative model paths are resolved against.
    base_dir: Path = Path(".")
    #: Container-path -> host-path prefixes from compose ``volumes:``.
    mounts: tuple[tuple[str, str], ...] = ()
    #: Environment files that could not be read (their variables are unknown).
    unread_env_files: tuple[str, ...] = field(default_factory=tuple)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash-continued lines; keep the number of each line's first physical line."""
    out: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not buffer:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        out.append((start, " ".join(buffer)))
        buffer = []
    if buffer:
        out.append((start, " ".join(buffer)))
    return out


def _split(line: str, where: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as exc:
        raise UsageError(f"{where}: cannot parse the command line ({exc})") from None


def _is_server(token: str) -> bool:
    return "=" not in token and token.rsplit("/", 1)[-1].startswith("llama-server")


def server_argv(tokens: Sequence[str]) -> tuple[dict[str, str], tuple[str, ...]] | None:
    """``(inline env, argv)`` when a segment runs llama-server in command position (pure)."""
    env: dict[str, str] = {}
    for index, token in enumerate(tokens):
        if _is_server(token):
            return env, tuple(tokens[index:])
        if _ASSIGN.match(token):
            key, _, value = token.partition("=")
            env[key] = value
        elif not (token in _WRAPPERS or token.startswith("-") or _WRAPPER_VALUE.match(token)):
            return None
    return None


def _assignments(tokens: Sequence[str]) -> dict[str, str]:
    return dict(t.partition("=")[::2] for t in tokens if _ASSIGN.match(t))


def _read_env_file(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    env: dict[str, str] = {}
    for line in text.splitlines():
        body = line.strip().removeprefix("export ").strip()
        if body and not body.startswith("#") and _ASSIGN.match(body):
            key, _, value = body.partition("=")
            env[key] = value.strip().strip("'\"")
    return env


def _load_env_file(name: str, base_dir: Path, env: dict[str, str], unread: list[str]) -> None:
    """Merge a sourced / ``EnvironmentFile=`` file into ``env``, or record it as unread."""
    path = Path(name).expanduser()
    loaded = _read_env_file(path if path.is_absolute() else base_dir / path)
    if loaded is None:
        unread.append(name)
    else:
        env.update(loaded)


_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(token: str, env: Mapping[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` replaced from the file's environment (as the shell and systemd
    do); an unknown name stays as written, so a flag that needs a number fails loudly."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(sub, token)


def text_commands(text: str, name: str, base_dir: Path) -> tuple[ServerCommand, ...]:
    """The servers of a shell script or systemd unit, each with the whole file's env."""
    systemd = re.search(r"^\s*\[(Service|Unit|Install)\]\s*$", text, re.MULTILINE) is not None
    file_env: dict[str, str] = {}
    unread: list[str] = []
    found: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
    for number, line in _logical_lines(text):
        where = f"{name}:{number}"
        body = line.strip()
        if not body or body.startswith(("#", ";")):
            continue
        key, eq, value = body.partition("=")
        if systemd and eq and re.fullmatch(r"[A-Za-z]+", key.strip()):
            key = key.strip()
            if key == "Environment":
                file_env.update(_assignments(_split(value, where)))
            elif key == "EnvironmentFile":
                _load_env_file(value.strip().lstrip("-"), base_dir, file_env, unread)
            elif key == "ExecStart":
                hit = server_argv(_split(value.lstrip("-@:+!"), where))
                if hit is not None:
                    found.append((where, *hit))
            continue  # Description=llama-server and every other key are not commands
        tokens = _split(body, where)
        segments: list[list[str]] = [[]]
        for token in tokens:
            if token in _OPERATORS:
                segments.append([])
            else:
                segments[-1].append(token)
        for segment in segments:
            if segment[:1] in (["source"], ["."]) and len(segment) > 1:
                _load_env_file(segment[1], base_dir, file_env, unread)
                continue
            if segment[:1] == ["export"] or (segment and all(_ASSIGN.match(t) for t in segment)):
                file_env.update(_assignments(segment))
                continue
            hit = server_argv(segment)
            if hit is not None:
                found.append((where, *hit))
    return tuple(
        ServerCommand(
            origin=where,
            argv=tuple(expand(token, {**file_env, **inline}) for token in argv),
            env={**file_env, **inline},
            base_dir=base_dir,
            unread_env_files=tuple(unread),
        )
        for where, inline, argv in found
    )


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
        return _split(raw, f"{where} {key}")
    if isinstance(raw, list):
        return [_yaml_text(v) for v in raw]
    raise UsageError(f"{where}: {key} must be a string or a list")


def compose_commands(
    data: Mapping[str, Any], name: str, base_dir: Path
) -> tuple[ServerCommand, ...]:
    """The llama-server services of a compose file (pure over the decoded YAML)."""
    services = data.get("services")
    if not isinstance(services, Mapping):
        return ()
    out: list[ServerCommand] = []
    for service, spec in services.items():
        if not isinstance(spec, Mapping):
            continue
        where = f"{name} [{service}]"
        image = str(spec.get("image") or "")
        words = _compose_words(spec.get("entrypoint"), where, "entrypoint")
        words += _compose_words(spec.get("command"), where, "command")
        hit = server_argv(words)
        if hit is None and ("llama.cpp" in image or "llama-server" in image):
            hit = ({}, ("llama-server", *words))  # the image's entrypoint is llama-server
        if hit is None:
            continue
        env = _compose_env(spec.get("environment"), where)
        unread: list[str] = []
        files = spec.get("env_file")
        from_files: dict[str, str] = {}
        for item in [files] if isinstance(files, str) else files or []:
            name = str(item.get("path") if isinstance(item, Mapping) else item)
            _load_env_file(name, base_dir, from_files, unread)
        env = {**from_files, **env}  # environment: beats env_file:
        mounts: list[tuple[str, str]] = []
        for volume in spec.get("volumes") or []:
            parts = str(volume).split(":") if isinstance(volume, str) else []
            if len(parts) >= 2 and parts[0].startswith((".", "/", "~")):
                mounts.append((parts[1].rstrip("/"), parts[0].rstrip("/")))
        out.append(
            ServerCommand(
                origin=where,
                argv=hit[1],
                env={**env, **hit[0]},
                base_dir=base_dir,
                mounts=tuple(mounts),
                unread_env_files=tuple(unread),
            )
        )
    return tuple(out)


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
            )
        )
    return tuple(out)


def read_deploy_file(path: Path, models_dir: str | None = None) -> tuple[ServerCommand, ...]:
    """Every llama-server a deploy file starts; a file with none is a usage error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read deploy config {path}: {exc}") from None
    base = path.parent
    suffix = path.suffix.lower()
    if suffix == ".toml":
        commands = toml_commands(path, text, models_dir)
    elif suffix in (".yml", ".yaml") or re.search(r"^services:\s*$", text, re.MULTILINE):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(
                f"{path.name}: not valid YAML ({' '.join(str(exc).split())})"
            ) from None
        commands = compose_commands(data if isinstance(data, Mapping) else {}, path.name, base)
    else:
        commands = text_commands(text, path.name, base)
    if not commands:
        raise UsageError(
            f"{path.name}: no llama-server command line, compose service or [[models]] entry "
            "found; pass the file that starts the server"
        )
    return commands
