"""The real ``llama-server`` process, as a context manager with deadlines.

:class:`LlamaServer` spawns one server in its own process group on loopback, logs to
``<log_dir>/server-<arm>-<port>.log``, waits for ``/health`` while watching the child (a dead
child is noticed within a second and reported with the log tail), and on exit terminates,
waits for and finally kills its own process group, and nothing else. A module-level registry
and an ``atexit`` hook make sure no server outlives the tool, whatever path it leaves by.

:class:`LiveLauncher` implements the driver's ``ServerLauncher``: before every launch it
re-reads host memory (the guard), re-checks the port, and sizes the server so every slot gets
``ctx`` tokens (``-c ctx*N`` with a split KV cache).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Literal

import requests

from batch_invariance.core.llama_flags import flag_conflicts
from batch_invariance.engines import memory, ports
from batch_invariance.engines.gguf import GgufInfo
from batch_invariance.errors import InfraError, Interrupted

_TAIL_LINES = 15

# Servers this process started and has not torn down yet (for atexit / signal paths).
_LIVE: set[LlamaServer] = set()
_LIVE_LOCK = threading.Lock()


def _cleanup_all() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for srv in servers:
        srv.stop()


atexit.register(_cleanup_all)


def owned_flag_conflicts(server_flags: Sequence[str]) -> list[str]:
    """User server flags the launcher owns (it sets them) or refuses (they change what is
    measured), as written; the one list is :mod:`batch_invariance.core.llama_flags`'s."""
    return list(flag_conflicts(server_flags))


KvLayout = Literal["split", "unified"]


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
    metrics: bool = True,
    extra_flags: Sequence[str] = (),
    kv_layout: KvLayout = "split",
) -> tuple[str, ...]:
    """The server command line: ``-c ctx*parallel`` and ``-np parallel`` with a split KV cache
    (every slot gets ``ctx``) or, with ``kv_layout="unified"``, one pool of that size."""
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
        # Owned: no host-side prompt cache, so every request is computed from scratch and the
        # memory projection stays honest. A deploy must run --cache-ram 0 to be covered.
        "--cache-ram",
        "0",
        "--no-webui",
    ]
    if metrics:
        argv.append("--metrics")
    argv.extend(extra_flags)
    return tuple(argv)


def server_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The environment a measured server gets: the tool's own without ``LLAMA_ARG_*``.

    llama-server reads those variables as flags; one left in the tool's environment would
    change what is measured without showing in the recorded argv (which check-deploy compares).
    """
    return {k: v for k, v in parent.items() if not k.startswith("LLAMA_ARG_")}


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, joined with `` | `` for a one-line error."""
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return "(no log)"
    text = data.decode("utf-8", errors="replace").strip().splitlines()
    tail = [ln.strip() for ln in text[-lines:] if ln.strip()]
    return " | ".join(tail) if tail else "(log is empty)"


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
    digest = hashlib.sha256()
    with server_bin.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
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
            sha256=digest.hexdigest(),
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
    return BinaryIdentity(
        path=str(server_bin), sha256=digest.hexdigest(), version=version, version_rc=rc
    )


