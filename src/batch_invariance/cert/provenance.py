"""The cert's ``provenance`` block as a typed model, validated at the JSON edge with the cert.

The block is a free-form record of how a cell was run (docs/output-contract.md): engines and
drivers add keys of their own, and every key is covered by the digest. So each record here is
*open* (keys it does not name are kept as they were written) but every key it names is typed
and strict: a cert whose ``servers`` is not a list of objects, or whose ``model_file.sha256``
is a number, does not match the cert schema and is refused with the other malformed certs.

A record dumps exactly the keys it was given (a key written as ``null`` stays ``null``, a key
never written stays absent), so a cert reads back byte for byte and keeps its digest. Readers
use attributes (``cert.provenance.model_file.sha256``), never string keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = [
    "DEFAULT_ENGINE_NAME",
    "BinaryRecord",
    "ChatTemplateRecord",
    "JsonNumber",
    "JsonObject",
    "LibraryRecord",
    "ModelFileRecord",
    "PlanRecord",
    "ProfileRecord",
    "Provenance",
    "ScheduleRecord",
    "ServerEntry",
    "ServerInfo",
]

#: The engine a cert written before ``provenance.engine`` was recorded ran.
DEFAULT_ENGINE_NAME = "llama-server"


_R = TypeVar("_R", bound="_Record")

#: A JSON number kept as written: ``3`` stays ``3`` and ``3.0`` stays ``3.0`` (a float field
#: would turn ``3`` into ``3.0`` and change the cert's digest).
JsonNumber = int | float
#: An object whose keys the tool writes but never reads back.
JsonObject = dict[str, Any]


class _Record(BaseModel):
    """An open, strict, frozen record that dumps exactly the keys it was given."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {key: value for key, value in out.items() if key in self.model_fields_set}

    def record(self) -> dict[str, Any]:
        """The record as plain JSON values (the keys it was given)."""
        out: dict[str, Any] = self.model_dump(mode="json")
        return out

    @classmethod
    def from_record(cls: type[_R], record: Mapping[str, Any]) -> _R:
        """Validate a mapping through the JSON edge (paths and other objects become strings,
        tuples lists); raises ``pydantic.ValidationError`` (a ``ValueError``)."""
        return cls.model_validate_json(json.dumps(dict(record), sort_keys=True, default=str))


class LibraryRecord(_Record):
    """``provenance.server_binary.libraries[]``: one of llama.cpp's own shared libraries the
    binary's build loads from beside it."""

    #: Its path relative to the binary's folder, as the loader finds it (``libggml-base.so``).
    path: str
    sha256: str


class BinaryRecord(_Record):
    """``provenance.server_binary``: the launched server binary."""

    path: str | None = None
    sha256: str | None = None
    version: str | None = None
    version_rc: int | None = None
    #: Each llama.cpp library the build loads (``[]``: an ELF binary with none, llama.cpp
    #: linked into it); absent: not recorded (older certs, a binary that is no ELF file).
    libraries: tuple[LibraryRecord, ...] | None = None

    def library_sha256(self) -> dict[str, str] | None:
        """The sha256 of each recorded library by its path; ``None``: not recorded."""
        return None if self.libraries is None else {x.path: x.sha256 for x in self.libraries}


class ModelFileRecord(_Record):
    """``provenance.model_file``: the model file the servers were started on."""

    path: str | None = None
    name: str | None = None
    sha256: str | None = None
    size: int | None = None
    #: The GGUF header's facts, where one was read.
    gguf: JsonObject | None = None
    #: Why no GGUF header was read (an engine that loads a model folder, an attached server).
    gguf_skipped: str | None = None


class ServerInfo(_Record):
    """``provenance.servers[].info``: what the engine says about one server it started."""

    #: ``mock`` for the in-process mock server.
    kind: str | None = None
    #: The variables ggml and the runtimes read, as the server was started with them.
    engine_env: dict[str, str] | None = None


class ServerEntry(_Record):
    """``provenance.servers[]``: one server the cell started."""

    #: ``A`` (``--parallel 1``), ``BC`` (``--parallel N``) or ``cache`` (``--parallel N``
    #: with the prompt cache on: the prompt-cache arm).
    role: str | None = None
    label: str | None = None
    argv: tuple[str, ...] | None = None
    kv_label: str | None = None
    metrics_enabled: bool | None = None
    info: ServerInfo | None = None
    wall_s: JsonNumber | None = None


