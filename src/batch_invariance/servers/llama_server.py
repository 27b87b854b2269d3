"""The real ``llama-server`` process, as a context manager with deadlines.

:class:`LlamaServer` spawns one server in its own process group on loopback, logs to
``<log_dir>/server-<arm>-<port>.log``, waits for ``/health`` while watching the child (a dead
child is noticed within a second and reported with the log tail), and on exit terminates,
waits for and finally kills its own process group, and nothing else. A module-level registry
and an ``atexit`` hook make sure no server outlives the tool, whatever path it leaves by; a
parent-death signal covers the one path that runs no Python code (``kill -9`` of the tool).

The launcher that guards memory and picks ports is in
:mod:`batch_invariance.servers.live_launcher`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import requests

from batch_invariance.core.server_env import SYSTEM_CONFIG, engine_env, measured_env
from batch_invariance.engines.base import LaunchCommand
from batch_invariance.errors import InfraError
from batch_invariance.host import memory
from batch_invariance.interrupts import install_sigterm, restore_sigterm
from batch_invariance.servers import ports

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


#: ``prctl(PR_SET_PDEATHSIG, ...)`` (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    """libc's ``prctl`` on Linux, resolved once in the parent (the child may not import)."""
    if sys.platform != "linux":  # pragma: no cover - the tool targets Linux hosts
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


_PRCTL = _load_prctl()


def die_with_parent_hook(parent_pid: int) -> Any:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the tool dies.

    The atexit hook and the context managers cover every exit that runs Python code; this
    covers the one that does not (``kill -9`` of the tool, an OOM kill). The kernel sends the
    signal when the *thread* that forked the child ends: servers are started and stopped by
    the same ``with`` block, so the forking thread always outlives the server it started.
    The hook does only a libc call and ``os._exit`` (no imports, no locks) because it runs
    between ``fork`` and ``exec``. A parent that died before the call is caught by the
    ``getppid`` check.
    """
    prctl = _PRCTL
    if prctl is None:  # pragma: no cover - not Linux
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return hook


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
    """The environment a measured (or ``serve``d) server gets: the tool's own without the
    variables options are read from (``LLAMA_ARG_*`` ...) and with ``XDG_CONFIG_HOME=/dev/null``.

    llama-server reads those variables as flags and the user config file as defaults; either
    would change what runs without showing in the recorded argv (which check-deploy compares).
    The variables ggml reads (:mod:`batch_invariance.core.server_env`) are passed on and
    recorded in the server's provenance (``engine_env``).
    """
    return measured_env(parent)


def refuse_system_config() -> None:
    """The system-wide config file would be read by every server: refuse to start one."""
    if Path(SYSTEM_CONFIG).exists():
        raise InfraError(
            f"{SYSTEM_CONFIG} exists: llama-server reads it before its flags, so what it "
            "runs would differ from the recorded argv; move it away"
        )


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, joined with `` | `` for a one-line error."""
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return "(no log)"
    text = data.decode("utf-8", errors="replace").strip().splitlines()
    tail = [ln.strip() for ln in text[-lines:] if ln.strip()]
    return " | ".join(tail) if tail else "(log is empty)"


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
        command: LaunchCommand | None = None,
    ) -> None:
        self.arm = arm
        self.label = f"{arm}:np{parallel}"
        self.parallel = parallel
        self.ctx = ctx
        self.port = port
        self.host = host
        self.metrics_enabled = metrics
        self.kv_label = kv_label(ctx, parallel, kv_layout)
        # Another engine's process (engines.launch) brings its own command and ready path.
        self.argv = (
            command.argv
            if command is not None
            else build_argv(
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
        )
        self._env = dict(command.env) if command is not None else {}
        self._ready_path = command.ready_path if command is not None else "/health"
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
        refuse_system_config()
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._prev_sigterm = install_sigterm(only_if_default=True)
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=die_with_parent_hook(os.getpid()),
                env=self._child_env(),
            )
        except OSError as exc:
            self._log.close()
            restore_sigterm(self._prev_sigterm)
            self._prev_sigterm = None
            raise InfraError(
                f"cannot start {self.argv[0]}: {exc.strerror or exc}; check --server-bin"
            ) from None
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._started = time.monotonic()

    def _child_env(self) -> dict[str, str]:
        return {**server_env(os.environ), **self._env}

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
                    resp = session.get(self.base_url + self._ready_path, timeout=0.5)
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
            restore_sigterm(self._prev_sigterm)
            self._prev_sigterm = None

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        # start_new_session made the child a group leader: its pgid is its pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

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
            "engine_env": engine_env(self._child_env()),
        }
