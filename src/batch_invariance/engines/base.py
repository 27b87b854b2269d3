"""The engine layer: what differs between llama-server and its work-alikes, in one base class.

Every OpenAI-compatible engine differs from the others in the same few places: how it is
started with N concurrent sequences and a context C, which of its flags the tool must own or
refuse, what server-side evidence shows that requests ran at the same time (the busy witness
F1 needs), what shows that a prompt was served from cache, and how its version is recorded.
An :class:`Engine` answers exactly those questions; the request body (OpenAI chat/completions,
temperature 0, per-id seed) and the verdict core are the same for every engine.

:class:`Engine` is the only door to an engine: the neutral layers (the driver, the server
process, the memory guard, the cert's identity check) ask it, never one engine's package. An
adapter sets its :attr:`~Engine.name` and writes :meth:`~Engine.launch_command`; every other
member has a default (an engine that co-batches, offers no witness, no cache evidence, reads
no variable and has no chat template of its own) that it overrides where it differs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from batch_invariance.engines.probes import BusyProbe, PassCounter
from batch_invariance.engines.recorded import RecordedLaunch
from batch_invariance.engines.search_space import DEFAULT_SPACE, SearchConfig
from batch_invariance.engines.variables import EnvRules, Linked

__all__ = [
    "BuildLibraries",
    "CacheEvidence",
    "Engine",
    "KvLayout",
    "LaunchCommand",
    "LaunchRequest",
    "MemoryReservation",
    "PromptCache",
    "canonical_spelling",
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


@dataclass(frozen=True)
class BuildLibraries:
    """The shared libraries of an engine's own build that its server binary loads by path
    once it runs (llama.cpp's ``libllama``, ``libggml*`` and ggml's run-time backends,
    ``libmtmd``): not in the binary's bytes, so a cert records each by content."""

    #: (path relative to the binary's folder, sha256) of each, sorted; empty: none (the
    #: engine is linked into the binary).
    sha256: tuple[tuple[str, str], ...] = ()
    #: Why which libraries it loads cannot be told (``sha256`` then proves nothing).
    unread: str | None = None


def canonical_spelling(word: str) -> str:
    """A command-line word as llama-server and vLLM look it up: every ``_`` of a word that
    starts with ``--`` is ``-`` (``--ctx_size`` is ``--ctx-size``)."""
    return "--" + word[2:].replace("_", "-") if word.startswith("--") else word


