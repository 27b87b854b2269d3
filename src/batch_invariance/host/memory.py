"""The memory guard: project a server's footprint and refuse launches that would not fit.

The projection is weights (the GGUF file size) plus the KV cache (from the GGUF header, for
``ctx x N`` tokens at the cache type the server flags choose) plus a fixed allowance for compute
buffers, plus, on the prompt-cache arm's server, the host-memory prompt cache it may fill
(llama-server's ``--cache-ram``). It is deliberately conservative (sliding-window layers are
sized for the full context). Available memory is re-read from ``/proc/meminfo`` before every
launch, and free VRAM from ``nvidia-smi`` when that tool exists. While arms run,
:class:`RssWatch` samples the server's resident set and trips once it passes the cap."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from batch_invariance.core.memory_fraction import FractionDecision
from batch_invariance.engines.registry import default_engine
from batch_invariance.errors import GuardRefused
from batch_invariance.host.gguf import GgufInfo
from batch_invariance.host.node_memory import NodeMemory, read_node_memory

__all__ = [
    "GIB",
    "OVERHEAD_BYTES",
    "GuardDecision",
    "HostMemory",
    "LaunchGuard",
    "Projection",
    "RssWatch",
    "cache_types",
    "check",
    "evaluate",
    "gpu_offload_share",
    "group_rss",
    "launch_guard",
    "offloads_to_gpu",
    "project",
    "query_nvidia_smi",
    "read_host_memory",
    "read_meminfo",
    "read_vram_free",
]


GIB = 1024**3

#: Compute buffers, output logits and server bookkeeping beyond weights + KV (measured on
#: the embedded default: ~80 MiB; kept generous so the projection errs high).
OVERHEAD_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class Projection:
    """Projected bytes for one server (``parallel`` slots of ``ctx`` tokens each)."""

    parallel: int
    ctx: int
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    cache_type_k: str
    cache_type_v: str
    #: Host memory the server's prompt cache may fill (the prompt-cache arm's server).
    cache_bytes: int = 0
    #: Its prompt cache has no limit (``--cache-ram -1``): not in the total; the RSS watch
    #: is what bounds it.
    cache_unbounded: bool = False
    #: The part that goes onto the GPU when the flags offload layers (``-ngl``): the
    #: offloaded layers' share of the weights and (unless ``-nkvo``) of the KV cache, plus
    #: the compute allowance; 0 when nothing is offloaded.
    vram_bytes: int = 0
    #: Offloaded layers over all layers (1.0: ``-ngl 99``/``all``; 0.0: the CPU).
    gpu_layer_share: float = 0.0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes + self.cache_bytes

    def breakdown(self) -> str:
        """``weights W + KV K + overhead O`` (and the prompt cache where there is one), GiB."""
        parts = [("weights", self.weights_bytes), ("KV", self.kv_bytes),
                 ("overhead", self.overhead_bytes), ("prompt cache", self.cache_bytes)]  # fmt: skip
        text = " + ".join(f"{k} {v / GIB:.2f}" for k, v in parts if v or k != "prompt cache")
        return text + (" + prompt cache unbounded" if self.cache_unbounded else "")

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


@dataclass(frozen=True)
class HostMemory:
    """What the host has free right now."""

    mem_available_bytes: int | None
    mem_total_bytes: int | None
    #: Sum of free VRAM over visible GPUs, when ``nvidia-smi`` answered.
    vram_free_bytes: int | None
    #: The memory node an engine that reserves memory up front reserves from (vLLM's view).
    node: NodeMemory | None = None


def cache_types(server_flags: Sequence[str]) -> tuple[str, str]:
    """KV cache types chosen by server flags (llama.cpp's ``-ctk``/``-ctv``, as the default
    engine reads them: every engine's :meth:`~batch_invariance.engines.base.Engine.guard_flags`
    are llama.cpp's flags or none)."""
    return default_engine().kv_cache_types(server_flags)


def gpu_offload_share(server_flags: Sequence[str], block_count: int) -> tuple[float, bool]:
    """(offloaded layers / all layers, whether the KV cache follows them onto the GPU) for
    llama-server flags (pure): ``-ngl N`` puts N of ``block_count`` layers there (``all``,
    ``auto`` or N past the count: all of them); ``-nkvo`` keeps the KV cache in host memory."""
    return default_engine().gpu_offload_share(server_flags, block_count)


def project(
    info: GgufInfo,
    ctx: int,
    parallel: int,
    server_flags: Sequence[str] = (),
    cache_bytes: int | None = 0,
) -> Projection:
    """Projected footprint of a server with ``parallel`` slots, each given ``ctx`` tokens,
    and a host-memory prompt cache of ``cache_bytes`` (``None``: no limit)."""
    k, v = cache_types(server_flags)
    kv = int(info.kv_bytes_per_token(k, v) * ctx * parallel)
    share, kv_on_gpu = gpu_offload_share(server_flags, info.block_count)
    vram = 0
    if share > 0:
        vram = int(info.file_size * share) + (int(kv * share) if kv_on_gpu else 0)
        vram += OVERHEAD_BYTES
    return Projection(
        parallel=parallel,
        ctx=ctx,
        weights_bytes=info.file_size,
        kv_bytes=kv,
        overhead_bytes=OVERHEAD_BYTES,
        cache_type_k=k,
        cache_type_v=v,
        cache_bytes=cache_bytes or 0,
        cache_unbounded=cache_bytes is None,
        vram_bytes=vram,
        gpu_layer_share=share,
    )


def read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int | None, int | None]:
    """(MemAvailable, MemTotal) in bytes from ``/proc/meminfo``; ``None`` where unknown."""
    try:
        text = path.read_text()
    except OSError:
        return None, None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            values[key.strip()] = int(parts[0]) * scale
    return values.get("MemAvailable"), values.get("MemTotal")


