"""The arms of a cell, one server at a time: the ``--parallel 1`` reference (arm A, and the
serial repeat A' when it decides something) and the ``--parallel N`` server (the C passes,
ending early once RED is proven with ``stop_on_red``, then arm B where it decides something).
:mod:`batch_invariance.run.cell` composes them into one cell, or into a sweep's cells sharing
one reference.

The launcher Protocols the driver starts servers through live here too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    GatePolicy,
    PassRecord,
    Trial,
)
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.schedule import (
    BScope,
    RedProof,
    b_first_ids,
    b_scope_after,
    red_proof,
    serial_repeat_decision,
)
from batch_invariance.core.scoring import Scorer
from batch_invariance.core.workitem import WorkItem
from batch_invariance.errors import InfraError
from batch_invariance.run.dispatch import ConcurrentPass, run_concurrent_pass, run_serial
from batch_invariance.run.probe import server_chat_template
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import ArmStats, ServerRecord
from batch_invariance.run.response import RawResponse
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.trials import Notes, trials_for


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
) -> ArmStats:
    prompt_ms = sum((r.timings or {}).get("prompt_ms", 0.0) for r in responses.values())
    predicted_ms = sum((r.timings or {}).get("predicted_ms", 0.0) for r in responses.values())
    predicted_n = sum(int((r.timings or {}).get("predicted_n", 0)) for r in responses.values())
    return ArmStats(
        arm=arm,
        pass_index=pass_index,
        wall_s=wall_s,
        n_requests=len(responses),
        n_transport_failures=sum(1 for r in responses.values() if not r.ok),
        prompt_ms=prompt_ms,
        predicted_ms=predicted_ms,
        predicted_n=predicted_n,
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


@dataclass(frozen=True)
class Reference:
    """Arm A (and, once run, its serial repeat A') on ``--parallel 1`` servers: the ground
    truth a cell compares against. A sweep measures it once per ctx and shares it with every
    N (``shared_by`` then names the cells that used it)."""

    a: Mapping[str, RawResponse]
    a_trials: Mapping[str, Trial]
    a_stats: ArmStats
    server: ServerRecord
    notes: tuple[str, ...] = ()
    repeat: Mapping[str, RawResponse] | None = None
    repeat_stats: ArmStats | None = None
    repeat_server: ServerRecord | None = None
    #: Why A' ran or did not (recorded in the cert's ``provenance.schedule``).
    repeat_reason: str | None = None
    #: What the A server's ``/props`` said it applies to chat requests (``None``: unknown).
    chat_template: str | None = None
    #: Arm A's and A''s retried requests: their failed first attempts, by id.
    first_attempts: Mapping[str, RawResponse] = field(default_factory=dict)
    repeat_first_attempts: Mapping[str, RawResponse] = field(default_factory=dict)

    @property
    def launches(self) -> int:
        return 1 + (self.repeat_server is not None)


@dataclass(frozen=True)
class ParallelRun:
    """What the ``--parallel N`` server measured: arm B and the C passes run."""

    b: Mapping[str, RawResponse]
    b_trials: Mapping[str, Trial]
    c_passes: tuple[PassRecord, ...]
    stats: tuple[ArmStats, ...]
    server: ServerRecord
    notes: tuple[str, ...]
    #: The pass that proved RED when ``--stop-on-red`` ended the cell there, else ``None``.
    red_proof: RedProof | None
    #: The ids B ran on when the cell was RED and B reproduced A on its divergent ids.
    b_ids: tuple[str, ...] | None = None
    #: Why B ran where it did (recorded in ``provenance.schedule``).
    b_reason: str | None = None


@contextlib.contextmanager
def stops_the_run(where: str) -> Iterator[None]:
    """A server that died (or was aborted) during ``where`` ends the run without a verdict:
    its :class:`InfraError` goes on up, naming the arm and pass."""
    try:
        yield
    except InfraError as exc:
        raise InfraError(f"run stopped in {where}, no cert written: {exc}") from None


@dataclass(frozen=True)
class SerialArm:
    """One serial arm's answers, its retried requests' first attempts, and its timing."""

    responses: Mapping[str, RawResponse]
    first_attempts: Mapping[str, RawResponse]
    stats: ArmStats


def _serial_arm(
    arm: str,
    server: ServerHandle,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    sink: ProgressSink,
) -> SerialArm:
    name = "A'" if arm == ARM_A_REPEAT else arm
    sink.arm(name)
    t0 = time.monotonic()
    with stops_the_run(f"arm {name}"):
        run = run_serial(server.base_url, template, items, server.check_alive, _ticker(sink))
    stats = _arm_stats(arm, None, time.monotonic() - t0, run.responses)
    return SerialArm(run.responses, run.first_attempts, stats)


def _ticker(sink: ProgressSink) -> Callable[[RawResponse], None]:
    def tick(_: RawResponse) -> None:
        sink.advance(1)

    return tick


def run_reference(
    plan: CellPlan, launcher: ServerLauncher, scorer: Scorer, sink: ProgressSink
) -> Reference:
    """Arm A on a ``--parallel 1`` server, serial dispatch (ground truth)."""
    notes = Notes()
    with launcher.launch("A", 1, plan.ctx) as server_a:
        started = time.monotonic()
        chat_template = server_chat_template(server_a.base_url)
        template = request_template(plan).for_arm(ARM_A)
        arm_a = _serial_arm(ARM_A, server_a, template, plan.items, sink)
        record = _server_record("A", server_a, time.monotonic() - started)
    trials = trials_for(
        arm_a.responses, plan.items, scorer, plan.n_predict, notes, ARM_A, arm_a.first_attempts
    )
    return Reference(
        arm_a.responses,
        trials,
        arm_a.stats,
        record,
        tuple(notes.items),
        chat_template=chat_template,
        first_attempts=arm_a.first_attempts,
    )


def run_repeat(
    plan: CellPlan, launcher: ServerLauncher, sink: ProgressSink, ref: Reference, reason: str
) -> Reference:
    """The serial repeat A' on a fresh ``--parallel 1`` server (see
    :func:`~batch_invariance.core.schedule.serial_repeat_decision` for when)."""
    with launcher.launch("A", 1, plan.ctx) as server_a:
        started = time.monotonic()
        control = request_template(plan).for_arm(ARM_A_REPEAT)
        repeat = _serial_arm(ARM_A_REPEAT, server_a, control, plan.items, sink)
        record = _server_record("A", server_a, time.monotonic() - started)
    return replace(
        ref,
        repeat=repeat.responses,
        repeat_stats=repeat.stats,
        repeat_server=record,
        repeat_reason=reason,
        repeat_first_attempts=repeat.first_attempts,
    )


def run_parallel(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    sink: ProgressSink,
    a_trials: Mapping[str, Trial],
    policy: GatePolicy,
) -> ParallelRun:
    """The C passes, then arm B (serial), on the ``--parallel N`` server.

    With ``plan.stop_on_red`` the passes end at the first that proves RED. When AC diverged,
    B runs on the divergent ids first, and on the rest only when it differs from A on one of
    them (:mod:`batch_invariance.core.schedule`); a clean AC gets B on every id."""
    template = request_template(plan).for_arm(ARM_C)
    b_template = template.for_arm(ARM_B)
    notes = Notes()
    b_stats: list[ArmStats] = []
    b_resp: dict[str, RawResponse] = {}
    scope: BScope | None = None
    with launcher.launch("BC", plan.parallel, plan.ctx) as server_bc:
        started = time.monotonic()
        passes, c_stats, proof = _c_passes(
            plan, server_bc, template, scorer, sink, a_trials, policy, notes
        )

        def serial_b(items: Sequence[WorkItem]) -> dict[str, Trial]:
            """Run B on ``items``; their trials (each B trial is scored once)."""
            arm_b = _serial_arm(ARM_B, server_bc, b_template, items, sink)
            b_resp.update(arm_b.responses)
            b_stats.append(arm_b.stats)
            return trials_for(
                arm_b.responses, items, scorer, plan.n_predict, notes, ARM_B, arm_b.first_attempts
            )

        first_ids = b_first_ids(a_trials, passes)
        if first_ids is None:
            b_trials = serial_b(plan.items)
        else:
            wanted = set(first_ids)
            b_trials = serial_b([i for i in plan.items if i.test_id in wanted])
            scope = b_scope_after(a_trials, b_trials, first_ids)
            rest = [i for i in plan.items if i.test_id not in wanted]
            if scope.complete:
                both = b_trials | serial_b(rest)
                # Back in work-set order, as every other arm.
                b_trials = {i.test_id: both[i.test_id] for i in plan.items}
            else:
                sink.extend(-len(rest))
        record = _server_record("BC", server_bc, time.monotonic() - started)
    b_ids = None if scope is None else scope.b_ids
    return ParallelRun(
        b_resp,
        b_trials,
        tuple(passes),
        (_merged_b_stats(b_stats), *c_stats),
        record,
        tuple(notes.items),
        proof,
        b_ids=b_ids,
        b_reason="B ran on every id: AC was clean" if scope is None else scope.reason,
    )


def _merged_b_stats(parts: Sequence[ArmStats]) -> ArmStats:
    """One :class:`ArmStats` for arm B when it ran in two stretches (the divergent ids, then
    the rest)."""
    first, *rest = parts
    for more in rest:
        first = replace(
            first,
            wall_s=first.wall_s + more.wall_s,
            n_requests=first.n_requests + more.n_requests,
            n_transport_failures=first.n_transport_failures + more.n_transport_failures,
            prompt_ms=first.prompt_ms + more.prompt_ms,
            predicted_ms=first.predicted_ms + more.predicted_ms,
            predicted_n=first.predicted_n + more.predicted_n,
        )
    return first


def _c_passes(
    plan: CellPlan,
    server_bc: ServerHandle,
    template: RequestTemplate,
    scorer: Scorer,
    sink: ProgressSink,
    a_trials: Mapping[str, Trial],
    policy: GatePolicy,
    notes: Notes,
) -> tuple[list[PassRecord], list[ArmStats], RedProof | None]:
    """The C passes, ending at the first that proves RED when ``plan.stop_on_red``."""
    stats: list[ArmStats] = []
    passes: list[PassRecord] = []
    for index in range(plan.gate_passes):
        sink.arm(ARM_C, index, plan.gate_passes)
        with stops_the_run(f"arm C pass {index + 1}/{plan.gate_passes}"):
            result = _c_pass(plan, server_bc, template, index, sink)
        stats.append(
            replace(
                _arm_stats(ARM_C, index, result.wall_s, result.responses),
                server_busy_max=result.server_busy_max,
                busy_source=result.busy_source,
                counter_deltas=result.counter_deltas or None,
            )
        )
        for note in slot_notes(result):
            notes.add(note)
        label = f"C{index}"
        trials = trials_for(result.responses, plan.items, scorer, plan.n_predict, notes, label)
        passes.append(_pass_record(result, trials))
        if plan.stop_on_red:
            found = red_proof(a_trials, passes[-1], policy)
            if found.proven:
                sink.extend(-len(plan.items) * (plan.gate_passes - index - 1))
                return passes, stats, found
    return passes, stats, None


def _c_pass(
    plan: CellPlan,
    server_bc: ServerHandle,
    template: RequestTemplate,
    index: int,
    sink: ProgressSink,
) -> ConcurrentPass:
    return run_concurrent_pass(
        server_bc.base_url,
        template,
        plan.items,
        workers=plan.parallel,
        pass_index=index,
        seed=plan.seed,
        metrics_enabled=server_bc.metrics_enabled,
        check_alive=server_bc.check_alive,
        on_done=_ticker(sink),
        # An engine's handle names its own busy witnesses (possibly none: F1 then
        # fails closed); without the attribute, llama-server's /slots and /metrics.
        probes=getattr(server_bc, "busy_probes", None),
        # Counters read around each pass (vLLM's iteration-tokens histogram): recorded
        # as corroboration in the arm stats, never read by F1.
        counters=getattr(server_bc, "pass_counters", ()),
    )


def _pass_record(result: ConcurrentPass, trials: Mapping[str, Trial]) -> PassRecord:
    return PassRecord(
        index=result.index,
        trials=trials,
        server_busy_max=result.server_busy_max,
        busy_source=result.busy_source,
        order=result.order,
    )


def complete_reference(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    sink: ProgressSink,
    ref: Reference,
    parallel: ParallelRun,
) -> Reference:
    """``ref`` with A' run when it decides something (once; a sweep reuses it)."""
    if ref.repeat is not None:
        return ref
    if not plan.serial_repeat:
        return replace(ref, repeat_reason="A' not run: --no-serial-repeat")
    decision = serial_repeat_decision(ref.a_trials, parallel.b_trials, b_ids=parallel.b_ids)
    if not decision.run:
        return replace(ref, repeat_reason=decision.reason)
    sink.extend(len(plan.items))
    return run_repeat(plan, launcher, sink, ref, decision.reason)


def schedule_record(
    plan: CellPlan, ref: Reference, parallel: ParallelRun, shared_reference: str | None
) -> dict[str, Any]:
    """``provenance.schedule``: which arms ran and why, and whether passes were cut short."""
    proof = parallel.red_proof
    return {
        "arms_run": [ARM_A, *([ARM_A_REPEAT] if ref.repeat is not None else []), ARM_B, ARM_C],
        "serial_repeat": ref.repeat_reason,
        "reference_shared": shared_reference,
        "passes_planned": plan.gate_passes,
        "passes_run": len(parallel.c_passes),
        "stop_on_red": plan.stop_on_red,
        "stopped_early": proof is not None and len(parallel.c_passes) < plan.gate_passes,
        "stop_reason": None if proof is None else proof.reason,
        "b_ids": None if parallel.b_ids is None else list(parallel.b_ids),
        "b_reason": parallel.b_reason,
    }


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
