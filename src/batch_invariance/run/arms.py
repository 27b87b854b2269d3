"""The arms of a cell, one server at a time: the ``--parallel 1`` reference (arm A, and the
serial repeat A' when it decides something) and the ``--parallel N`` server (the C passes,
ending early once RED is proven with ``stop_on_red``, then arm B where it decides something).
:mod:`batch_invariance.run.cell` composes them into one cell, or into a sweep's cells sharing
one reference.

The servers come through the Protocols of :mod:`batch_invariance.run.records`; the C passes
are in :mod:`batch_invariance.run.passes`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from batch_invariance.cert.provenance import ScheduleRecord
from batch_invariance.core.chat_template import NO_FALLBACK, ChatFallback
from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    GatePolicy,
    PassRecord,
    Trial,
)
from batch_invariance.core.plan import CellPlan, WorkItem
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.schedule import (
    BScope,
    RedProof,
    b_opening,
    b_scope_after,
    serial_repeat_decision,
)
from batch_invariance.core.scoring import Scorer
from batch_invariance.run.passes import (
    arm_report,
    arm_stats,
    request_template,
    run_c_passes,
    server_record,
    stops_the_run,
    ticker,
)
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.records import ArmStats, ServerHandle, ServerLauncher, ServerRecord
from batch_invariance.run.transport import RequestTemplate, run_serial
from batch_invariance.run.trials import Notes, RawResponse, trials_for


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
    #: A''s trials, once it ran.
    repeat_trials: Mapping[str, Trial] | None = None
    repeat_stats: ArmStats | None = None
    repeat_server: ServerRecord | None = None
    #: Why A' ran or did not (recorded in the cert's ``provenance.schedule``).
    repeat_reason: str | None = None
    #: What the A server's ``/props`` said it applies to chat requests (``None``: unknown).
    chat_template: str | None = None
    #: The engine's built-in template for a model with none, and its name.
    chat_fallback: ChatFallback = NO_FALLBACK

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


@dataclass(frozen=True)
class _Scoring:
    """How a serial arm's answers are scored, where its notes go, and what it reports to."""

    scorer: Scorer
    n_predict: int
    notes: Notes
    sink: ProgressSink
    #: Arm A's trials, which every other arm's progress line compares against.
    a_trials: Mapping[str, Trial] | None = None


@dataclass(frozen=True)
class SerialArm:
    """One serial arm's answers and their trials, and its timing."""

    responses: Mapping[str, RawResponse]
    trials: dict[str, Trial]
    stats: ArmStats


def _serial_arm(
    arm: str,
    server: ServerHandle,
    template: RequestTemplate,
    items: Sequence[WorkItem],
    scoring: _Scoring,
) -> SerialArm:
    """Run ``arm`` serially on ``items`` and score it (each transient failure retried once;
    a dead server ends the run); tell the sink what it found."""
    name = "A'" if arm == ARM_A_REPEAT else arm
    sink = scoring.sink
    sink.arm(name)
    t0 = time.monotonic()
    with stops_the_run(f"arm {name}"):
        run = run_serial(server.base_url, template, items, server.check_alive, ticker(sink))
    stats = arm_stats(arm, None, time.monotonic() - t0, run.responses)
    trials = trials_for(run.responses, items, scoring.scorer, scoring.n_predict, scoring.notes,
                        arm, run.first_attempts)  # fmt: skip
    against = None if arm == ARM_A else scoring.a_trials
    sink.done(arm_report(trials, against, len(run.first_attempts)))
    return SerialArm(run.responses, trials, stats)


def run_reference(
    plan: CellPlan, launcher: ServerLauncher, scorer: Scorer, sink: ProgressSink
) -> Reference:
    """Arm A on a ``--parallel 1`` server, serial dispatch (ground truth)."""
    notes = Notes()
    with launcher.launch(ServerRole.A, 1, plan.serial_ctx) as server_a:
        started = time.monotonic()
        chat_template = server_a.chat_template()
        fallback = server_a.chat_fallback
        template = request_template(plan)
        scoring = _Scoring(scorer, plan.n_predict, notes, sink)
        arm_a = _serial_arm(ARM_A, server_a, template, plan.items, scoring)
        record = server_record(ServerRole.A, server_a, time.monotonic() - started)
    return Reference(
        arm_a.responses,
        arm_a.trials,
        arm_a.stats,
        record,
        tuple(notes.items),
        chat_template=chat_template,
        chat_fallback=fallback,
    )