def query_nvidia_smi(fields: Sequence[str], *, units: bool = True) -> list[list[str]] | None:
    """One row per GPU of ``nvidia-smi --query-gpu=FIELDS`` (CSV cells, stripped); ``None``
    when there is no working ``nvidia-smi`` (a CPU host, a broken driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fmt = "csv,noheader" if units else "csv,noheader,nounits"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(fields)}", f"--format={fmt}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in out.stdout.splitlines()]
    return [row for row in rows if len(row) == len(fields)]


def read_vram_free() -> int | None:
    """Free VRAM in bytes summed over GPUs, or ``None`` without a working ``nvidia-smi``."""
    rows = query_nvidia_smi(["memory.free"], units=False)
    free = [int(row[0]) for row in rows or [] if row[0].isdigit()]
    return sum(free) * 1024**2 if free else None


def read_host_memory() -> HostMemory:
    """Fresh numbers (called before every launch, never cached)."""
    avail, total = read_meminfo()
    return HostMemory(
        mem_available_bytes=avail,
        mem_total_bytes=total,
        vram_free_bytes=read_vram_free(),
        node=read_node_memory(),
    )


@dataclass(frozen=True)
class GuardDecision:
    """The guard's verdict on one projection; ``refusal`` is ``None`` when it may launch."""

    projection: Projection
    host: HostMemory
    cap_bytes: int | None
    refusal: str | None
    #: Whether the projection was held against free VRAM rather than host memory.
    gpu_offload: bool = False
    #: The share of its memory node the server reserves at start (vLLM), sized or checked.
    reservation: FractionDecision | None = None


def offloads_to_gpu(server_flags: Sequence[str]) -> bool:
    """True when the flags ask for layers on a GPU (``-ngl``/``--n-gpu-layers`` > 0 or all)."""
    return default_engine().offloads_to_gpu(server_flags)


def _vram_refusal(projection: Projection, host: HostMemory) -> str | None:
    """Why the projection's GPU part does not fit the free VRAM, naming the fixes (pure)."""
    free = host.vram_free_bytes
    need = projection.vram_bytes or projection.total_bytes
    if free is None or need <= free:
        return None
    kv_fix = ""
    if projection.cache_type_k in ("f16", "f32", "bf16"):
        kv_fix = " or a quantised KV cache (--server-flag=-ctk --server-flag=q8_0, same for -ctv)"
    share = projection.gpu_layer_share
    where = "all layers" if share in (0.0, 1.0) else f"{share:.0%} of the layers"
    return (
        f"memory guard: --parallel {projection.parallel} x ctx {projection.ctx} puts "
        f"{need / GIB:.2f} GiB on the GPU ({where}: {projection.breakdown()}) but only "
        f"{free / GIB:.2f} GiB VRAM is free (nvidia-smi); use fewer slots (--parallel), a "
        f"smaller --ctx{kv_fix}, fewer -ngl layers, or free the GPU"
    )


