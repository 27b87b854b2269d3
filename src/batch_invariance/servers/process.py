"""One server process of any engine, as a context manager with deadlines.

:class:`ServerProcess` spawns the engine's :class:`~batch_invariance.engines.base.LaunchCommand`
in its own process group on loopback, logs to ``<log_dir>/server-<arm>-<port>.log``, waits for
the engine's ready path while watching the child (a dead child is noticed within a second and
reported with the log tail, naming the engine), and on exit terminates, waits for and finally
kills its own process group, and nothing else. A module-level registry and an ``atexit`` hook
make sure no server outlives the tool, whatever path it leaves by; a parent-death signal
(:func:`~batch_invariance.servers.spawn.die_with_parent_hook`) covers the one path that runs no
Python code (``kill -9`` of the tool).

The launcher that guards memory and picks ports is :mod:`batch_invariance.servers.launch`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import requests

from batch_invariance.engines.base import Engine, LaunchCommand
from batch_invariance.engines.variables import Linked
from batch_invariance.errors import InfraError
from batch_invariance.host import memory
from batch_invariance.interrupts import install_sigterm, restore_sigterm
from batch_invariance.servers import ports
from batch_invariance.servers.spawn import (
    die_with_parent_hook,
    log_tail,
    refuse_system_config,
)

__all__ = ["ServerProcess"]

# Servers this process started and has not torn down yet (for atexit / signal paths).
_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()


def _cleanup_all() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for srv in servers:
        srv.stop()


atexit.register(_cleanup_all)


class ServerProcess:
    """One engine's server process on loopback; use as ``with ServerProcess(...) as srv:``.

    ``__enter__`` returns once ``command.ready_path`` answers 200 (and, where the engine
    ``reports_slots``, ``/props`` reports ``parallel`` slots), or raises :class:`InfraError`
    (dead child: within about a second; otherwise after ``ready_timeout`` seconds) naming
    the engine and quoting the log tail. ``__exit__`` always tears the process group down.
    """

    def __init__(
        self,
        engine: Engine,
        command: LaunchCommand,
        *,
        arm: str,
        parallel: int,
        ctx: int,
        port: int,
        log_dir: Path,
        host: str = ports.LOOPBACK,
        ready_timeout: float = 120.0,
        rss_cap_bytes: int | None = None,
        term_grace_s: float = 5.0,
    ) -> None:
        self.engine = engine.name
        self._engine = engine
        self.arm = arm
        self.label = f"{arm}:np{parallel}"
        self.parallel = parallel
        self.ctx = ctx
        self.port = port
        self.host = host
        self.argv = command.argv
        self._env = dict(command.env)
        self._ready_path = command.ready_path
        self._expects_slots = engine.reports_slots
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

    def __enter__(self) -> ServerProcess:
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
        refuse_system_config(self._engine)
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

    @functools.cached_property
    def _linked(self) -> Linked:
        """The runtimes its build links (read from its files once): their variables only
        are passed on and recorded."""
        return self._engine.linked_runtimes(self.argv)

    def _child_env(self) -> dict[str, str]:
        return {**self._engine.child_env(os.environ, self._linked), **self._env}

    def wait_ready(self) -> None:
        """Poll the ready path until 200; a dead child or the deadline raise
        :class:`InfraError`; then read the slot count where the engine reports one."""
        assert self._proc is not None
        deadline = self._started + self._ready_timeout
        session = requests.Session()
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self.exit_code = code
                    raise self._failure(f"exited with code {code} before it was ready")
                if time.monotonic() > deadline:
                    raise self._failure(
                        f"not ready after {self._ready_timeout:g} s (raise --ready-timeout?)"
                    )
                try:
                    resp = session.get(self.base_url + self._ready_path, timeout=0.5)
                    if resp.status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            self.ready_s = time.monotonic() - self._started
            if self._expects_slots:
                self.total_slots = _total_slots(session, self.base_url)
        finally:
            session.close()
        if self.total_slots is not None and self.total_slots != self.parallel:
            raise InfraError(
                f"{self.engine} ({self.label}) reports {self.total_slots} slots, expected "
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
            raise InfraError(f"{self.engine} ({self.label}) was never started")
        code = self._proc.poll()
        if code is not None:
            self.exit_code = code
            raise self._failure(f"died with code {code}")

    def _failure(self, what: str) -> InfraError:
        """One line naming the engine, the server, what happened and the log's tail."""
        return InfraError(
            f"{self.engine} ({self.label}, port {self.port}) {what}; "
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
        """JSON-ready facts about this process for the cert."""
        return {
            "arm": self.arm,
            "label": self.label,
            "argv": list(self.argv),
            "port": self.port,
            "parallel": self.parallel,
            "ctx_per_slot": self.ctx,
            "total_slots": self.total_slots,
            "ready_s": None if self.ready_s is None else round(self.ready_s, 3),
            "rss_peak_bytes": self._watch.peak_bytes if self._watch is not None else None,
            "log": str(self.log_path),
            "engine_env": self._engine.recorded_env(self._child_env(), self._linked),
        }


def _total_slots(session: requests.Session, base_url: str) -> int | None:
    """``total_slots`` from ``/props`` (``None`` where it does not say)."""
    try:
        props = session.get(f"{base_url}/props", timeout=5).json()
    except (requests.RequestException, ValueError):
        return None
    slots = props.get("total_slots") if isinstance(props, dict) else None
    return int(slots) if isinstance(slots, int) else None
