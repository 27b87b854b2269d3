"""What run-live launches with: :class:`LiveLauncher` implements the driver's
``ServerLauncher`` for the real ``llama-server``: before every launch it re-reads host memory
(the guard), re-checks the port, and sizes the server so every slot gets ``ctx`` tokens
(``-c ctx*N`` with a split KV cache). :func:`identify_binary` says what binary ran.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from batch_invariance.errors import InfraError
from batch_invariance.host import memory
from batch_invariance.host.gguf import GgufInfo, sha256_file
from batch_invariance.servers import ports
from batch_invariance.servers.llama_server import KvLayout, LlamaServer

__all__ = ["BinaryIdentity", "LaunchRecord", "LiveLauncher", "identify_binary", "recorded"]


@dataclass(frozen=True)
class BinaryIdentity:
    """What the cert records about the server binary."""

    path: str
    sha256: str
    version: str
    version_rc: int | None


def identify_binary(server_bin: Path, timeout_s: float = 15.0) -> BinaryIdentity:
    """sha256 and ``--version`` of a server binary.

    A failing ``--version`` is recorded, not raised: the launch itself reports a broken binary
    with its log tail.
    """
    digest = sha256_file(server_bin)
    try:
        # Own process group: a --version that hangs is killed with everything it spawned,
        # and nothing outside that group is touched.
        proc = subprocess.Popen(
            [str(server_bin), "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return BinaryIdentity(
            path=str(server_bin),
            sha256=digest,
            version=f"(--version failed: {exc})",
            version_rc=None,
        )
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        version, rc = f"(--version did not finish within {timeout_s:g} s)", None
    else:
        text = (text or "").strip()
        lines = [
            ln.strip() for ln in text.splitlines() if ln.strip().startswith(("version", "built"))
        ]
        version = " ; ".join(lines) if lines else text[-300:]
        rc = proc.returncode
    return BinaryIdentity(path=str(server_bin), sha256=digest, version=version, version_rc=rc)


@dataclass
class LaunchRecord:
    """One launch the :class:`LiveLauncher` made (for provenance and the benchmark)."""

    arm: str
    parallel: int
    ctx: int
    port: int
    argv: tuple[str, ...]
    #: The memory guard's projection (``None`` where the guard does not apply).
    projected_bytes: int | None
    ready_s: float | None = None
    alive_s: float | None = None
    rss_peak_bytes: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


class LiveLauncher:
    """``ServerLauncher`` for the real server: guard, port check, then :class:`LlamaServer`.

    ``cap_parallel`` is a test hook: it launches every server with at most that many slots
    while the driver still dispatches as planned (a server that cannot co-batch).
    """

    def __init__(
        self,
        server_bin: Path,
        model: Path,
        gguf: GgufInfo,
        log_dir: Path,
        *,
        port_policy: ports.PortPolicy,
        server_flags: Sequence[str] = (),
        max_footprint_gb: float | None = None,
        ready_timeout: float = 120.0,
        metrics: bool = True,
        cap_parallel: int | None = None,
        kv_layout: KvLayout = "split",
    ) -> None:
        self.server_bin = server_bin
        self.model = model
        self.gguf = gguf
        self.log_dir = log_dir
        self.port_policy = port_policy
        self.server_flags = tuple(server_flags)
        self.max_footprint_gb = max_footprint_gb
        self.ready_timeout = ready_timeout
        self.metrics = metrics
        self.cap_parallel = cap_parallel
        self.kv_layout: KvLayout = kv_layout
        self.launches: list[LaunchRecord] = []
        #: Set when a server was aborted (RSS past the cap); the run must not write a cert.
        self.aborted: str | None = None

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """Always ``"live"``: this launcher spawns the real server process itself."""
        return "live"

    def effective_parallel(self, parallel: int) -> int:
        return min(parallel, self.cap_parallel) if self.cap_parallel else parallel

    def guard_decision(
        self, parallel: int, ctx: int, host: memory.HostMemory
    ) -> memory.GuardDecision:
        """The memory guard on the server this launcher would start for ``parallel``."""
        flags = self.server_flags
        proj = memory.project(self.gguf, ctx, self.effective_parallel(parallel), flags)
        return memory.evaluate(proj, host, self.max_footprint_gb, memory.offloads_to_gpu(flags))

    @contextlib.contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[LlamaServer]:
        """Guard memory, pick/re-check the port, start the server and yield it once ready."""
        slots = self.effective_parallel(parallel)
        guard = memory.launch_guard(self.guard_decision(parallel, ctx, memory.read_host_memory()))
        port = ports.choose(self.port_policy)
        server = LlamaServer(
            self.server_bin,
            self.model,
            arm=arm,
            parallel=slots,
            ctx=ctx,
            port=port,
            log_dir=self.log_dir,
            extra_flags=self.server_flags,
            metrics=self.metrics,
            ready_timeout=self.ready_timeout,
            rss_cap_bytes=guard.rss_cap_bytes,
            # The serial A server has one slot: its layout cannot matter; B/C get the asked one.
            kv_layout=self.kv_layout if slots > 1 else "split",
        )
        record = LaunchRecord(arm, slots, ctx, port, server.argv, guard.projected_bytes)
        self.launches.append(record)
        with recorded(server, record) as running:
            try:
                yield running
            finally:
                self.aborted = self.aborted or server.aborted


@contextlib.contextmanager
def recorded(server: LlamaServer, record: LaunchRecord) -> Iterator[LlamaServer]:
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