def run_repeat(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    sink: ProgressSink,
    ref: Reference,
    reason: str,
) -> Reference:
    """The serial repeat A' on a fresh ``--parallel 1`` server (see
    :func:`~batch_invariance.core.schedule.serial_repeat_decision` for when)."""
    notes = Notes()
    with launcher.launch(ServerRole.A, 1, plan.serial_ctx) as server_a:
        started = time.monotonic()
        control = request_template(plan)
        scoring = _Scoring(scorer, plan.n_predict, notes, sink, ref.a_trials)
        repeat = _serial_arm(ARM_A_REPEAT, server_a, control, plan.items, scoring)
        record = server_record(ServerRole.A, server_a, time.monotonic() - started)
    return replace(
        ref,
        notes=(*ref.notes, *notes.items),
        repeat_trials=repeat.trials,
        repeat_stats=repeat.stats,
        repeat_server=record,
        repeat_reason=reason,
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
    template = request_template(plan)
    notes = Notes()
    b_stats: list[ArmStats] = []
    b_resp: dict[str, RawResponse] = {}
    scope: BScope | None = None
    with launcher.launch(ServerRole.BC, plan.parallel, plan.ctx) as server_bc:
        started = time.monotonic()
        c = run_c_passes(plan, server_bc, template, scorer, sink, a_trials, policy, notes)
        scoring = _Scoring(scorer, plan.n_predict, notes, sink, a_trials)

        def serial_b(items: Sequence[WorkItem]) -> dict[str, Trial]:
            """Run B on ``items``; their trials (each B trial is scored once)."""
            arm_b = _serial_arm(ARM_B, server_bc, template, items, scoring)
            b_resp.update(arm_b.responses)
            b_stats.append(arm_b.stats)
            return arm_b.trials

        item_ids = [i.test_id for i in plan.items]
        opening = b_opening(a_trials, c.passes, item_ids, sample=plan.b_sample, seed=plan.seed)
        first_ids = opening.first_ids
        if opening.sample is not None:
            wanted = set(opening.sample.b_ids or ())
            b_trials = serial_b([i for i in plan.items if i.test_id in wanted])
            sink.extend(-(len(plan.items) - len(wanted)))
            scope = opening.sample
        elif first_ids is None:
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
        record = server_record(ServerRole.BC, server_bc, time.monotonic() - started)
    b_ids = None if scope is None else scope.b_ids
    return ParallelRun(
        b_resp,
        b_trials,
        c.passes,
        (_merged_b_stats(b_stats), *c.stats),
        record,
        tuple(notes.items),
        c.red_proof,
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


def complete_reference(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    sink: ProgressSink,
    ref: Reference,
    parallel: ParallelRun,
) -> Reference:
    """``ref`` with A' run when it decides something (once; a sweep reuses it)."""
    if ref.repeat_trials is not None:
        return ref
    if not plan.serial_repeat:
        return replace(ref, repeat_reason="A' not run: --no-serial-repeat")
    decision = serial_repeat_decision(ref.a_trials, parallel.b_trials, b_ids=parallel.b_ids)
    if not decision.run:
        return replace(ref, repeat_reason=decision.reason)
    sink.extend(len(plan.items))
    return run_repeat(plan, launcher, scorer, sink, ref, decision.reason)


def schedule_record(
    plan: CellPlan, ref: Reference, parallel: ParallelRun, shared_reference: str | None
) -> ScheduleRecord:
    """``provenance.schedule``: which arms ran and why, and whether passes were cut short."""
    proof = parallel.red_proof
    repeat = (ARM_A_REPEAT,) if ref.repeat_trials is not None else ()
    return ScheduleRecord(
        arms_run=(ARM_A, *repeat, ARM_B, ARM_C),
        serial_repeat=ref.repeat_reason,
        reference_shared=shared_reference,
        passes_planned=plan.gate_passes,
        passes_run=len(parallel.c_passes),
        stop_on_red=plan.stop_on_red,
        stopped_early=proof is not None and len(parallel.c_passes) < plan.gate_passes,
        stop_reason=None if proof is None else proof.reason,
        b_ids=parallel.b_ids,
        b_reason=parallel.b_reason,
    )
