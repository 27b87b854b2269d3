"""Loopback port choice for experiment servers.

A port is only ever bound on 127.0.0.1. Reserved ports (8080 by default, plus every
``--reserved-port``) are never bound and never addressed. The choice is re-checked right
before every launch, because another process may have taken the port since the plan was made.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

from batch_invariance.errors import GuardRefused, UsageError

__all__ = [
    "DEFAULT_RESERVED",
    "LOOPBACK",
    "PortPolicy",
    "choose",
    "is_free",
    "make_policy",
    "pick_free",
]


LOOPBACK = "127.0.0.1"

#: Ports reserved unless the user says otherwise (a production server often listens there).
DEFAULT_RESERVED: frozenset[int] = frozenset({8080})


@dataclass(frozen=True)
class PortPolicy:
    """A fixed port (``--port``) or ``None`` for a free one, minus the reserved set."""

    fixed: int | None
    reserved: frozenset[int]


def make_policy(port: int | None, reserved: Iterable[int] | None) -> PortPolicy:
    """Validate ``--port``/``--reserved-port``; a fixed port that is reserved is a usage error."""
    res = set(DEFAULT_RESERVED)
    for r in reserved or ():
        if not 1 <= r <= 65535:
            raise UsageError(f"--reserved-port {r} is not a TCP port (1-65535)")
        res.add(r)
    if port is not None:
        if not 1 <= port <= 65535:
            raise UsageError(f"--port {port} is not a TCP port (1-65535)")
        if port in res:
            raise UsageError(f"--port {port} is reserved (--reserved-port); choose another port")
    return PortPolicy(fixed=port, reserved=frozenset(res))


def is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when ``port`` can be bound on ``host`` right now.

    ``SO_REUSEADDR`` mirrors what llama-server does, so connections of a just-stopped server
    lingering in TIME_WAIT do not count as "in use"; a listening socket does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_free(reserved: frozenset[int], host: str = LOOPBACK, attempts: int = 64) -> int:
    """A port the kernel says is free on ``host``, never one in ``reserved``."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in reserved and is_free(port, host):
            return port
    raise GuardRefused("no free loopback port found; free some ports and rerun")


def choose(policy: PortPolicy, host: str = LOOPBACK) -> int:
    """The port for the next launch, checked now.

    A busy fixed port is refused (nothing is launched); a free port is picked otherwise.
    """
    if policy.fixed is not None:
        if policy.fixed in policy.reserved:
            raise GuardRefused(f"port {policy.fixed} is reserved; it is never bound")
        if not is_free(policy.fixed, host):
            raise GuardRefused(
                f"port {policy.fixed} on {host} is in use; pick another --port or omit it"
            )
        return policy.fixed
    return pick_free(policy.reserved, host)
