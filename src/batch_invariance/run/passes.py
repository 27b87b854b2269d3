"""The concurrent C passes on the ``--parallel N`` server, ending at the first that proves
RED when the plan says ``stop_on_red``; and what every arm shares with them: the per-arm
timing record, the progress ticker and report, and the rule that a server which died ends
the run (:func:`stops_the_run`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import ARM_C, GatePolicy, PassRecord, Trial
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.schedule import RedProof, red_proof, restrict
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import InfraError
from batch_invariance.run.dispatch import ConcurrentPass, run_concurrent_pass
from batch_invariance.run.progress import ArmReport, ProgressSink
from batch_invariance.run.protocols import ServerHandle
from batch_invariance.run.records import ArmStats
from batch_invariance.run.response import RawResponse
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.trials import Notes, trials_for

__all__ = [
    "CPasses",
    "arm_report",
    "arm_stats",
    "run_c_passes",
    "slot_notes",
    "stops_the_run",
    "ticker",
]


@contextlib.contextmanager
def stops_the_run(where: str) -> Iterator[None]:
    """A server that died (or was aborted) during ``where`` ends the run without a verdict:
    its :class:`InfraError` goes on up, naming the arm and pass."""
    try:
        yield
    except InfraError as exc:
        raise InfraError(f"run stopped in {where}, no cert written: {exc}") from None


def ticker(sink: ProgressSink) -> Callable[[RawResponse], None]:
    """Advance ``sink`` by one per answered request."""

    def tick(_: RawResponse) -> None:
        sink.advance(1)

    return tick


def arm_stats(
    arm: str, pass_index: int | None, wall_s: float, responses: Mapping[str, RawResponse]
) -> ArmStats:
    """Wall time and the server's own timings of one arm (or pass), summed over requests."""
    timings = [r.timings or {} for r in responses.values()]
    return ArmStats(
        arm=arm,
        pass_index=pass_index,
        wall_s=wall_s,
        n_requests=len(responses),
        n_transport_failures=sum(1 for r in responses.values() if not r.ok),
        prompt_ms=sum(t.get("prompt_ms", 0.0) for t in timings),
        predicted_ms=sum(t.get("predicted_ms", 0.0) for t in timings),
        predicted_n=sum(int(t.get("predicted_n", 0)) for t in timings),
    )


def arm_report(
    trials: Mapping[str, Trial], a_trials: Mapping[str, Trial] | None, n_retried: int = 0
) -> ArmReport:
    """The progress line's facts for a serial arm: failures, retries, and (except for A
    itself) how many of its ids differ from A."""
    failed = sum(1 for t in trials.values() if t.is_transport_failure)
    if a_trials is None:
        return ArmReport(len(trials), failed, n_retried)
    differ = compare("AB", restrict(a_trials, tuple(trials)), [(None, trials)]).divergent_ids
    return ArmReport(len(trials), failed, n_retried, len(differ), len(trials))


@dataclass(frozen=True)
class CPasses:
    """The C passes run: their records and timings, and the RED proof that ended them early."""

    passes: tuple[PassRecord, ...]
    stats: tuple[ArmStats, ...]
    red_proof: RedProof | None


def run_c_passes(
    plan: CellPlan,
    server_bc: ServerHandle,
    template: RequestTemplate,
    scorer: Scorer,
    sink: ProgressSink,
    a_trials: Mapping[str, Trial],
    policy: GatePolicy,
    notes: Notes,
) -> CPasses:
    """The C passes, ending at the first that proves RED when ``plan.stop_on_red``."""
    stats: list[ArmStats] = []
    passes: list[PassRecord] = []
    differ: set[str] = set()
    for index in range(plan.gate_passes):
        sink.arm(ARM_C, index, plan.gate_passes)
        with stops_the_run(f"arm C pass {index + 1}/{plan.gate_passes}"):
            result = _c_pass(plan, server_bc, template, index, sink)
        stats.append(
            replace(
                arm_stats(ARM_C, index, result.wall_s, result.responses),
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
        differ.update(compare("AC", a_trials, [(index, trials)]).divergent_ids)
        failed = sum(1 for t in trials.values() if t.is_transport_failure)
        sink.done(ArmReport(len(trials), failed, 0, len(differ), len(a_trials), so_far=True))
        if plan.stop_on_red:
            found = red_proof(a_trials, passes[-1], policy)
            if found.proven:
                sink.extend(-len(plan.items) * (plan.gate_passes - index - 1))
                return CPasses(tuple(passes), tuple(stats), found)
    return CPasses(tuple(passes), tuple(stats), None)


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
        check_alive=server_bc.check_alive,
        on_done=ticker(sink),
        # The handle names its engine's busy witnesses (possibly none: F1 then fails closed).
        probes=server_bc.busy_probes,
        # Counters read around each pass (vLLM's iteration-tokens histogram): recorded
        # as corroboration in the arm stats, never read by F1.
        counters=server_bc.pass_counters,
    )


def _pass_record(result: ConcurrentPass, trials: Mapping[str, Trial]) -> PassRecord:
    return PassRecord(
        index=result.index,
        trials=trials,
        server_busy_max=result.server_busy_max,
        busy_source=result.busy_source,
        order=result.order,
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