class Engine(ABC):
    """One engine's answers to the questions the run path asks: :attr:`name` and
    :meth:`launch_command` are its own; every other member is a default it may override."""

    #: The ``--engine`` name.
    name: str
    #: Flags the tool sets itself (a user flag may not override them).
    owned_flags: frozenset[str] = frozenset()
    #: Flags that would change what is measured (prompt caching, batching off, ...).
    refused_flags: frozenset[str] = frozenset()
    #: Whether the engine can run several sequences at once at all.
    cobatches: bool = True
    #: Whether ``--model`` is one GGUF file (its header is read and the memory guard
    #: applies); ``False`` for engines that load a Hugging Face model folder.
    loads_gguf: bool = False
    #: The KV layouts it can be launched with (``--kv-layout``).
    kv_layouts: frozenset[KvLayout] = frozenset({"split"})
    #: Whether ``/props`` reports ``total_slots`` (a ready server must report the
    #: ``parallel`` it was started with).
    reports_slots: bool = False
    #: The per-slot context it rounds up to a multiple of (1: taken as given). A ``--ctx``
    #: it would round is refused, so the cert's ``ctx`` is the context that ran.
    ctx_multiple: int = 1
    #: Whether a ``--profile`` (flags, binary and model of a calibrated setup) applies.
    takes_profiles: bool = False
    #: The switches that turn its prompt cache off in a deploy, as a verdict's reason words
    #: the fix (llama-server's ``--no-cache-prompt --cache-ram 0``).
    cache_off_advice: str = "the prompt cache off"
    #: Which variables its server child gets and the cert records (default: none it reads).
    env_rules: EnvRules = EnvRules()
    #: The template it applies to chat requests when the model carries none, as its
    #: :meth:`chat_template` reports it ("": it has none the tool knows).
    fallback_chat_template: str = ""
    #: The argv words a recorded server's model, N and context are read from
    #: (:meth:`recorded_launch`); ``None``: a recorded argv of it is not read.
    argv_names: tuple[str, str | None, str] | None = None
    #: The output-changing options ``search`` walks, its defaults first (search_space.py).
    search_space: tuple[SearchConfig, ...] = DEFAULT_SPACE
    #: The KV view it pads attention to a multiple of (0: none known): sequences past it are
    #: where co-batched drift is known to start, so the search's probe crosses it.
    kv_view_pad: int = 0

    def __init__(self, *, env_rules: EnvRules | None = None) -> None:
        """``env_rules``: the variables its child gets, where the registry gives it others
        than the adapter's own."""
        if env_rules is not None:
            self.env_rules = env_rules

    @property
    def binary_hint(self) -> str:
        """What ``--server-bin`` names for it, for usage errors."""
        return f"{self.name} launcher"

    def resolve_binary(self, server_bin: Path) -> Path:
        """The absolute path the launch runs and the cert records."""
        return server_bin.absolute()

    def kv_label(self, ctx: int, parallel: int, layout: KvLayout) -> str:
        """How its KV cache is sized, as the cert's ``kv_label`` says it."""
        if not self.cobatches:
            return f"{self.name}:one-context:{ctx} (serves one request at a time)"
        return f"{self.name}:{parallel} seqs x {ctx} tokens"

    def guard_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        """The flags the memory projection reads (KV cache types, GPU offload): empty where
        its flags are not llama.cpp's and the projection assumes the defaults."""
        return ()

    def unknown_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        """Flags it would refuse to start with, each with the reason (empty: none known)."""
        return ()

    def memory_reservation(
        self, flags: Sequence[str], env: Mapping[str, str]
    ) -> MemoryReservation | None:
        """How it reserves memory at start, read from the user's flags and environment
        (:class:`~batch_invariance.errors.UsageError` on a malformed value); ``None`` where it
        reserves nothing up front."""
        return None

    def prompt_cache_bytes(self, cache: PromptCache) -> int | None:
        """Host memory its prompt cache may hold on the prompt-cache arm's server, beyond the
        KV cache (0: none, as where the cache lives in the KV cache); ``None``: no limit."""
        return 0

    @abstractmethod
    def launch_command(self, request: LaunchRequest) -> LaunchCommand:
        """The command that starts it as ``request`` asks (the one argv builder: the launch
        and the dry run both read it)."""

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        """Its server-side busy witnesses (empty: it offers none, and F1 fails closed)."""
        return ()

    def pass_counters(
        self, base_url: str, metrics_url: str | None = None
    ) -> tuple[PassCounter, ...]:
        """Counters whose change over each C pass corroborates the busy witness (recorded,
        never read by F1); empty when it has none."""
        return ()

    def cache_evidence(self, metrics_text: str | None) -> CacheEvidence:
        """Its prompt-cache counters read from a ``/metrics`` body (none by default)."""
        return CacheEvidence({}, None)

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        """JSON-ready facts for the cert: engine name, numerics switches, what it cannot do."""
        return {"engine": self.name}

    def chat_template(self, base_url: str) -> str | None:
        """The chat template its running server says it applies (``None``: it does not say)."""
        return None

    def linked_runtimes(self, argv: Sequence[str]) -> Linked:
        """The runtimes (:attr:`EnvRules.runtimes`) the build that ``argv`` starts links, read
        from its files; ``None`` (the default): not known, every runtime's variables count."""
        return None

    def build_libraries(self, binary: Path, sha256: Callable[[Path], str]) -> BuildLibraries | None:
        """The libraries of its own build that ``binary`` loads, each hashed by ``sha256``;
        ``None`` (the default): none this tool knows how to read."""
        return None

    def child_env(self, parent: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
        """The variables its server child gets from ``parent`` (before the launch's own
        additions): :meth:`~batch_invariance.engines.variables.EnvRules.measured_env`; a
        runtime's only where the build links it (``linked``: :meth:`linked_runtimes`)."""
        return self.env_rules.measured_env(parent, linked)

    def recorded_env(self, env: Mapping[str, str], linked: Linked = None) -> dict[str, str]:
        """The variables of a child's ``env`` the cert records (``engine_env``): the ones the
        build reads (``linked``: :meth:`linked_runtimes`)."""
        return self.env_rules.engine_env(env, linked)

    def kv_cache_types(self, flags: Sequence[str]) -> tuple[str, str]:
        """The K and V cache types ``flags`` (:meth:`guard_flags`) choose, as the memory
        projection reads them."""
        return ("f16", "f16")

    def offloads_to_gpu(self, flags: Sequence[str]) -> bool:
        """Whether ``flags`` (:meth:`guard_flags`) put layers on a GPU (the memory guard
        then holds the projection against free VRAM)."""
        return False

    def gpu_offload_share(self, flags: Sequence[str], block_count: int) -> tuple[float, bool]:
        """(offloaded layers / all ``block_count`` layers, whether the KV cache follows them
        onto the GPU) for ``flags`` (:meth:`guard_flags`): none by default."""
        return 0.0, False

    def recorded_launch(self, argv: Sequence[str]) -> RecordedLaunch | None:
        """What a recorded server argv says was started (the cert's identity check);
        ``None`` where this engine's argv is not read."""
        if self.argv_names is None:
            return None
        return RecordedLaunch.read(argv, *self.argv_names)


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
