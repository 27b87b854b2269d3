"""Running one cell: arms A, A', B and the C passes over a :class:`ServerLauncher`.

:func:`run_cell` owns exactly one server at a time. The A server (``--parallel 1``) runs arm A
serially, then the serial repeat A' (unless the plan skips it); it is torn down before the B/C
server (``--parallel N``) starts, which runs arm B serially and then the T concurrent C passes.
Every request becomes a :class:`~batch_invariance.core.evidence.Trial` (transport failures too, as
failure modes), scored through :func:`batch_invariance.core.scoring.evaluate`. The result is a
:class:`CellRun` whose ``evidence`` the pure core judges.

:func:`finish_cell` turns a :class:`CellRun` into a written cert: ``verdict.decide``,
``certificate.build_cert``, ``certstore.write_cert``. ``run-mock``, ``run-live``, ``demo`` and
the Action all go through these two functions.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    CellEvidence,
    CellSpec,
    GatePolicy,
    ItemMeta,
    PassRecord,
    Trial,
)
from batch_invariance.core.scoring import Completion, Scorer, evaluate
from batch_invariance.core.workitem import WorkItem
from batch_invariance.errors import UsageError
from batch_invariance.run.dispatch import ConcurrentPass, run_concurrent_pass, run_serial
from batch_invariance.run.progress import NullProgress, ProgressSink
from batch_invariance.run.transport import RawResponse, RequestTemplate

if TYPE_CHECKING:
    from batch_invariance.cert.certificate import Cert
    from batch_invariance.core.verdict import Verdict


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

    def check_alive(self) -> None:
        """Raise :class:`~batch_invariance.errors.InfraError` (with the log tail) if it died."""

    def info(self) -> Mapping[str, Any]:
        """Provenance of this server (binary, version, ...), JSON-ready."""


class ServerLauncher(Protocol):
    """Starts servers for the driver. ``arm`` is ``"A"`` or ``"BC"``.

    ``source`` says what kind of server it starts: ``"live"`` only for a launcher that spawns
    a real server process itself. The cert's ``source`` is taken from here (never from a flag).
    """

    @property
    def source(self) -> Literal["live", "mock", "attached"]:
        """``"live"`` when this launcher spawns real server processes, ``"attached"`` for a
        server it did not start, else ``"mock"``."""

    def launch(self, arm: str, parallel: int, ctx: int) -> AbstractContextManager[ServerHandle]:
        """A context manager that starts a ready server and tears it down on exit."""


@dataclass(frozen=True)
class CellPlan:
    """What to run for one cell.

    ``items`` are the final test items (already expanded by ``--reps``), ``ctx`` the tokens
    every slot gets, ``parallel`` the N of the B/C server, ``gate_passes`` the number T of
    concurrent C passes.
    """

    items: tuple[WorkItem, ...]
    ctx: int
    parallel: int
    gate_passes: int = 8
    n_predict: int = 128
    seed: int = 0
    endpoint: Literal["chat", "completions"] = "chat"
    n_probs: int | None = None
    serial_repeat: bool = True
    req_timeout: float = 120.0

    def template(self) -> RequestTemplate:
        return RequestTemplate(
            endpoint=self.endpoint,
            n_predict=self.n_predict,
            seed=self.seed,
            n_probs=self.n_probs,
            timeout_s=self.req_timeout,
        )

    @property
    def n_requests(self) -> int:
        """Requests this plan sends in total."""
        serial_arms = 3 if self.serial_repeat else 2
        return len(self.items) * (serial_arms + self.gate_passes)

    def validate(self) -> None:
        """Raise :class:`UsageError` for a plan that cannot run."""
        if not self.items:
            raise UsageError("the work-set is empty; give at least one row")
        ids = [i.test_id for i in self.items]
        if len(set(ids)) != len(ids):
            raise UsageError("test ids must be unique within a cell")
        if self.parallel < 1:
            raise UsageError(f"--parallel must be at least 1 (got {self.parallel})")
        if self.ctx < 1:
            raise UsageError(f"--ctx must be positive (got {self.ctx})")
        if self.gate_passes < 1:
            raise UsageError(f"--gate-passes must be at least 1 (got {self.gate_passes})")
        if self.n_predict < 1:
            raise UsageError(f"--n-predict must be at least 1 (got {self.n_predict})")
        if self.n_probs is not None and self.n_probs < 1:
            raise UsageError(f"--n-probs must be at least 1 (got {self.n_probs})")
        if self.req_timeout <= 0:
            raise UsageError(f"--req-timeout must be positive (got {self.req_timeout})")


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
    server_busy_max: int | None = None
    busy_source: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "pass": self.pass_index,
            "wall_s": round(self.wall_s, 6),
            "n_requests": self.n_requests,
            "n_transport_failures": self.n_transport_failures,
            "server_prompt_ms": round(self.prompt_ms, 3),
            "server_predicted_ms": round(self.predicted_ms, 3),
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

    def to_record(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "label": self.label,
            "argv": list(self.argv),
            "kv_label": self.kv_label,
            "metrics_enabled": self.metrics_enabled,
            "info": dict(self.info),
            "wall_s": round(self.wall_s, 6),
        }


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

    @property
    def kv_label(self) -> str:
        """The KV layout of the B/C server (what the cert's ``kv_label`` names)."""
        for server in self.servers:
            if server.role == "BC":
                return server.kv_label
        return self.servers[-1].kv_label if self.servers else "unknown"

    def arm_wall_s(self, arm: str) -> float:
        return sum(s.wall_s for s in self.arm_stats if s.arm == arm)

    def server_ms(self) -> tuple[float, float]:
        """Summed server-reported (prompt_ms, predicted_ms) over every arm."""
        return (
            sum(s.prompt_ms for s in self.arm_stats),
            sum(s.predicted_ms for s in self.arm_stats),
        )

    def provenance(self) -> dict[str, Any]:
        """The run's own provenance block (merged under the caller's in :func:`finish_cell`)."""
        prompt_ms, predicted_ms = self.server_ms()
        return {
            "request_template": dict(self.request_template),
            "servers": [s.to_record() for s in self.servers],
            "server_launches": self.launches,
            "scorer_id": self.scorer_id,
            "arms": [s.to_record() for s in self.arm_stats],
            "timing": {
                "cell_wall_s": round(self.wall_s, 6),
                "arm_wall_s": {
                    arm: round(self.arm_wall_s(arm), 6)
                    for arm in (ARM_A, ARM_A_REPEAT, ARM_B, ARM_C)
                },
                "server_prompt_ms": round(prompt_ms, 3),
                "server_predicted_ms": round(predicted_ms, 3),
            },
            "plan": {
                "ctx": self.plan.ctx,
                "parallel": self.plan.parallel,
                "gate_passes": self.plan.gate_passes,
                "n_predict": self.plan.n_predict,
                "seed": self.plan.seed,
                "endpoint": self.plan.endpoint,
                "n_probs": self.plan.n_probs,
                "serial_repeat": self.plan.serial_repeat,
                "req_timeout": self.plan.req_timeout,
                "n_items": len(self.plan.items),
            },
            "notes": list(self.notes[:200]),
        }


def content_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class _Notes:
    items: list[str] = field(default_factory=list)

    def add(self, note: str) -> None:
        self.items.append(note)


def make_trial(
    resp: RawResponse, item: WorkItem, scorer: Scorer, n_predict: int, notes: _Notes, arm: str
) -> Trial:
    """Score one response into a trial (a transport failure stays a failure mode)."""
    for note in resp.notes:
        notes.add(f"{arm}: {note}")
    timings = dict(resp.timings or {})
    if resp.failure_mode is not None or resp.text is None:
        return Trial(
            test_id=item.test_id,
            score=None,
            passed=None,
            extracted_answer=None,
            expected_answer=item.expected_answer,
            prompt_tokens_measured=None,
            failure_mode=resp.failure_mode or "connection_error",
            dispatch_ts=resp.dispatch_ts,
            complete_ts=resp.complete_ts,
            timings=timings,
            transport_error=resp.transport_error,
        )
    completion = Completion(
        text=resp.text,
        finish_reason=resp.finish_reason,
        completion_tokens=resp.completion_tokens,
        n_predict=n_predict,
    )
    result = evaluate(scorer, item, completion)
    if result.error is not None:
        notes.add(f"{arm}: {item.test_id}: scorer raised {result.error}")
    return Trial(
        test_id=item.test_id,
        score=result.score,
        passed=result.passed,
        extracted_answer=result.extracted_answer,
        expected_answer=item.expected_answer,
        prompt_tokens_measured=resp.prompt_tokens,
        failure_mode=result.failure_mode,
        completion=resp.text,
        content_sha256=content_sha256(resp.text),
        completion_tokens=resp.completion_tokens,
        finish_reason=resp.finish_reason,
        tokens=resp.tokens,
        token_logprobs=resp.token_logprobs,
        top_margins=resp.top_margins,
        dispatch_ts=resp.dispatch_ts,
        complete_ts=resp.complete_ts,
        slot_id=resp.slot_id,
        timings=timings,
        transport_error=None,
    )


def _trials(
    responses: Mapping[str, RawResponse],
    items: Sequence[WorkItem],
    scorer: Scorer,
    n_predict: int,
    notes: _Notes,
    arm: str,
) -> dict[str, Trial]:
    out: dict[str, Trial] = {}
    for item in items:
        resp = responses.get(item.test_id)
        if resp is None:
            # Never leave an id out (an absent id reads as a divergence): record why instead.
            notes.add(f"{arm}: {item.test_id}: no response recorded")
            resp = RawResponse(
                item.test_id, "connection_error", transport_error="no response recorded"
            )
        out[item.test_id] = make_trial(resp, item, scorer, n_predict, notes, arm)
    return out


def _arm_stats(
    arm: str,
    pass_index: int | None,
    wall_s: float,
    responses: Mapping[str, RawResponse],
    busy: tuple[int | None, str | None] = (None, None),
) -> ArmStats:
    prompt_ms = sum((r.timings or {}).get("prompt_ms", 0.0) for r in responses.values())
    predicted_ms = sum((r.timings or {}).get("predicted_ms", 0.0) for r in responses.values())
    return ArmStats(
        arm=arm,
        pass_index=pass_index,
        wall_s=wall_s,
        n_requests=len(responses),
        n_transport_failures=sum(1 for r in responses.values() if not r.ok),
        prompt_ms=prompt_ms,
        predicted_ms=predicted_ms,
        server_busy_max=busy[0],
        busy_source=busy[1],
    )


def _server_record(role: str, handle: ServerHandle, wall_s: float) -> ServerRecord:
    return ServerRecord(
        role=role,
        label=handle.label,
        argv=tuple(handle.argv),
        kv_label=handle.kv_label,
        metrics_enabled=handle.metrics_enabled,
        info=dict(handle.info()),
        wall_s=wall_s,
    )


def run_cell(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    progress: ProgressSink | None = None,
) -> CellRun:
    """Measure one cell. Raises only for infrastructure (launch) failures and interrupts.

    Transport failures of single requests are recorded in the trials, never raised.
    """
    plan.validate()
    sink: ProgressSink = progress if progress is not None else NullProgress()
    template = plan.template()
    items = plan.items
    notes = _Notes()
    stats: list[ArmStats] = []
    servers: list[ServerRecord] = []
    launches = 0
    cell_start = time.monotonic()

    def tick(_: RawResponse) -> None:
        sink.advance(1)

    sink.begin(plan.n_requests)
    try:
        # --- the A server: --parallel 1, serial dispatch (ground truth), then A' -------------
        a_resp: Mapping[str, RawResponse]
        a_repeat_resp: Mapping[str, RawResponse] | None = None
        launches += 1
        with launcher.launch("A", 1, plan.ctx) as server_a:
            started = time.monotonic()
            sink.arm(ARM_A)
            t0 = time.monotonic()
            a_resp = run_serial(server_a.base_url, template, items, server_a.check_alive, tick)
            stats.append(_arm_stats(ARM_A, None, time.monotonic() - t0, a_resp))
            if plan.serial_repeat:
                sink.arm("A'")
                t0 = time.monotonic()
                a_repeat_resp = run_serial(
                    server_a.base_url, template, items, server_a.check_alive, tick
                )
                stats.append(_arm_stats(ARM_A_REPEAT, None, time.monotonic() - t0, a_repeat_resp))
            servers.append(_server_record("A", server_a, time.monotonic() - started))

        # --- the B/C server: --parallel N, serial B, then T concurrent C passes --------------
        passes: list[ConcurrentPass] = []
        launches += 1
        with launcher.launch("BC", plan.parallel, plan.ctx) as server_bc:
            started = time.monotonic()
            sink.arm(ARM_B)
            t0 = time.monotonic()
            b_resp = run_serial(server_bc.base_url, template, items, server_bc.check_alive, tick)
            stats.append(_arm_stats(ARM_B, None, time.monotonic() - t0, b_resp))
            for index in range(plan.gate_passes):
                sink.arm(ARM_C, index, plan.gate_passes)
                result = run_concurrent_pass(
                    server_bc.base_url,
                    template,
                    items,
                    workers=plan.parallel,
                    pass_index=index,
                    seed=plan.seed,
                    metrics_enabled=server_bc.metrics_enabled,
                    check_alive=server_bc.check_alive,
                    on_done=tick,
                    # An engine's handle names its own busy witnesses (possibly none: F1 then
                    # fails closed); without the attribute, llama-server's /slots and /metrics.
                    probes=getattr(server_bc, "busy_probes", None),
                )
                passes.append(result)
                stats.append(
                    _arm_stats(
                        ARM_C,
                        index,
                        result.wall_s,
                        result.responses,
                        (result.server_busy_max, result.busy_source),
                    )
                )
                _note_slots(notes, result)
            servers.append(_server_record("BC", server_bc, time.monotonic() - started))
    finally:
        sink.end()

    n_predict = plan.n_predict
    evidence = CellEvidence(
        items=tuple(ItemMeta(i.test_id, i.family, i.fill) for i in items),
        a=_trials(a_resp, items, scorer, n_predict, notes, ARM_A),
        a_repeat=(
            _trials(a_repeat_resp, items, scorer, n_predict, notes, ARM_A_REPEAT)
            if a_repeat_resp is not None
            else None
        ),
        b=_trials(b_resp, items, scorer, n_predict, notes, ARM_B),
        c_passes=tuple(
            PassRecord(
                index=p.index,
                trials=_trials(p.responses, items, scorer, n_predict, notes, f"C{p.index}"),
                server_busy_max=p.server_busy_max,
                busy_source=p.busy_source,
                order=p.order,
            )
            for p in passes
        ),
    )
    return CellRun(
        plan=plan,
        evidence=evidence,
        arm_stats=tuple(stats),
        request_template=template.to_record(),
        servers=tuple(servers),
        launches=launches,
        scorer_id=str(getattr(scorer, "scorer_id", type(scorer).__name__)),
        wall_s=time.monotonic() - cell_start,
        source=launcher.source,
        notes=tuple(notes.items),
    )


def _note_slots(notes: _Notes, result: ConcurrentPass) -> None:
    """Record which slots answered in a pass (diagnostic: the slot ids responses reported)."""
    slots = sorted({r.slot_id for r in result.responses.values() if r.slot_id is not None})
    if slots:
        notes.add(f"C{result.index}: responses reported slots {slots}")
    if result.busy.n_samples == 0:
        notes.add(f"C{result.index}: the busy-slot sampler took no samples")


@dataclass(frozen=True)
class FinishedCell:
    """A cell whose cert was written."""

    cert: Cert
    verdict: Verdict
    path: Path
    superseded: Path | None


def utc_now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ`` (the shell's clock, not the core's)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finish_cell(
    run: CellRun,
    spec: CellSpec,
    policy: GatePolicy,
    provenance: Mapping[str, Any],
    out_dir: Path,
    ts_utc: str | None = None,
) -> FinishedCell:
    """Decide the verdict, build the cert and write it atomically into ``out_dir``.

    ``provenance`` from the caller (tool version, binary and model hashes, work-set sha256, ...)
    is merged over the run's own block (request template, servers, timings). The cert's
    ``source`` is the run's: what the launcher that started the servers is.
    """
    from batch_invariance.cert import certificate
    from batch_invariance.cert import store as certstore
    from batch_invariance.core import verdict

    decided = verdict.decide(run.evidence, policy)
    merged: dict[str, Any] = {**run.provenance(), **dict(provenance)}
    cert = certificate.build_cert(
        run.evidence,
        decided,
        spec,
        policy,
        merged,
        run.source,
        ts_utc if ts_utc is not None else utc_now(),
    )
    written = certstore.write_cert(out_dir, cert)
    return FinishedCell(
        cert=cert, verdict=decided, path=written.path, superseded=written.superseded
    )
