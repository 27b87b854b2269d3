"""The one launcher: starts any :class:`~batch_invariance.engines.base.Engine`'s server for the
driver (``run.arms.ServerLauncher``).

Before every launch :class:`EngineLauncher` re-reads host memory (the guard, where the engine
loads a GGUF file or reserves a share of its memory node, sized here), picks or re-checks the
port, asks the engine for its command (:meth:`EngineLauncher.planned`, which the dry run prints
too) and runs it as a :class:`~batch_invariance.servers.process.ServerProcess`. The serial A
server has one sequence, so its KV layout cannot matter: it gets ``split``; B/C get the asked
one. The handle records the process's facts, the engine's provenance and, at the end, its cache
counters."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import requests

from batch_invariance.core.chat_template import ChatFallback
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.base import (
    Engine,
    KvLayout,
    LaunchCommand,
    LaunchRequest,
    MemoryReservation,
    PromptCache,
)
from batch_invariance.engines.probes import BusyProbe, PassCounter, get_text
from batch_invariance.errors import InfraError
from batch_invariance.host import memory
from batch_invariance.host.gguf import GgufInfo
from batch_invariance.host.hf_model import HfModelInfo
from batch_invariance.host.reservation import (
    evaluate_reservation,
    passed_fraction,
    project_reserved,
)
from batch_invariance.servers import ports
from batch_invariance.servers.process import ServerProcess

__all__ = ["EngineHandle", "EngineLauncher", "LaunchRecord", "PlannedServer", "recorded"]


@dataclass(frozen=True)
class PlannedServer:
    """The server a launch would start: its command and how its KV cache is sized."""

    parallel: int
    command: LaunchCommand
    kv_label: str


@dataclass
class LaunchRecord:
    """One launch a launcher made (for provenance and the benchmark)."""

    arm: str
    parallel: int
    ctx: int
    port: int
    argv: tuple[str, ...]
    #: The memory guard's projection (``None`` where the guard does not apply).
    projected_bytes: int | None
    #: The share of its memory node the server was given (vLLM), sized or the user's.
    memory_fraction: float | None = None
    ready_s: float | None = None
    alive_s: float | None = None
    rss_peak_bytes: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineHandle:
    """A running engine server as the driver sees it (``run.arms.ServerHandle``)."""

    process: ServerProcess
    engine: Engine
    planned: PlannedServer

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def label(self) -> str:
        return self.process.label

    @property
    def argv(self) -> tuple[str, ...]:
        return self.planned.command.argv

    @property
    def kv_label(self) -> str:
        return self.planned.kv_label

    @property
    def metrics_enabled(self) -> bool:
        return bool(self.busy_probes)

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        return self.engine.busy_probes(self.base_url)

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        return self.engine.pass_counters(self.base_url)

    def chat_template(self) -> str | None:
        return self.engine.chat_template(self.base_url)

    @property
    def chat_fallback(self) -> ChatFallback:
        return ChatFallback(self.engine.name, self.engine.fallback_chat_template)

    def check_alive(self) -> None:
        self.process.check_alive()

    def info(self) -> Mapping[str, Any]:
        with requests.Session() as session:
            metrics = get_text(session, self.base_url.rstrip("/") + "/metrics", timeout_s=2.0)
        command = self.planned.command
        return {
            **dict(self.process.info()),
            "kv_label": self.kv_label,
            "metrics_enabled": self.metrics_enabled,
            **self.engine.provenance(command),
            "env": dict(command.env),
            "cache_evidence": self.engine.cache_evidence(metrics).to_record(),
        }


class EngineLauncher:
    """Starts ``engine`` servers: ``parallel=1`` for arm A, N for B/C, on a loopback port.

    ``cap_parallel`` is a test hook: it launches every server with at most that many
    sequences while the driver still dispatches as planned (a server that cannot co-batch).
    """

    def __init__(
        self,
        engine: Engine,
        server_bin: Path,
        model: Path,
        log_dir: Path,
        *,
        port_policy: ports.PortPolicy,
        server_flags: Sequence[str] = (),
        env: Mapping[str, str] = {},
        ready_timeout: float = 120.0,
        gguf: GgufInfo | None = None,
        max_footprint_gb: float | None = None,
        cap_parallel: int | None = None,
        kv_layout: KvLayout = "split",
        prompt_cache: PromptCache | None = None,
        hf_model: HfModelInfo | None = None,
        reservation: MemoryReservation | None = None,
    ) -> None:
        self.engine = engine
        #: A model folder's sizes and how the engine reserves memory (both or neither).
        self.hf_model = hf_model
        self.reservation = reservation
        #: How the prompt-cache arm's server (``ServerRole.CACHE``) runs its cache.
        self.prompt_cache = prompt_cache or PromptCache()
        self.server_bin = server_bin
        self.model = model
        self.log_dir = log_dir
        self.port_policy = port_policy
        self.server_flags = tuple(server_flags)
        self.env = dict(env)
        self.ready_timeout = ready_timeout
        self.gguf = gguf
        self.max_footprint_gb = max_footprint_gb
        self.cap_parallel = cap_parallel
        self.kv_layout: KvLayout = kv_layout
        self.launches: list[LaunchRecord] = []
        #: Set when a server was aborted (RSS past the cap); the run must not write a cert.
        self.aborted: str | None = None

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"live"``: this launcher spawns the engine's server process itself."""
        return "live"

    def effective_parallel(self, parallel: int) -> int:
        return min(parallel, self.cap_parallel) if self.cap_parallel else parallel

    def guard_decision(
        self,
        parallel: int,
        ctx: int,
        host: memory.HostMemory,
        role: ServerRole = ServerRole.BC,
    ) -> memory.GuardDecision | None:
        """The memory guard on the server it would start (``None``: no model to project).

        One context for an engine that cannot co-batch; the projection reads the flags the
        engine says are llama.cpp's (KV cache types, GPU offload) and, on the prompt-cache
        arm's server (``ServerRole.CACHE``), counts the host memory its prompt cache may fill. An
        engine that reserves a share of its memory node gets that share sized (or the user's
        checked) here."""
        served = self.effective_parallel(parallel)
        slots = served if self.engine.cobatches else 1
        if self.reservation is not None and self.hf_model is not None:
            reserved = project_reserved(self.hf_model, ctx, slots, self.reservation)
            return evaluate_reservation(reserved, host, self.max_footprint_gb, self.reservation)
        if self.gguf is None:
            return None
        flags = self.engine.guard_flags(self.server_flags)
        cache = self.engine.prompt_cache_bytes(self.prompt_cache) if role == ServerRole.CACHE else 0
        projection = memory.project(self.gguf, ctx, slots, flags, cache)
        return memory.evaluate(
            projection, host, self.max_footprint_gb, memory.offloads_to_gpu(flags)
        )

    def planned(
        self,
        parallel: int,
        ctx: int,
        port: int,
        role: ServerRole = ServerRole.BC,
        decision: memory.GuardDecision | None = None,
    ) -> PlannedServer:
        """The command and KV label of the server :meth:`launch` starts for ``parallel``
        (``ServerRole.CACHE``: the prompt-cache arm's server, with the cache on), with the share
        of its memory node the guard's ``decision`` sized, where it sized one."""
        served = self.effective_parallel(parallel)
        layout: KvLayout = self.kv_layout if served > 1 else "split"
        cache = self.prompt_cache if role == ServerRole.CACHE else None
        request = LaunchRequest(
            self.server_bin, self.model, served, ctx, ports.LOOPBACK, port, self.server_flags,
            self.env, layout, cache, passed_fraction(decision),
        )  # fmt: skip
        command = self.engine.launch_command(request)
        return PlannedServer(served, command, self.engine.kv_label(ctx, served, layout))

    @contextlib.contextmanager
    def launch(self, role: ServerRole, parallel: int, ctx: int) -> Iterator[EngineHandle]:
        """Guard memory, pick/re-check the port, start the server and yield it once ready."""
        arm = str(role)  # the recorded string: log name, label, launch record
        decision = self.guard_decision(parallel, ctx, memory.read_host_memory(), role)
        guard = None if decision is None else memory.launch_guard(decision)
        port = ports.choose(self.port_policy)
        planned = self.planned(parallel, ctx, port, role, decision)
        process = ServerProcess(
            self.engine, planned.command, arm=arm, parallel=planned.parallel, ctx=ctx,
            port=port, log_dir=self.log_dir, ready_timeout=self.ready_timeout,
            rss_cap_bytes=None if guard is None else guard.rss_cap_bytes,
        )  # fmt: skip
        projected = None if guard is None else guard.projected_bytes
        reserved = None if decision is None else decision.reservation
        record = LaunchRecord(
            arm, planned.parallel, ctx, port, planned.command.argv, projected,
            None if reserved is None else reserved.fraction,
        )  # fmt: skip
        self.launches.append(record)
        with recorded(process, record):
            try:
                yield EngineHandle(process, self.engine, planned)
            finally:
                self.aborted = self.aborted or process.aborted


@contextlib.contextmanager
def recorded(server: ServerProcess, record: LaunchRecord) -> Iterator[ServerProcess]:
    """Run ``server`` and fill ``record`` (ready, alive, RSS peak, info), even on failure.

    A server that died or was aborted for memory ends the run without a verdict
    (:class:`InfraError`: the driver names the arm and pass it died in)."""
    t0 = time.monotonic()
    try:
        with server:
            record.ready_s = server.ready_s
            yield server
            if server.aborted is not None:
                raise InfraError(server.aborted)
    finally:
        record.alive_s = time.monotonic() - t0
        record.info = dict(server.info())
        record.rss_peak_bytes = record.info.get("rss_peak_bytes")
