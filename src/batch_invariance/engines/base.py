"""The engine layer: what differs between llama-server and its work-alikes, in one Protocol.

Every OpenAI-compatible engine differs from the others in the same few places: how it is
started with N concurrent sequences and a context C, which of its flags the tool must own or
refuse, what server-side evidence shows that requests ran at the same time (the busy witness
F1 needs), what shows that a prompt was served from cache, and how its version is recorded.
An :class:`Engine` answers exactly those questions; the request body (OpenAI chat/completions,
temperature 0, per-id seed) and the verdict core are the same for every engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from batch_invariance.engines.llama_server.options import canonical_spelling
from batch_invariance.engines.probes import BusyProbe, PassCounter

__all__ = [
    "CacheEvidence",
    "Engine",
    "KvLayout",
    "LaunchCommand",
    "LaunchRequest",
    "MemoryReservation",
    "PromptCache",
    "flag_conflicts",
    "passthrough_env",
]


#: How the KV cache of a server with several sequences is laid out. Split: every sequence owns
#: ``ctx`` tokens. Unified: one pool of ``ctx * parallel`` tokens that every sequence draws from.
KvLayout = Literal["split", "unified"]


@dataclass(frozen=True)
class PromptCache:
    """The prompt cache of the server the prompt-cache arm runs on: on, as a deploy runs it.
    ``cache_ram_mib`` is llama-server's ``--cache-ram`` under test (``None``: its default)."""

    cache_ram_mib: int | None = None


@dataclass(frozen=True)
class MemoryReservation:
    """How an engine that reserves a share of its memory node at start is sized (vLLM's CPU
    backend: ``--gpu-memory-utilization``); the memory guard sizes or checks the value."""

    #: The flag that carries the fraction.
    flag: str
    #: Resident bytes besides weights and KV (runtime, activations), as measured.
    runtime_bytes: int
    #: The user's own value (``--server-flag``): it wins, and is checked.
    given: float | None = None
    #: The dtype the flags ask for (the KV size is taken at the larger of it and the model's).
    dtype: str | None = None
    #: KV bytes set explicitly (then the engine ignores the fraction and reserves this).
    explicit_kv_bytes: int | None = None
    #: Where :attr:`explicit_kv_bytes` came from, for messages.
    explicit_kv_source: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """What the driver asks of a launch: ``parallel`` sequences of ``ctx`` tokens each, with
    the KV cache laid out as ``kv_layout`` (one of the engine's :attr:`Engine.kv_layouts`)."""

    server_bin: Path
    model: Path
    parallel: int
    ctx: int
    host: str
    port: int
    extra_flags: tuple[str, ...] = ()
    #: The environment the numerics switches are read from (never the process's own here).
    env: Mapping[str, str] = field(default_factory=dict)
    kv_layout: KvLayout = "split"
    #: Set only for the prompt-cache arm's server: the cache on, as the deploy runs it.
    #: ``None``: every request computed from scratch (the engine turns its cache off).
    prompt_cache: PromptCache | None = None
    #: The sized share of the memory node (:class:`MemoryReservation`); ``None``: the engine
    #: reserves none, or the user's own flag carries it.
    memory_fraction: float | None = None


@dataclass(frozen=True)
class LaunchCommand:
    """How to start one server: argv, environment additions, and the path that says ready."""

    argv: tuple[str, ...]
    #: Variables added to the inherited environment (recorded in the cert).
    env: Mapping[str, str] = field(default_factory=dict)
    #: GET this path until it answers 200.
    ready_path: str = "/health"


@dataclass(frozen=True)
class CacheEvidence:
    """What the server's metrics say about prompts served from cache (``None``: no evidence)."""

    counters: Mapping[str, float]
    #: ``True`` when a counter shows a cache hit, ``False`` when it shows none, ``None`` when
    #: the engine exposes no such counter.
    hits_seen: bool | None

    def to_record(self) -> dict[str, Any]:
        return {"counters": dict(self.counters), "hits_seen": self.hits_seen}


