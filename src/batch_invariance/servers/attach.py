"""Attach mode: measuring a server the tool did not start (``run-live --base-url``).

The tool cannot make a ``--parallel 1`` server there, so arm A's --parallel 1 ground truth is
not available: arms A and A' are run serially on the attached server itself, then B and the
concurrent C passes as usual. A divergence between serial and concurrent requests on one
server is still real evidence (RED), but nothing about the server's configuration can be
attested, so such a cert has ``source: attached`` and is never promotable. Only loopback
addresses are accepted unless the user passes ``--allow-remote``, which the cert records.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import requests

from batch_invariance.core.chat_template import ChatFallback
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.base import Engine
from batch_invariance.engines.probes import BusyProbe, PassCounter, get_json
from batch_invariance.errors import InfraError, UsageError
from batch_invariance.host import memory
from batch_invariance.servers.launch import LaunchRecord

__all__ = ["ARM_A_NOTE", "AttachLauncher", "AttachTarget", "AttachedHandle", "attach_target"]

ARM_A_NOTE = (
    "arm A not available: the tool cannot start a --parallel 1 server on an attached server; "
    "arms A and A' ran serially on the attached server"
)


@dataclass(frozen=True)
class AttachTarget:
    """Where the attached server is, and what the user allowed."""

    base_url: str
    metrics_url: str | None
    allow_remote: bool

    def to_record(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "metrics_url": self.metrics_url,
            "allow_remote": self.allow_remote,
            "arm_a": ARM_A_NOTE,
        }


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _checked_url(url: str, flag: str, allow_remote: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag} {url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8080")
    if not allow_remote and not _is_loopback(parts.hostname):
        raise UsageError(
            f"{flag} {url!r} is not a loopback address; pass --allow-remote to measure a "
            "remote server (the cert records it)"
        )
    return url.rstrip("/")


def attach_target(
    base_url: str, metrics_url: str | None = None, allow_remote: bool = False
) -> AttachTarget:
    """Validate the attach URLs: :class:`UsageError` for a bad or (unallowed) remote one."""
    return AttachTarget(
        base_url=_checked_url(base_url, "--base-url", allow_remote),
        metrics_url=(
            _checked_url(metrics_url, "--metrics-url", allow_remote) if metrics_url else None
        ),
        allow_remote=allow_remote,
    )


@dataclass(frozen=True)
class AttachedHandle:
    """The attached server as the driver sees it; the tool never stops it."""

    target: AttachTarget
    engine: Engine
    role: ServerRole

    @property
    def base_url(self) -> str:
        return self.target.base_url

    @property
    def label(self) -> str:
        return f"attached:{self.role}"

    @property
    def argv(self) -> tuple[str, ...]:
        return ()  # not started by the tool: its command line is unknown

    @property
    def metrics_enabled(self) -> bool:
        return bool(self.busy_probes)

    @property
    def kv_label(self) -> str:
        return "attached:unknown (not started by the tool)"

    @property
    def busy_probes(self) -> tuple[BusyProbe, ...]:
        return self.engine.busy_probes(self.target.base_url, self.target.metrics_url)

    @property
    def pass_counters(self) -> tuple[PassCounter, ...]:
        return self.engine.pass_counters(self.target.base_url, self.target.metrics_url)

    def chat_template(self) -> str | None:
        return self.engine.chat_template(self.base_url)

    @property
    def chat_fallback(self) -> ChatFallback:
        return ChatFallback(self.engine.name, self.engine.fallback_chat_template)

    def check_alive(self) -> None:
        with requests.Session() as session:
            if get_json(session, self.base_url + "/v1/models", timeout_s=2.0) is None:
                raise InfraError(f"attached server {self.base_url} stopped answering /v1/models")

    def info(self) -> Mapping[str, Any]:
        with requests.Session() as session:
            models = get_json(session, self.base_url + "/v1/models", timeout_s=2.0)
            props = get_json(session, self.base_url + "/props", timeout_s=2.0)
        build = props.get("build_info") if isinstance(props, dict) else None
        return {
            "kind": "attached",
            "engine": self.engine.name,
            **self.target.to_record(),
            "models": models.get("data") if isinstance(models, dict) else None,
            "build_info": build if isinstance(build, str) else None,
        }


class AttachLauncher:
    """A ``ServerLauncher`` that starts nothing: every arm runs on the attached server."""

    def __init__(self, target: AttachTarget, engine: Engine) -> None:
        self.target = target
        self.engine = engine
        #: Nothing is launched here (the same attributes as the launchers that do).
        self.launches: list[LaunchRecord] = []
        self.aborted: str | None = None

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"attached"``: the tool did not start (and cannot attest) this server."""
        return "attached"

    def guard_decision(
        self,
        parallel: int,
        ctx: int,
        host: memory.HostMemory,
        role: ServerRole = ServerRole.BC,
    ) -> memory.GuardDecision | None:
        """``None``: the attached server's memory is not the tool's to guard."""
        return None

    @contextlib.contextmanager
    def launch(self, role: ServerRole, parallel: int, ctx: int) -> Iterator[AttachedHandle]:
        handle = AttachedHandle(self.target, self.engine, role)
        try:
            handle.check_alive()
        except InfraError as exc:
            raise InfraError(f"{exc}; is the server at --base-url running?") from None
        yield handle
