"""llama.cpp's ``llama-server`` as an :class:`~batch_invariance.engines.base.Engine`.

Its argv (:func:`build_argv`: every slot gets ``ctx`` tokens, a split or unified KV cache,
``--slots``, ``--cache-ram 0``, ``--metrics``), its KV label, its witnesses (``/slots`` and the
``llamacpp:requests_processing`` gauge) and its cache evidence (per-response
``timings.cache_n``, which the transport reads). The process that runs the argv is
:mod:`batch_invariance.servers.process`, the same for every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from batch_invariance.engines.base import (
    BuildLibraries,
    Engine,
    KvLayout,
    LaunchCommand,
    LaunchRequest,
    PromptCache,
)
from batch_invariance.engines.llama_server import flags as llama_flags
from batch_invariance.engines.llama_server.chat_template import LLAMA_CPP_CHATML_FALLBACK
from batch_invariance.engines.llama_server.env import LLAMA_CPP_ENV
from batch_invariance.engines.llama_server.flags import FlagError, ServerFlags, read_flags
from batch_invariance.engines.llama_server.linked import linked_runtimes, own_libraries
from batch_invariance.engines.llama_server.options import DEFAULTS
from batch_invariance.engines.llama_server.probes import llama_server_probes, server_chat_template
from batch_invariance.engines.probes import BusyProbe
from batch_invariance.engines.recorded import RecordedLaunch
from batch_invariance.engines.search_space import DEFAULT_CONFIG, SearchConfig
from batch_invariance.engines.variables import Linked

__all__ = ["LlamaServerEngine", "build_argv", "kv_label"]


def kv_label(ctx: int, parallel: int, layout: KvLayout = "split") -> str:
    """How the KV cache is sized. Split: every slot owns ``ctx`` tokens. Unified: one pool
    of ``ctx * parallel`` tokens that every slot draws from."""
    if layout == "unified":
        return f"unified:-c {ctx * parallel} -np {parallel} -kvu (one pool, ctx {ctx} per slot)"
    return f"split:-c {ctx * parallel} -np {parallel} (ctx {ctx} per slot, no-kv-unified)"


def build_argv(
    server_bin: Path,
    model: Path,
    *,
    host: str,
    port: int,
    parallel: int,
    ctx: int,
    extra_flags: Sequence[str] = (),
    kv_layout: KvLayout = "split",
    prompt_cache: PromptCache | None = None,
) -> tuple[str, ...]:
    """The server command line: ``-c ctx*parallel`` and ``-np parallel`` with a split KV cache
    (every slot gets ``ctx``) or, with ``kv_layout="unified"``, one pool of that size.

    ``--cache-ram 0`` unless ``prompt_cache`` is given (the prompt-cache arm's server): then
    the server's own default ``--cache-ram``, or the value under test."""
    if prompt_cache is None:
        # Owned: no host-side prompt cache, so every request is computed from scratch and the
        # memory projection stays honest. A deploy must run --cache-ram 0 to be covered.
        cache_ram: tuple[str, ...] = ("--cache-ram", "0")
    elif prompt_cache.cache_ram_mib is None:
        cache_ram = ()  # as a deploy with no --cache-ram runs it
    else:
        cache_ram = ("--cache-ram", str(prompt_cache.cache_ram_mib))
    argv = [
        str(server_bin),
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(ctx * parallel),
        "--kv-unified" if kv_layout == "unified" else "--no-kv-unified",
        "--slots",
        *cache_ram,
        "--no-webui",
        "--metrics",
    ]
    argv.extend(extra_flags)
    return tuple(argv)


#: What ``search`` walks on llama-server: the options that change which CPU attention and
#: matmul paths a ubatch takes (docs/search.md says why each): the micro-batch (``-ub 1``
#: puts one token per ubatch, so no two sequences share one), flash attention on and off, the
#: K/V cache types (a quantized V cache needs flash attention), one unified KV pool against a
#: pool per slot, and the thread count (how ggml splits each matmul). The defaults first.
LLAMA_SERVER_SPACE: tuple[SearchConfig, ...] = (
    DEFAULT_CONFIG,
    SearchConfig("ub1", ("-ub", "1")),
    SearchConfig("fa-on", ("-fa", "on")),
    SearchConfig("fa-off", ("-fa", "off")),
    SearchConfig("kv-f32", ("-ctk", "f32", "-ctv", "f32")),
    SearchConfig("kv-q8", ("-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")),
    SearchConfig("unified", (), kv_layout="unified"),
    SearchConfig("t1", ("-t", "1")),
    SearchConfig("ub1-fa-on", ("-ub", "1", "-fa", "on")),
    SearchConfig("ub1-fa-off", ("-ub", "1", "-fa", "off")),
    SearchConfig("ub1-t1", ("-ub", "1", "-t", "1")),
    SearchConfig("ub1-unified", ("-ub", "1"), kv_layout="unified"),
    SearchConfig("ub1-kv-q8", ("-ub", "1", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0")),
)


class LlamaServerEngine(Engine):
    """``llama-server --parallel N --ctx-size C*N --no-kv-unified --slots --metrics ...``."""

    name = "llama-server"
    cobatches = True
    #: Its ``--model`` is one GGUF file (header read, memory guard applied).
    loads_gguf = True
    kv_layouts: frozenset[KvLayout] = frozenset({"split", "unified"})
    #: ``/props`` reports ``total_slots`` and ``/slots`` shows which are busy.
    reports_slots = True
    #: llama-context pads the KV pool, and a split cache's per-slot share, to 256 tokens.
    ctx_multiple = llama_flags.CTX_PAD
    takes_profiles = True
    #: What turns its prompt cache off in a deploy (a verdict's reason words the fix).
    cache_off_advice = "--no-cache-prompt --cache-ram 0"
    #: The one llama-server flag reader's lists (engines.llama_server.flags).
    owned_flags: frozenset[str] = llama_flags.OWNED_FLAGS
    refused_flags: frozenset[str] = llama_flags.REFUSED_FLAGS
    #: The variables ggml, its runtimes and llama.cpp read; its config file.
    env_rules = LLAMA_CPP_ENV
    fallback_chat_template = LLAMA_CPP_CHATML_FALLBACK
    search_space = LLAMA_SERVER_SPACE
    #: llama_kv_cache::get_n_kv pads the view attention reads to 256 cells (docs/search.md).
    kv_view_pad = 256

    @property
    def binary_hint(self) -> str:
        return "path to llama-server"

    def resolve_binary(self, server_bin: Path) -> Path:
        # The cert names the file that ran, not a symlink to it.
        return server_bin.resolve()

    def linked_runtimes(self, argv: Sequence[str]) -> Linked:
        """Read from the binary and llama.cpp's libraries beside it
        (:func:`~batch_invariance.engines.llama_server.linked.linked_runtimes`)."""
        return linked_runtimes(Path(argv[0])) if argv else None

    def build_libraries(self, binary: Path, sha256: Callable[[Path], str]) -> BuildLibraries | None:
        """llama.cpp's own libraries beside it
        (:func:`~batch_invariance.engines.llama_server.linked.own_libraries`)."""
        return own_libraries(binary, sha256)

    def kv_label(self, ctx: int, parallel: int, layout: KvLayout) -> str:
        return kv_label(ctx, parallel, layout)

    def guard_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        return tuple(flags)

    def unknown_flags(self, flags: Sequence[str]) -> tuple[str, ...]:
        """Words the server would refuse to start with (read by the one flag reader)."""
        try:
            rejected = read_flags(flags, first_is_binary=False).rejected
        except FlagError as exc:
            return (f"{' '.join(flags)}: {exc}",)
        return tuple(f"{w}: llama-server has no such option (write --name value)" for w in rejected)

    def prompt_cache_bytes(self, cache: PromptCache) -> int | None:
        """``--cache-ram`` MiB (its default where the arm leaves it out); -1 is no limit."""
        mib = cache.cache_ram_mib
        if mib is None:
            mib = int(DEFAULTS["--cache-ram"])
        return None if mib < 0 else mib * 1024**2

    def launch_command(self, r: LaunchRequest) -> LaunchCommand:
        argv = build_argv(
            r.server_bin, r.model, host=r.host, port=r.port, parallel=r.parallel, ctx=r.ctx,
            extra_flags=r.extra_flags, kv_layout=r.kv_layout, prompt_cache=r.prompt_cache,
        )  # fmt: skip
        return LaunchCommand(argv, {}, "/health")

    def busy_probes(self, base_url: str, metrics_url: str | None = None) -> tuple[BusyProbe, ...]:
        return llama_server_probes(base_url, metrics_enabled=True, metrics_url=metrics_url)

    # No pass counters, no /metrics cache evidence: per-response timings.cache_n is the
    # evidence here (the prompt_cache gate reads it).

    def provenance(self, command: LaunchCommand) -> dict[str, Any]:
        return {"engine": self.name, "busy_witness": "/slots + llamacpp:requests_processing"}

    def chat_template(self, base_url: str) -> str | None:
        return server_chat_template(base_url)

    def kv_cache_types(self, flags: Sequence[str]) -> tuple[str, str]:
        return read_flags(flags).cache_types

    def offloads_to_gpu(self, flags: Sequence[str]) -> bool:
        return read_flags(flags).gpu_offload

    def gpu_offload_share(self, flags: Sequence[str], block_count: int) -> tuple[float, bool]:
        """``-ngl N`` puts N of ``block_count`` layers on the GPU (``all``, ``auto`` or N past
        the count: all of them); ``-nkvo`` keeps the KV cache in host memory."""
        read = read_flags(flags)
        if not read.gpu_offload:
            return 0.0, False
        raw = read.values.get("--gpu-layers", "all")
        kv_on_gpu = read.values.get("--kv-offload", "on") != "off"
        layers = int(raw) if raw.lstrip("-").isdigit() else block_count
        if layers < 0 or layers >= block_count or block_count <= 0:
            return 1.0, kv_on_gpu
        return layers / block_count, kv_on_gpu

    def recorded_launch(self, argv: Sequence[str]) -> RecordedLaunch:
        """The recorded argv through the one flag reader; an argv it cannot read reads as
        no flags at all (every identity check then fails, as it should)."""
        flags = _recorded_flags(argv)
        per_slot = (
            flags.ctx_size // flags.parallel
            if flags.ctx_size is not None
            and flags.parallel
            and flags.ctx_size % flags.parallel == 0
            else None
        )
        return RecordedLaunch(
            flags.model,
            flags.parallel,
            per_slot,
            None if flags.kv_unified is None else ("unified" if flags.kv_unified else "split"),
            checks_layout=True,
            ctx_said=f"--ctx-size {flags.ctx_size}",
        )


def _recorded_flags(argv: Sequence[str]) -> ServerFlags:
    try:
        return read_flags(argv)
    except FlagError:
        return read_flags(())