class LlamaServer:
    """One ``llama-server`` process on loopback; use as ``with LlamaServer(...) as srv:``.

    Satisfies the driver's ``ServerHandle`` protocol. ``__enter__`` returns once ``/health``
    answers 200, or raises :class:`InfraError` (dead child: within about a second; otherwise
    after ``ready_timeout`` seconds) with the log tail. ``__exit__`` always tears the process
    group down.
    """

    def __init__(
        self,
        server_bin: Path,
        model: Path,
        *,
        arm: str,
        parallel: int,
        ctx: int,
        port: int,
        log_dir: Path,
        host: str = ports.LOOPBACK,
        extra_flags: Sequence[str] = (),
        metrics: bool = True,
        ready_timeout: float = 120.0,
        rss_cap_bytes: int | None = None,
        term_grace_s: float = 5.0,
        kv_layout: KvLayout = "split",
    ) -> None:
        self.arm = arm
        self.label = f"{arm}:np{parallel}"
        self.parallel = parallel
        self.ctx = ctx
        self.port = port
        self.host = host
        self.metrics_enabled = metrics
        self.kv_label = kv_label(ctx, parallel, kv_layout)
        self.argv = build_argv(
            server_bin,
            model,
            host=host,
            port=port,
            parallel=parallel,
            ctx=ctx,
            metrics=metrics,
            extra_flags=extra_flags,
            kv_layout=kv_layout,
        )
        self.base_url = f"http://{host}:{port}"
        self.log_path = log_dir / f"server-{arm}-{port}.log"
        self._log_dir = log_dir
        self._ready_timeout = ready_timeout
        self._rss_cap = rss_cap_bytes
        self._grace = term_grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._watch: memory.RssWatch | None = None
        self._stop_lock = threading.Lock()
        self.ready_s: float | None = None
        self.total_slots: int | None = None
        self.aborted: str | None = None
        self.exit_code: int | None = None
        self._prev_sigterm: Any = None

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> LlamaServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the server in a new process group (its own session) with output to the log."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._install_sigterm()
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=server_env(os.environ),
            )
        except OSError as exc:
            self._log.close()
            self._restore_sigterm()
            raise InfraError(
                f"cannot start {self.argv[0]}: {exc.strerror or exc}; check --server-bin"
            ) from None
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._started = time.monotonic()

    def wait_ready(self) -> None:
        """Poll ``/health`` until 200; a dead child or the deadline raise :class:`InfraError`."""
        assert self._proc is not None
        deadline = self._started + self._ready_timeout
        session = requests.Session()
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self.exit_code = code
                    raise InfraError(
                        f"llama-server ({self.label}, port {self.port}) exited with code {code} "
                        f"before it was ready; log {self.log_path}: {log_tail(self.log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise InfraError(
                        f"llama-server ({self.label}, port {self.port}) not ready after "
                        f"{self._ready_timeout:g} s (raise --ready-timeout?); log "
                        f"{self.log_path}: {log_tail(self.log_path)}"
                    )
                try:
                    resp = session.get(f"{self.base_url}/health", timeout=0.5)
                    if resp.status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            self.ready_s = time.monotonic() - self._started
            try:
                props = session.get(f"{self.base_url}/props", timeout=5).json()
                slots = props.get("total_slots") if isinstance(props, dict) else None
                self.total_slots = int(slots) if isinstance(slots, int) else None
            except (requests.RequestException, ValueError):
                self.total_slots = None
        finally:
            session.close()
        if self.total_slots is not None and self.total_slots != self.parallel:
            raise InfraError(
                f"llama-server ({self.label}) reports {self.total_slots} slots, expected "
                f"{self.parallel}; check --server-flag for conflicting options"
            )
        if self._rss_cap is not None:
            self._watch = memory.RssWatch(self._proc.pid, self._rss_cap, self._abort).start()

    def _abort(self, reason: str) -> None:
        self.aborted = reason
        self.stop()

    def check_alive(self) -> None:
        """Raise :class:`InfraError` with the log tail when the server died or was aborted."""
        if self.aborted is not None:
            raise InfraError(self.aborted)
        if self._proc is None:
            raise InfraError(f"llama-server ({self.label}) was never started")
        code = self._proc.poll()
        if code is not None:
            self.exit_code = code
            raise InfraError(
                f"llama-server ({self.label}, port {self.port}) died with code {code}; "
                f"log {self.log_path}: {log_tail(self.log_path)}"
            )

    def stop(self) -> None:
        """Terminate, wait for, then kill this server's own process group. Idempotent."""
        with self._stop_lock:
            if self._watch is not None:
                self._watch.stop()
            proc = self._proc
            if proc is not None and proc.returncode is None:
                self._signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=self._grace)
                except subprocess.TimeoutExpired:
                    self._signal_group(proc, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=self._grace)
                # Stragglers of our own group (the leader is reaped; the id stays ours while
                # any member lives).
                self._signal_group(proc, signal.SIGKILL)
                self.exit_code = proc.returncode
            if self._log is not None and not self._log.closed:
                self._log.close()
            with _LIVE_LOCK:
                _LIVE.discard(self)
            self._restore_sigterm()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        # start_new_session made the child a group leader: its pgid is its pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    # ---- SIGTERM safety outside the CLI ------------------------------------------------
    def _install_sigterm(self) -> None:
        """Make SIGTERM unwind (so ``__exit__`` runs) when nobody else handles it."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current in (signal.SIG_DFL, None):
            self._prev_sigterm = current
            signal.signal(signal.SIGTERM, _raise_interrupted)

    def _restore_sigterm(self) -> None:
        if self._prev_sigterm is None:
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._prev_sigterm)
        self._prev_sigterm = None

    # ---- provenance ---------------------------------------------------------------------
    def info(self) -> Mapping[str, Any]:
        """JSON-ready facts about this server for the cert."""
        return {
            "arm": self.arm,
            "label": self.label,
            "argv": list(self.argv),
            "port": self.port,
            "parallel": self.parallel,
            "ctx_per_slot": self.ctx,
            "kv_label": self.kv_label,
            "total_slots": self.total_slots,
            "ready_s": None if self.ready_s is None else round(self.ready_s, 3),
            "rss_peak_bytes": self._watch.peak_bytes if self._watch is not None else None,
            "log": str(self.log_path),
            "metrics_enabled": self.metrics_enabled,
        }


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@dataclass
class LaunchRecord:
    """One launch the :class:`LiveLauncher` made (for provenance and the benchmark)."""

    arm: str
    parallel: int
    ctx: int
    port: int
    argv: tuple[str, ...]
    projected_bytes: int
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
    def source(self) -> Literal["live", "mock"]:
        """Always ``"live"``: this launcher spawns the real server process itself."""
        return "live"

    def effective_parallel(self, parallel: int) -> int:
        return min(parallel, self.cap_parallel) if self.cap_parallel else parallel

    @contextlib.contextmanager
    def launch(self, arm: str, parallel: int, ctx: int) -> Iterator[LlamaServer]:
        """Guard memory, pick/re-check the port, start the server and yield it once ready."""
        slots = self.effective_parallel(parallel)
        proj = memory.project(self.gguf, ctx, slots, self.server_flags)
        decision = memory.check(proj, self.max_footprint_gb, self.server_flags)
        cap = decision.cap_bytes
        if cap is None and decision.host.mem_available_bytes is not None:
            cap = decision.host.mem_available_bytes
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
            rss_cap_bytes=cap,
            # The serial A server has one slot: its layout cannot matter; B/C get the asked one.
            kv_layout=self.kv_layout if slots > 1 else "split",
        )
        record = LaunchRecord(
            arm=arm,
            parallel=slots,
            ctx=ctx,
            port=port,
            argv=server.argv,
            projected_bytes=proj.total_bytes,
        )
        self.launches.append(record)
        t0 = time.monotonic()
        try:
            with server:
                record.ready_s = server.ready_s
                yield server
                # A server that died on its own is the driver's data (transport failures); one
                # we aborted for memory ends the run without a verdict.
                if server.aborted is not None:
                    raise InfraError(server.aborted)
        finally:
            record.alive_s = time.monotonic() - t0
            record.info = dict(server.info())
            record.rss_peak_bytes = record.info.get("rss_peak_bytes")
            if server.aborted is not None:
                self.aborted = server.aborted
