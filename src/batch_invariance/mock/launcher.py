"""The mock's launcher: :class:`MockLauncher` implements ``run.records.ServerLauncher`` over it.

``parallel=1`` for arm A, N for B/C; certs from it are ``source=mock``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

import requests

from batch_invariance.core.chat_template import ChatFallback
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.llama_server.chat_template import LLAMA_CPP_CHATML_FALLBACK
from batch_invariance.engines.llama_server.probes import llama_server_probes, server_chat_template
from batch_invariance.engines.probes import BusyProbe, PassCounter
from batch_invariance.errors import InfraError
from batch_invariance.mock.engine import MockServer
from batch_invariance.mock.knobs import MockKnobs


@dataclass(frozen=True)
class MockHandle:
    """A running mock server as the driver sees it (a ``run.records.ServerHandle``): the
    mock serves llama-server's ``/slots`` and ``/metrics``, so it offers llama-server's
    witnesses."""

    server: MockServer
    label: str
    argv: tuple[str, ...]
    metrics_enabled: bool
    kv_label: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        return llama_server_probes(self.base_url, self.metrics_enabled)

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        return ()

    def chat_template(self) -> str | None:
        return server_chat_template(self.base_url)

    @property
    def chat_fallback(self) -> ChatFallback:
        return ChatFallback("llama-server", LLAMA_CPP_CHATML_FALLBACK)  # the look-alike's

    def check_alive(self) -> None:
        self.server.check_alive()

    def info(self) -> Mapping[str, Any]:
        return {
            "kind": "mock",
            "label": self.label,
            "total_slots": self.server.parallel,
            "ctx": self.server.ctx,
            "knobs": asdict(self.server.knobs),
        }


def wait_ready(base_url: str, deadline_s: float, check_alive: Any = None) -> None:
    """Poll ``/health`` until 200; :class:`InfraError` when the deadline passes."""
    end = time.monotonic() + deadline_s
    with requests.Session() as session:
        while True:
            if check_alive is not None:
                check_alive()
            try:
                if session.get(base_url + "/health", timeout=1.0).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > end:
                raise InfraError(f"mock server at {base_url} not ready within {deadline_s:g}s")
            time.sleep(0.02)


class MockLauncher:
    """Launches :class:`MockServer`s for the driver: ``parallel=1`` for A, N for B/C."""

    def __init__(self, knobs: MockKnobs | None = None, ready_timeout_s: float = 30.0) -> None:
        self.knobs = knobs or MockKnobs()
        self.ready_timeout_s = ready_timeout_s
        self.launches = 0
        #: Every server this launcher started, in order (for tests to inspect afterwards).
        self.servers: list[MockServer] = []

    #: An in-process mock is never a live server.
    source: Literal["live", "mock"] = "mock"

    def kv_label_for(self, parallel: int, ctx: int) -> str:
        return f"mock:per-slot-kv:{parallel}x{ctx}"

    def argv_for(self, parallel: int, ctx: int, prompt_cache: bool = False) -> tuple[str, ...]:
        argv = ["mock-llama-server", "--host", "127.0.0.1", "--port", "0",
                "--parallel", str(parallel), "-c", str(ctx * parallel)]  # fmt: skip
        if prompt_cache:
            argv.append("--cache-prompt")
        if self.knobs.metrics:
            argv.append("--metrics")
        return tuple(argv)

    @contextmanager
    def launch(self, role: ServerRole, parallel: int, ctx: int) -> Iterator[MockHandle]:
        served = parallel
        if role != ServerRole.A and self.knobs.bc_parallel_override is not None:
            served = self.knobs.bc_parallel_override
        cache = role == ServerRole.CACHE
        server = MockServer(
            parallel=served, ctx=ctx, knobs=self.knobs, instance=self.launches,
            prompt_cache=cache,
        )  # fmt: skip
        self.launches += 1
        self.servers.append(server)
        with server:
            wait_ready(server.base_url, self.knobs.loading_delay_s + self.ready_timeout_s,
                       server.check_alive)  # fmt: skip
            yield MockHandle(
                server=server,
                label=f"mock-{role}",
                argv=self.argv_for(served, ctx, prompt_cache=cache),
                metrics_enabled=self.knobs.metrics,
                kv_label=self.kv_label_for(served, ctx),
            )
