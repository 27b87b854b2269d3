"""What the cell driver runs over: a launcher that starts servers, and the handle of one.

Every launcher (``servers.launch.EngineLauncher``, ``servers.attach.AttachLauncher``, the
mock's, the calibration wrapper's) implements these; the driver (``run.cell``, ``run.arms``,
``run.passes``) reads only them.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from batch_invariance.core.chat_template import ChatFallback
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.probes import BusyProbe, PassCounter

__all__ = ["ServerHandle", "ServerLauncher"]


class ServerHandle(Protocol):
    """A running server as the driver uses it."""

    @property
    def base_url(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def metrics_enabled(self) -> bool: ...

    @property
    def kv_label(self) -> str: ...

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        """The engine's busy witnesses (none: F1 has no server signal and fails closed)."""

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        """Counters read around each C pass (corroboration only, never read by F1)."""

    def chat_template(self) -> str | None:
        """The chat template the server says it applies (``None``: it does not say)."""

    @property
    def chat_fallback(self) -> ChatFallback:
        """The engine's built-in template for a model with none, and the engine's name."""

    def check_alive(self) -> None:
        """Raise :class:`~batch_invariance.errors.InfraError` (with the log tail) if it died."""

    def info(self) -> Mapping[str, Any]:
        """Provenance of this server (binary, version, ...), JSON-ready."""


class ServerLauncher(Protocol):
    """Starts servers for the driver, one per :class:`ServerRole`.

    ``source`` says what kind of server it starts: ``"live"`` only for a launcher that spawns
    a real server process itself. The cert's ``source`` is taken from here (never from a flag).
    """

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"live"`` when this launcher spawns real server processes, else ``"mock"``."""

    def launch(
        self, role: ServerRole, parallel: int, ctx: int
    ) -> AbstractContextManager[ServerHandle]:
        """A context manager that starts a ready server and tears it down on exit."""