class PlanRecord(_Record):
    """``provenance.plan``: the cell's plan as run."""

    ctx: int | None = None
    parallel: int | None = None
    gate_passes: int | None = None
    n_predict: int | None = None
    seed: int | None = None
    endpoint: str | None = None
    n_probs: int | None = None
    serial_repeat: bool | None = None
    stop_on_red: bool | None = None
    req_timeout: JsonNumber | None = None
    n_items: int | None = None


class ScheduleRecord(_Record):
    """``provenance.schedule``: which arms ran and why, and whether passes were cut short."""

    arms_run: tuple[str, ...] | None = None
    passes_planned: int | None = None
    passes_run: int | None = None
    stopped_early: bool | None = None
    stop_reason: str | None = None
    stop_on_red: bool | None = None
    #: Why A' ran or did not.
    serial_repeat: str | None = None
    #: The ids arm B ran on when a RED cell limited it to its divergent ids.
    b_ids: tuple[str, ...] | None = None
    b_reason: str | None = None
    #: Where a sweep's cells share one reference (arm A), what says so.
    reference_shared: str | None = None


class ChatTemplateRecord(_Record):
    """``provenance.chat_template``: which template shaped the chat requests."""

    source: str | None = None
    warning: str | None = None


class ProfileRecord(_Record):
    """``provenance.profile``: the measurement profile a cell ran under."""

    name: str | None = None
    corner: str | None = None
    model_alias: str | None = None


class Provenance(_Record):
    """The whole ``provenance`` block of a cert."""

    tool_version: str | None = None
    #: ``run-live``, ``demo``, ``sweep``, ``run-mock``, ...
    driver: str | None = None
    #: The engine that served (absent in certs of llama-server-only versions).
    engine: str | None = None
    server_binary: BinaryRecord | None = None
    model_file: ModelFileRecord | None = None
    is_moe: bool | None = None
    servers: tuple[ServerEntry, ...] | None = None
    plan: PlanRecord | None = None
    schedule: ScheduleRecord | None = None
    chat_template: ChatTemplateRecord | None = None
    profile: ProfileRecord | None = None
    server_flags: tuple[str, ...] | None = None
    workset: JsonObject | None = None
    host: JsonObject | None = None
    #: The GPUs the servers were placed on (core/gpu_placement.py): ``{"source":
    #: "nvidia-smi", "devices": [...]}`` or ``{"unread": why}``; absent in older certs.
    gpus: JsonObject | None = None
    memory_guard: JsonObject | None = None
    #: The attached server (``run-live --base-url``).
    attach: JsonObject | None = None
    request_template: JsonObject | None = None
    scorer_id: str | None = None
    server_launches: int | None = None
    #: Per-arm records: the throughput block is derived from them.
    arms: tuple[JsonObject, ...] | None = None
    timing: JsonObject | None = None
    notes: tuple[str, ...] | None = None
    #: The mock's divergence knobs (a run-mock cert).
    mock_knobs: JsonObject | None = None

    @property
    def engine_name(self) -> str:
        """The engine that served; a cert that names none was written for llama-server."""
        return DEFAULT_ENGINE_NAME if self.engine is None else self.engine

    @property
    def records_mock_knobs(self) -> bool:
        return "mock_knobs" in self.model_fields_set

    @property
    def server_entries(self) -> tuple[ServerEntry, ...]:
        return self.servers or ()

    def bc_server(self) -> ServerEntry | None:
        """The B/C server (role ``BC``) the cell measured; ``None`` when none is recorded."""
        return next((s for s in self.server_entries if s.role == "BC"), None)

    def cache_server(self) -> ServerEntry | None:
        """The prompt-cache arm's server (role ``cache``); ``None`` when the cell did not
        measure the prompt cache."""
        return next((s for s in self.server_entries if s.role == "cache"), None)

    def merged_over(self, base: Provenance) -> Provenance:
        """This block and ``base`` (the caller's block and the run's own) as one. Each key
        has one writer: a key both write raises ``ValueError`` rather than one value
        silently replacing the other."""
        both = sorted(self.model_fields_set & base.model_fields_set)
        if both:
            raise ValueError(f"provenance keys written twice: {', '.join(both)}")
        return Provenance.from_record({**base.record(), **self.record()})
