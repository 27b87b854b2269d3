"""Launching a work-alike engine (llama-cpp-python, vLLM, SGLang) for the driver.

:class:`EngineLauncher` implements ``run.cell.ServerLauncher`` for any
:class:`~batch_invariance.engines.base.Engine` other than llama-server (whose own
``LiveLauncher`` adds the GGUF memory guard). The process is the same supervised child as
llama-server's (own process group, log file, deadline, teardown of that group only); the engine
supplies its command, ready path and busy witnesses. The handle records the engine's
provenance and, at the end, its cache counters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import requests

from batch_invariance.engines import ports
from batch_invariance.engines.base import Engine, LaunchCommand, LaunchRequest
from batch_invariance.engines.llama_server import LlamaServer
from batch_invariance.run.dispatch import BusyProbe
from batch_invariance.run.probe import get_text


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
    ) -> None:
        self.engine = engine
        self.server_bin = server_bin
        self.model = model
        self.log_dir = log_dir
        self.port_policy = port_policy
        self.server_flags = tuple(server_flags)
        self.env = dict(env)
        self.ready_timeout = ready_timeout
        self.commands: list[LaunchCommand] = []

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"live"``: this launcher spawns the engine's server process itself."""
        return "live"

    @contextlib.contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[EngineHandle]:
        port = ports.choose(self.port_policy)
        command = self.engine.launch_command(
            LaunchRequest(self.server_bin, self.model, parallel, ctx, ports.LOOPBACK, port,
                          self.server_flags, self.env)
        )  # fmt: skip
        self.commands.append(command)
        server = LlamaServer(
            self.server_bin, self.model, arm=arm, parallel=parallel, ctx=ctx, port=port,
            log_dir=self.log_dir, ready_timeout=self.ready_timeout, command=command,
        )  # fmt: skip
        with server:
            yield EngineHandle(server, self.engine, command, parallel, ctx)
