"""The model registry of a profile: ``models.toml`` (copied by the user from
``models.example.toml``).

Format::

    [defaults]
    server_bin = "~/llama.cpp/build/bin/llama-server"  # optional; ~ is expanded
    server_flags = ["-ngl", "99"]                   # optional, every model gets these first

    [[models]]
    alias = "gemma3-270m"                           # what --model-alias names
    gguf = "{MODELS_DIR}/gemma-3-270m-q4_k_m.gguf"  # {MODELS_DIR}: --models-dir or $MODELS_DIR
    kv = "f16"                                      # KV cache type (-ctk/-ctv), the cert's kv label
    server_flags = ["--flash-attn", "on"]           # optional, appended after the defaults
    server_bin = "/opt/other/llama-server"          # optional, beats defaults.server_bin

Parsing is pure (:func:`parse_registry`); :func:`read_registry` reads the file and
:func:`resolve_model` fills the placeholder and checks the file exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch_invariance.cert.signing_policy import load_toml as _load_toml
from batch_invariance.errors import UsageError

__all__ = [
    "MAX_NESTING",
    "PLACEHOLDER",
    "ModelEntry",
    "Registry",
    "ResolvedModel",
    "fill_models_dir",
    "kv_flags",
    "load_toml",
    "parse_registry",
    "read_registry",
    "resolve_model",
]

PLACEHOLDER = "{MODELS_DIR}"
_ANY_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
#: The deepest arrays and inline tables may nest in a TOML file read here: Python's TOML
#: reader recurses once per level, so thousands of levels were a RecursionError (a crash, not
#: an answer). Deeper is refused at its line before the reader starts (a bound on its work).
MAX_NESTING = 64
#: What the nesting scan steps over whole: strings (an unterminated one to its line's or the
#: file's end, so no string is scanned twice) and comments; and the brackets it counts.
_TOML_TOKEN = re.compile(
    r'"""(?:[^"\\]|\\.|\\\Z|"(?!""))*(?:"""|\Z)'
    r"|'''(?:[^']|'(?!''))*(?:'''|\Z)"
    r'|"(?:[^"\\\n]|\\[^\n])*"?'
    r"|'[^'\n]*'?"
    r"|#[^\n]*"
    r"|[\[\]{}]",
    re.S,
)


class _Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    server_bin: str | None = None
    server_flags: list[str] = Field(default_factory=list)


class _ModelRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    alias: str = Field(min_length=1)
    gguf: str = Field(min_length=1)
    kv: str = Field(min_length=1)
    server_flags: list[str] = Field(default_factory=list)
    server_bin: str | None = None


class _Registry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    defaults: _Defaults = Field(default_factory=_Defaults)
    models: list[_ModelRow] = Field(default_factory=list)


@dataclass(frozen=True)
class ModelEntry:
    """One ``[[models]]`` row with the defaults already merged in."""

    alias: str
    gguf: str
    kv: str
    server_bin: str | None
    server_flags: tuple[str, ...]


@dataclass(frozen=True)
class Registry:
    """A parsed ``models.toml``."""

    source: str
    models: Mapping[str, ModelEntry]

    def entry(self, alias: str) -> ModelEntry:
        """The row for ``alias``; an unknown alias is a :class:`UsageError` listing the known."""
        try:
            return self.models[alias]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "(none)"
            raise UsageError(
                f"unknown --model-alias {alias!r} in {self.source}; known aliases: {known}"
            ) from None


@dataclass(frozen=True)
class ResolvedModel:
    """A registry row resolved against the models folder."""

    alias: str
    model: Path
    kv: str
    server_bin: str | None
    server_flags: tuple[str, ...]


def nesting_line(text: str) -> int | None:
    """The line where arrays and inline tables nest deeper than :data:`MAX_NESTING` (strings
    and comments skipped), or ``None``."""
    depth = 0
    for match in _TOML_TOKEN.finditer(text):
        token = match.group(0)
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                return text.count("\n", 0, match.start()) + 1
        elif token in ("]", "}"):
            depth -= 1
    return None


def load_toml(text: str, source: str) -> dict[str, Any]:
    """Decode TOML text (:func:`batch_invariance.cert.signing_policy.load_toml`), nested no
    deeper than :data:`MAX_NESTING`; deeper is a one-line :class:`UsageError` at its line."""
    line = nesting_line(text)
    if line is not None:
        raise UsageError(
            f"{source}:{line}: not understood: arrays or inline tables nested deeper than "
            f"{MAX_NESTING} levels (a bound on the work of the reader); write a flat registry"
        )
    return _load_toml(text, source)


def parse_registry(data: Mapping[str, Any], source: str) -> Registry:
    """Validate decoded TOML as a registry. Errors are one-line :class:`UsageError`s."""
    try:
        raw = _Registry.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "file"
        raise UsageError(f"{source}: {where}: {first.get('msg')}; fix it and rerun") from None
    models: dict[str, ModelEntry] = {}
    for row in raw.models:
        if row.alias in models:
            raise UsageError(f"{source}: alias {row.alias!r} is defined twice")
        models[row.alias] = ModelEntry(
            alias=row.alias,
            gguf=row.gguf,
            kv=row.kv,
            server_bin=row.server_bin if row.server_bin is not None else raw.defaults.server_bin,
            server_flags=tuple(raw.defaults.server_flags) + tuple(row.server_flags),
        )
    return Registry(source=source, models=models)


def kv_flags(kv: str | None) -> tuple[str, ...]:
    """A row's ``kv`` as server flags: both cache types, after the row's own flags (as run-live
    applies it, and as check-deploy reads a registry used as a deploy config)."""
    return () if kv is None else ("--cache-type-k", kv, "--cache-type-v", kv)


def read_registry(path: Path) -> Registry:
    """Read and parse a ``models.toml``."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    return parse_registry(load_toml(text, str(path)), str(path))


def fill_models_dir(entry: ModelEntry, models_dir: str | None, source: str) -> Path:
    """The gguf path of ``entry`` with ``{MODELS_DIR}`` filled (pure: no file checks)."""
    gguf = entry.gguf
    if PLACEHOLDER in gguf:
        if not models_dir:
            raise UsageError(
                f"{source}: alias {entry.alias!r} uses {PLACEHOLDER} but no models folder was "
                "given; pass --models-dir DIR or set MODELS_DIR"
            )
        gguf = gguf.replace(PLACEHOLDER, models_dir.rstrip("/") or "/")
    leftover = _ANY_PLACEHOLDER.search(gguf)
    if leftover:
        raise UsageError(
            f"{source}: alias {entry.alias!r}: unknown placeholder {leftover.group(0)} in gguf; "
            f"only {PLACEHOLDER} is supported"
        )
    return Path(gguf).expanduser()


def resolve_model(
    registry: Registry, alias: str, models_dir: str | None, model_override: str | None = None
) -> ResolvedModel:
    """Look ``alias`` up, fill the placeholder and check that the model file exists.

    With ``model_override`` (an explicit ``--model``) the row's gguf is not consulted at all.
    """
    entry = registry.entry(alias)
    if model_override is not None:
        path = Path(model_override).expanduser()
    else:
        path = fill_models_dir(entry, models_dir, registry.source)
    if model_override is None and not path.is_file():
        raise UsageError(
            f"model file for alias {alias!r} not found: {path} "
            f"(check --models-dir / MODELS_DIR and {registry.source})"
        )
    return ResolvedModel(
        alias=alias,
        model=path,
        kv=entry.kv,
        server_bin=None if entry.server_bin is None else str(Path(entry.server_bin).expanduser()),
        server_flags=entry.server_flags,
    )
