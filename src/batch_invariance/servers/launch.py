"""Launching a work-alike engine (llama-cpp-python, vLLM, SGLang) for the driver.

:class:`EngineLauncher` implements ``run.cell.ServerLauncher`` for any
:class:`~batch_invariance.engines.base.Engine` other than llama-server (whose own
``LiveLauncher`` adds KV layout and slot sizing). The process is the same supervised child as
llama-server's (own process group, log file, deadline, teardown of that group only); the engine
supplies its command, ready path, busy witnesses and pass counters. Where the engine loads a
GGUF file (``gguf`` given) the memory guard runs before every launch, as for llama-server. The
handle records the engine's provenance and, at the end, its cache counters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import requests

from batch_invariance.engines.base import Engine, LaunchCommand, LaunchRequest
from batch_invariance.host import memory
from batch_invariance.host.gguf import GgufInfo
from batch_invariance.run.dispatch import BusyProbe, PassCounter
from batch_invariance.run.probe import get_text
from batch_invariance.servers import ports
from batch_invariance.servers.live_launcher import LaunchRecord, recorded
from batch_invariance.servers.llama_server import LlamaServer

__all__ = ["EngineHandle", "EngineLauncher"]


@dataclass
class EngineHandle:
    """A running engine server as the driver sees it (``run.cell.ServerHandle``)."""

    server: LlamaServer
    engine: Engine
    command: LaunchCommand
    parallel: int
    ctx: int

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def label(self) -> str:
        return f"{self.engine.name}:{self.server.label}"

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command.argv

    @property
    def metrics_enabled(self) -> bool:
        return bool(self.busy_probes)

    @property
    def kv_label(self) -> str:
        if not self.engine.cobatches:
            return f"{self.engine.name}:one-context:{self.ctx} (serves one request at a time)"
        return f"{self.engine.name}:{self.parallel} seqs x {self.ctx} tokens"

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        return self.engine.busy_probes(self.base_url)

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        return self.engine.pass_counters(self.base_url)

    def check_alive(self) -> None:
        self.server.check_alive()

    def info(self) -> Mapping[str, Any]:
        with requests.Session() as session:
            metrics = get_text(session, self.base_url.rstrip("/") + "/metrics", timeout_s=2.0)
        return {
            **dict(self.server.info()),
            **self.engine.provenance(self.command),
            "env": dict(self.command.env),
            "cache_evidence": self.engine.cache_evidence(metrics).to_record(),
        }


class EngineLauncher:
    """Starts ``engine`` servers: ``parallel=1`` for arm A, N for B/C, on a loopback port."""

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
        ready_timeout: float = 300.0,
        gguf: GgufInfo | None = None,
        max_footprint_gb: float | None = None,
    ) -> None:
        self.engine = engine
        self.server_bin = server_bin
        self.model = model
        self.log_dir = log_dir
        self.port_policy = port_policy
        self.server_flags = tuple(server_flags)
        self.env = dict(env)
        self.ready_timeout = ready_timeout
        self.gguf = gguf
        self.max_footprint_gb = max_footprint_gb
        self.launches: list[LaunchRecord] = []
        #: Set when a server was aborted (RSS past the cap); the run must not write a cert.
        self.aborted: str | None = None

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"live"``: this launcher spawns the engine's server process itself."""
        return "live"

    def guard_decision(
        self, parallel: int, ctx: int, host: memory.HostMemory
    ) -> memory.GuardDecision | None:
        """The memory guard on the server it would start (``None``: no GGUF file to project).

        One context for an engine that cannot co-batch; its own flags are not llama-server's,
        so the projection assumes the default KV cache types, in host memory."""
        if self.gguf is None:
            return None
        slots = parallel if self.engine.cobatches else 1
        return memory.evaluate(memory.project(self.gguf, ctx, slots), host, self.max_footprint_gb)

    @contextlib.contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[EngineHandle]:
        decision = self.guard_decision(parallel, ctx, memory.read_host_memory())
        guard = None if decision is None else memory.launch_guard(decision)
        port = ports.choose(self.port_policy)
        command = self.engine.launch_command(
            LaunchRequest(self.server_bin, self.model, parallel, ctx, ports.LOOPBACK, port,
                          self.server_flags, self.env)
        )  # fmt: skip
        server = LlamaServer(
            self.server_bin, self.model, arm=arm, parallel=parallel, ctx=ctx, port=port,
            log_dir=self.log_dir, ready_timeout=self.ready_timeout, command=command,
            rss_cap_bytes=None if guard is None else guard.rss_cap_bytes,
        )  # fmt: skip
        record = LaunchRecord(
            arm, parallel, ctx, port, command.argv, None if guard is None else guard.projected_bytes
        )
        self.launches.append(record)
        with recorded(server, record):
            try:
                yield EngineHandle(server, self.engine, command, parallel, ctx)
            finally:
                self.aborted = self.aborted or server.aborted
