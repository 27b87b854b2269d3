"""What one cell measured besides the evidence: per-arm timing, the servers it started, and
the :class:`CellRun` that carries both with the evidence to ``finish_cell``.

What the cell driver runs over: a launcher that starts servers, and the handle of one.

Every launcher (``servers.launch.EngineLauncher``, ``servers.attach.AttachLauncher``, the
mock's, the calibration wrapper's) implements these; the driver (``run.cell``, ``run.arms``,
``run.passes``) reads only them.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from batch_invariance.cert.provenance import (
    ChatTemplateRecord,
    PlanRecord,
    Provenance,
    ScheduleRecord,
    ServerEntry,
    ServerInfo,
)
from batch_invariance.core.chat_template import (
    NO_FALLBACK,
    ChatFallback,
    judge_chat_template,
    sends_chat,
)
from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    ARM_CACHE,
    CellEvidence,
)
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.roles import ServerRole
from batch_invariance.engines.probes import BusyProbe, PassCounter

__all__ = [
    "ArmStats",
    "CellRun",
    "ModelTemplate",
    "ServerHandle",
    "ServerLauncher",
    "ServerMs",
    "ServerRecord",
]


@dataclass(frozen=True)
class ArmStats:
    """Wall time and server-reported time of one arm (or one C pass)."""

    arm: str
    pass_index: int | None
    wall_s: float
    n_requests: int
    n_transport_failures: int
    prompt_ms: float
    predicted_ms: float
    #: Tokens the server reported generating (``timings.predicted_n``), summed.
    predicted_n: int = 0
    server_busy_max: int | None = None
    busy_source: str | None = None
    #: Server counters' change over a C pass (``PassCounter``), where the engine has any.
    counter_deltas: Mapping[str, Mapping[str, float]] | None = None

    def to_record(self) -> dict[str, Any]:
        # Only where an engine offers counters: a llama-server cert has no such block, so
        # its record keeps the shape every verifier already reads.
        extra: dict[str, Any] = {}
        if self.counter_deltas is not None:
            extra["witness_corroboration"] = {k: dict(v) for k, v in self.counter_deltas.items()}
        return {
            **extra,
            "arm": self.arm,
            "pass": self.pass_index,
            "wall_s": round(self.wall_s, 6),
            "n_requests": self.n_requests,
            "n_transport_failures": self.n_transport_failures,
            "server_prompt_ms": round(self.prompt_ms, 3),
            "server_predicted_ms": round(self.predicted_ms, 3),
            "server_predicted_n": self.predicted_n,
            "server_busy_max": self.server_busy_max,
            "busy_source": self.busy_source,
        }


@dataclass(frozen=True)
class ServerRecord:
    """One server the cell launched."""

    role: str
    label: str
    argv: tuple[str, ...]
    kv_label: str
    metrics_enabled: bool
    info: Mapping[str, Any]
    wall_s: float

    def entry(self) -> ServerEntry:
        """The server as ``provenance.servers`` records it."""
        return ServerEntry(
            role=self.role,
            label=self.label,
            argv=tuple(self.argv),
            kv_label=self.kv_label,
            metrics_enabled=self.metrics_enabled,
            info=ServerInfo.from_record(self.info),
            wall_s=round(self.wall_s, 6),
        )


class ServerMs(NamedTuple):
    """Server-reported time summed over every arm of a cell."""

    prompt_ms: float
    predicted_ms: float


@dataclass(frozen=True)
class ModelTemplate:
    """What a model file's header says about its chat template (``None``: it has none)."""

    template: str | None


@dataclass(frozen=True)
class CellRun:
    """Everything one cell measured: the evidence for the core, and how it was measured."""

    plan: CellPlan
    evidence: CellEvidence
    arm_stats: tuple[ArmStats, ...]
    request_template: Mapping[str, Any]
    servers: tuple[ServerRecord, ...]
    launches: int
    scorer_id: str
    wall_s: float
    #: What kind of server answered: the launcher's ``source`` ("live" or "mock").
    source: Literal["live", "mock", "attached"] = "mock"
    notes: tuple[str, ...] = ()
    #: Which arms ran and why, and whether the passes were cut short (``provenance.schedule``).
    schedule: ScheduleRecord | None = None
    #: What the A server's ``/props`` said it applies to chat requests (``None``: unknown).
    server_chat_template: str | None = None
    #: The engine's built-in template for a model with none, and its name.
    chat_fallback: ChatFallback = NO_FALLBACK

    @property
    def kv_label(self) -> str:
        """The KV layout of the B/C server (what the cert's ``kv_label`` names)."""
        for server in self.servers:
            if server.role == "BC":
                return server.kv_label
        return self.servers[-1].kv_label if self.servers else "unknown"

    def arm_wall_s(self, arm: str) -> float:
        return sum(s.wall_s for s in self.arm_stats if s.arm == arm)

    def server_ms(self) -> ServerMs:
        """Summed server-reported prompt and generation time over every arm."""
        return ServerMs(
            prompt_ms=sum(s.prompt_ms for s in self.arm_stats),
            predicted_ms=sum(s.predicted_ms for s in self.arm_stats),
        )

    def provenance(self, model_template: ModelTemplate | None = None) -> Provenance:
        """The run's own provenance block (merged under the caller's in :func:`finish_cell`).

        ``model_template``: the model file's own template, where its header was read (a
        launched GGUF model); without it, the A server's ``/props`` report decides."""
        server_ms = self.server_ms()
        chat_template = judge_chat_template(
            uses_chat=sends_chat(self.plan.endpoint, self.plan.items),
            server_argv=[a for s in self.servers for a in s.argv],
            server_template=self.server_chat_template,
            fallback=self.chat_fallback,
            model_read=model_template is not None,
            model_template=None if model_template is None else model_template.template,
        )
        return Provenance(
            request_template=dict(self.request_template),
            servers=tuple(s.entry() for s in self.servers),
            server_launches=self.launches,
            scorer_id=self.scorer_id,
            arms=tuple(s.to_record() for s in self.arm_stats),
            timing={
                "cell_wall_s": round(self.wall_s, 6),
                "arm_wall_s": {
                    arm: round(self.arm_wall_s(arm), 6)
                    for arm in (ARM_A, ARM_A_REPEAT, ARM_B, ARM_C)
                    + ((ARM_CACHE,) if self.evidence.cache_passes is not None else ())
                },
                "server_prompt_ms": round(server_ms.prompt_ms, 3),
                "server_predicted_ms": round(server_ms.predicted_ms, 3),
            },
            plan=PlanRecord(
                ctx=self.plan.ctx,
                parallel=self.plan.parallel,
                gate_passes=self.plan.gate_passes,
                n_predict=self.plan.n_predict,
                seed=self.plan.seed,
                endpoint=self.plan.endpoint,
                n_probs=self.plan.n_probs,
                serial_repeat=self.plan.serial_repeat,
                stop_on_red=self.plan.stop_on_red,
                req_timeout=self.plan.req_timeout,
                n_items=len(self.plan.items),
            ),
            notes=tuple(self.notes[:200]),
            schedule=self.schedule,
            # The one place the block is written: every source of the answer at once.
            chat_template=ChatTemplateRecord.from_record(chat_template.to_record()),
        )


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