def evaluate(
    projection: Projection,
    host: HostMemory,
    cap_gb: float | None,
    gpu_offload: bool = False,
) -> GuardDecision:
    """Decide whether a projected server fits (pure; the caller supplies fresh numbers)."""
    cap = int(cap_gb * GIB) if cap_gb is not None else None
    need = projection.total_bytes
    refusal: str | None = None
    label = f"--parallel {projection.parallel} x ctx {projection.ctx}"
    # The prompt-cache arm's server: its --cache-ram is the other way down.
    lower = "lower --parallel/--ctx" + (" or --cache-ram" if projection.cache_bytes else "")
    if cap is not None and need > cap:
        refusal = (
            f"memory guard: {label} projects {need / GIB:.2f} GiB ({projection.breakdown()}) "
            f"over --max-footprint-gb {cap_gb:g}; {lower} or raise the cap"
        )
    elif gpu_offload and (vram := _vram_refusal(projection, host)) is not None:
        refusal = vram
    elif (
        not gpu_offload
        and host.mem_available_bytes is not None
        and (need > host.mem_available_bytes)
    ):
        refusal = (
            f"memory guard: {label} projects {need / GIB:.2f} GiB but only "
            f"{host.mem_available_bytes / GIB:.2f} GiB is available (/proc/meminfo); "
            f"free memory or {lower}"
        )
    return GuardDecision(
        projection=projection, host=host, cap_bytes=cap, refusal=refusal, gpu_offload=gpu_offload
    )


def check(
    projection: Projection, cap_gb: float | None, server_flags: Sequence[str] = ()
) -> GuardDecision:
    """Re-read host memory and raise :class:`GuardRefused` when the projection does not fit."""
    decision = evaluate(projection, read_host_memory(), cap_gb, offloads_to_gpu(server_flags))
    if decision.refusal is not None:
        raise GuardRefused(decision.refusal)
    return decision


@dataclass(frozen=True)
class LaunchGuard:
    """What the guard decided right before one launch: its projection and the RSS cap the
    server is then watched against (the explicit cap, else the memory available now)."""

    projected_bytes: int
    rss_cap_bytes: int | None


def launch_guard(decision: GuardDecision) -> LaunchGuard:
    """The guard right before a launch: :class:`GuardRefused` when ``decision`` (made on
    fresh host memory) refuses, else the projection and the RSS cap to watch."""
    if decision.refusal is not None:
        raise GuardRefused(decision.refusal)
    cap = decision.cap_bytes
    if cap is None and decision.host.mem_available_bytes is not None:
        cap = decision.host.mem_available_bytes
    return LaunchGuard(decision.projection.total_bytes, cap)


def group_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (0 once it is gone)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


class RssWatch:
    """Samples a server's RSS in a daemon thread; past ``cap_bytes`` it calls ``on_trip`` once.

    ``peak_bytes`` and ``tripped`` (a one-line reason) are readable at any time.
    """

    def __init__(
        self,
        pid: int,
        cap_bytes: int,
        on_trip: Callable[[str], None],
        interval_s: float = 0.25,
        sample: Callable[[int], int] = group_rss,
    ) -> None:
        self._pid = pid
        self._cap = cap_bytes
        self._on_trip = on_trip
        self._interval = interval_s
        self._sample = sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-watch-{pid}", daemon=True)
        self.peak_bytes = 0
        self.tripped: str | None = None

    def start(self) -> RssWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self._sample(self._pid)
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > self._cap:
                self.tripped = (
                    f"server RSS {rss / GIB:.2f} GiB passed the cap {self._cap / GIB:.2f} GiB; "
                    "the run was aborted (no cert); lower --parallel/--ctx or raise "
                    "--max-footprint-gb"
                )
                self._on_trip(self.tripped)
                return
            self._stop.wait(self._interval)