class Engine(Protocol):
    """One engine's answers to the questions the run path asks."""

    @property
    def name(self) -> str:
        """The ``--engine`` name."""

    @property
    def owned_flags(self) -> frozenset[str]:
        """Flags the tool sets itself (a user flag may not override them)."""

    @property
    def refused_flags(self) -> frozenset[str]:
        """Flags that would change what is measured (prompt caching, batching off, ...)."""

    @property
    def cobatches(self) -> bool:
        """Whether the engine can run several sequences at once at all."""

    @property
    def loads_gguf(self) -> bool:
        """Whether ``--model`` is one GGUF file (its header is read and the memory guard
        applies); ``False`` for engines that load a Hugging Face model folder."""

    @property
    def kv_layouts(self) -> frozenset[KvLayout]:
        """The KV layouts it can be launched with (``--kv-layout``)."""

    @property
    def reports_slots(self) -> bool:
        """Whether ``/props`` reports ``total_slots`` (a ready server must report the
        ``parallel`` it was started with)."""

    @property
    def ctx_multiple(self) -> int:
        """The per-slot context it rounds up to a multiple of (1: taken as given). A ``--ctx``
        it would round is refused, so the cert's ``ctx`` is the context that ran."""

    @property
    def takes_profiles(self) -> bool:
        """Whether a ``--profile`` (flags, binary and model of a calibrated setup) applies."""

    @property
    def binary_hint(self) -> str:
        """What ``--server-bin`` names for it, for usage errors."""

    @property
    def cache_off_advice(self) -> str:
        """The switches that turn its prompt cache off in a deploy, as a verdict's reason
        words the fix (e.g. llama-server's ``--no-cache-prompt --cache-ram 0``)."""

    def resolve_binary(self, server_bin: Path) -> Path:
        """The absolute path the launch runs and the cert records."""

    def kv_label(self, ctx: int, parallel: int, layout: KvLayout) -> str:
        """How its KV cache is sized, as the cert's ``kv_label`` says it."""

    def guard_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        """The flags the memory projection reads (KV cache types, GPU offload): empty where
        its flags are not llama.cpp's and the projection assumes the defaults."""

    def unknown_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        """Flags it would refuse to start with, each with the reason (empty: none known)."""

    def memory_reservation(
        self, flags: Sequence[str], env: Mapping[str, str]
    ) -> MemoryReservation | None:
        """How it reserves memory at start, read from the user's flags and environment
        (:class:`~batch_invariance.errors.UsageError` on a malformed value); ``None`` where it
        reserves nothing up front."""

    def prompt_cache_bytes(self, cache: PromptCache) -> int | None:
        """Host memory its prompt cache may hold on the prompt-cache arm's server, beyond the
        KV cache (0: none); ``None``: no limit."""

    def launch_command(self, request: LaunchRequest) -> LaunchCommand:
        """The command that starts it as ``request`` asks (the one argv builder: the launch
        and the dry run both read it)."""

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        """Its server-side busy witnesses (empty: it offers none, and F1 fails closed)."""

    def pass_counters(
        self, base_url: str, metrics_url: str | None = None
    ) -> tuple[PassCounter, ...]:
        """Counters whose change over each C pass corroborates the busy witness (recorded,
        never read by F1); empty when it has none."""

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        """Its prompt-cache counters read from a ``/metrics`` body."""

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        """JSON-ready facts for the cert: engine name, numerics switches, what it cannot do."""


def flag_conflicts(engine: Engine, extra_flags: Sequence[str]) -> tuple[str, ...]:
    """User flags that the engine's launcher owns or refuses, each with the reason; where
    none does, the flags the engine itself would refuse to start with."""
    out: list[str] = []
    for flag in extra_flags:
        # llama-server and vLLM both read ``--x_y`` as ``--x-y``.
        name = canonical_spelling(flag.partition("=")[0])
        if name in engine.owned_flags:
            out.append(f"{flag}: set by the tool for engine {engine.name}")
        elif name in engine.refused_flags:
            out.append(f"{flag}: changes what is measured on engine {engine.name}")
    return tuple(out) or engine.unknown_flags(extra_flags)


def passthrough_env(names: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The numerics switches among ``names`` that are set in ``env`` (passed on and recorded)."""
    return {name: env[name] for name in names if name in env}
