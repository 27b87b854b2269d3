"""How a server child is started safely, for any engine (its environment is the engine's
:meth:`~batch_invariance.engines.base.Engine.child_env`): the config files that must not
exist, the parent-death signal, and the log tail its errors quote."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Any

from batch_invariance.engines.base import Engine
from batch_invariance.errors import InfraError

__all__ = ["die_with_parent_hook", "log_tail", "refuse_system_config"]

_TAIL_LINES = 15

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


def refuse_system_config(engine: Engine) -> None:
    """A system-wide config file would be read by every server: refuse to start one."""
    for config in engine.env_rules.system_configs:
        if Path(config).exists():
            raise InfraError(
                f"{config} exists: llama-server reads it before its flags, so what it "
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
