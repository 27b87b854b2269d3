"""Running one cell: arms A, A', B and the C passes over a :class:`ServerLauncher`.

:func:`run_cell` owns exactly one server at a time. The A server (``--parallel 1``) runs arm A
serially, then the serial repeat A' (unless the plan skips it); it is torn down before the B/C
server (``--parallel N``) starts, which runs arm B serially and then the T concurrent C passes.
Every request becomes a :class:`~batch_invariance.core.evidence.Trial` (transport failures too, as
failure modes), scored through :func:`batch_invariance.core.scoring.evaluate`. The result is a
:class:`CellRun` whose ``evidence`` the pure core judges.

:func:`~batch_invariance.run.finish.finish_cell` turns a :class:`CellRun` into a written
cert. ``run-mock``, ``run-live``, ``demo`` and the Action all go through these two functions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    CellEvidence,
    ItemMeta,
    PassRecord,
)
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import UsageError
from batch_invariance.run.dispatch import ConcurrentPass, run_concurrent_pass, run_serial
from batch_invariance.run.probe import server_chat_template
from batch_invariance.run.progress import NullProgress, ProgressSink
from batch_invariance.run.records import ArmStats, CellRun, ServerRecord
from batch_invariance.run.response import RawResponse
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.trials import Notes, trials_for

if TYPE_CHECKING:
    pass


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
        """``"live"`` when this launcher spawns real server processes, else ``"mock"``."""

    def launch(self, arm: str, parallel: int, ctx: int) -> AbstractContextManager[ServerHandle]:
        """A context manager that starts a ready server and tears it down on exit."""


def request_template(plan: CellPlan) -> RequestTemplate:
    """The request every arm sends for ``plan``."""
    return RequestTemplate(
        endpoint=plan.endpoint,
        n_predict=plan.n_predict,
        seed=plan.seed,
        n_probs=plan.n_probs,
        timeout_s=plan.req_timeout,
    )


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
    problems = plan.problems()
    if problems:
        raise UsageError(problems[0])
    sink: ProgressSink = progress if progress is not None else NullProgress()
    template = request_template(plan)
    control = template.without_logprobs()  # B and A' never read logprobs (LOGPROB_ARMS)
    items = plan.items
    notes = Notes()
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
            chat_template = server_chat_template(server_a.base_url)
            sink.arm(ARM_A)
            t0 = time.monotonic()
            a_resp = run_serial(server_a.base_url, template, items, server_a.check_alive, tick)
            stats.append(_arm_stats(ARM_A, None, time.monotonic() - t0, a_resp))
            if plan.serial_repeat:
                sink.arm("A'")
                t0 = time.monotonic()
                a_repeat_resp = run_serial(
                    server_a.base_url, control, items, server_a.check_alive, tick
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
            b_resp = run_serial(server_bc.base_url, control, items, server_bc.check_alive, tick)
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
                for note in slot_notes(result):
                    notes.add(note)
            servers.append(_server_record("BC", server_bc, time.monotonic() - started))
    finally:
        sink.end()

    n_predict = plan.n_predict
    evidence = CellEvidence(
        items=tuple(ItemMeta(i.test_id, i.family, i.fill) for i in items),
        a=trials_for(a_resp, items, scorer, n_predict, notes, ARM_A),
        a_repeat=(
            trials_for(a_repeat_resp, items, scorer, n_predict, notes, ARM_A_REPEAT)
            if a_repeat_resp is not None
            else None
        ),
        b=trials_for(b_resp, items, scorer, n_predict, notes, ARM_B),
        c_passes=tuple(
            PassRecord(
                index=p.index,
                trials=trials_for(p.responses, items, scorer, n_predict, notes, f"C{p.index}"),
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
        server_chat_template=chat_template,
    )


def slot_notes(result: ConcurrentPass) -> tuple[str, ...]:
    """What a pass says about its slots (diagnostic: the slot ids responses reported, and a
    busy-slot sampler that saw nothing)."""
    notes: list[str] = []
    slots = sorted({r.slot_id for r in result.responses.values() if r.slot_id is not None})
    if slots:
        notes.append(f"C{result.index}: responses reported slots {slots}")
    if result.busy.n_samples == 0:
        notes.append(f"C{result.index}: the busy-slot sampler took no samples")
    return tuple(notes)
