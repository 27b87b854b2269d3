"""The concurrent C passes on the ``--parallel N`` server, ending at the first that proves
RED when the plan says ``stop_on_red``; and what every arm shares with them: the per-arm
timing record, the progress ticker and report, and the rule that a server which died ends
the run (:func:`stops_the_run`).

The prompt-cache arm: the cell's requests sent the way a deployed client sends them (no
``cache_prompt`` field) to a ``--parallel N`` server with its prompt cache on (llama-server's
default ``--cache-ram``, or the value under test; vLLM with prefix caching), N at once.

It runs on its own server (``launcher.launch(ServerRole.CACHE, N, ctx)``), after the C passes and B,
so the cold arms never share a process with a warm cache. Each worker sends one
conversation's turns one after another (:func:`core.cache_arm.conversation_chains`), as a
client does, so a later turn goes out only once its earlier turn was answered; the server's
own per-response reuse count (``timings.cache_n``, or ``cached_tokens``) goes into each
trial and :mod:`batch_invariance.core.cache_arm` judges it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from batch_invariance.core.cache_arm import conversation_chains
from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import ARM_C, ARM_CACHE, GatePolicy, PassRecord, Trial
from batch_invariance.core.kv_budget import kv_costs
from batch_invariance.core.numerics import compare_pair
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.schedule import RedProof, red_proof, restrict
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import InfraError
from batch_invariance.run.dispatch import (
    BUSY_READ_TIMEOUT_S,
    ConcurrentPass,
    run_concurrent_pass,
)
from batch_invariance.run.kv_gate import KvPool
from batch_invariance.run.progress import ArmReport, ProgressSink
from batch_invariance.run.records import ArmStats, ServerHandle, ServerLauncher, ServerRecord
from batch_invariance.run.transport import RequestTemplate
from batch_invariance.run.trials import Notes, RawResponse, trials_for

__all__ = [
    "CPasses",
    "CacheRun",
    "PassSeries",
    "Scored",
    "arm_report",
    "arm_stats",
    "run_c_passes",
    "run_cache_arm",
    "run_passes",
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


def request_template(plan: CellPlan) -> RequestTemplate:
    """The request every arm sends for ``plan``."""
    return RequestTemplate(
        endpoint=plan.endpoint,
        n_predict=plan.n_predict,
        seed=plan.seed,
        n_probs=plan.n_probs,
        timeout_s=plan.req_timeout,
    )


def server_record(role: ServerRole, handle: ServerHandle, wall_s: float) -> ServerRecord:
    return ServerRecord(
        role=role.value,  # recorded as the role's string
        label=handle.label,
        argv=tuple(handle.argv),
        kv_label=handle.kv_label,
        metrics_enabled=handle.metrics_enabled,
        info=dict(handle.info()),
        wall_s=wall_s,
    )


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


@dataclass(frozen=True)
class PassSeries:
    """One arm's concurrent passes on one server, as :func:`run_passes` runs them: the C
    passes (:func:`run_c_passes`) and the prompt-cache arm's
    (:func:`batch_invariance.run.passes.run_cache_arm`)."""

    #: The arm (progress, per-pass timings) and how its passes are named.
    arm: str
    count: int
    #: Where a dead server ended the run, given the pass's 1-based number and the count.
    where: str
    #: Its trials' label prefix (``C0``, ``cache0``) and the pair it is compared as.
    label: str
    pair: str
    template: RequestTemplate
    #: The conversations each worker sends turn by turn (the prompt-cache arm), else none.
    chains: Sequence[Sequence[str]] | None = None
    #: The C passes: read the pass counters, note the slots, report differences so far.
    c_passes: bool = False
    #: Per-response notes containing this are expected here, not news (dropped).
    quiet: str | None = None
    #: End at the first pass that proves RED under this policy (``--stop-on-red``).
    stop_on_red: GatePolicy | None = None


@dataclass(frozen=True)
class Scored:
    """What a series' passes are scored with and reported to."""

    plan: CellPlan
    scorer: Scorer
    sink: ProgressSink
    a_trials: Mapping[str, Trial]
    notes: Notes


def run_passes(series: PassSeries, server: ServerHandle, scored: Scored) -> CPasses:
    """``series``' passes on ``server``, each scored and compared with A as it ends."""
    plan, sink = scored.plan, scored.sink
    stats: list[ArmStats] = []
    passes: list[PassRecord] = []
    differ: set[str] = set()
    drift: set[str] = set()
    for index in range(series.count):
        sink.arm(series.arm, index, series.count)
        with stops_the_run(series.where.format(n=index + 1, of=series.count)):
            result = run_concurrent_pass(
                server, series.template, plan.items, plan.parallel, index, plan.seed,
                ticker(sink), read_counters=series.c_passes, chains=series.chains,
                pool=kv_pool(plan),
            )  # fmt: skip
        stats.append(_pass_stats(series.arm, result))
        for note in slot_notes(result) if series.c_passes else ():
            scored.notes.add(note)
        own = Notes()
        trials = trials_for(result.responses, plan.items, scored.scorer, plan.n_predict, own,
                            f"{series.label}{index}")  # fmt: skip
        for note in own.items:
            if series.quiet is None or series.quiet not in note:
                scored.notes.add(note)
        passes.append(_pass_record(result, trials))
        found = compare(series.pair, scored.a_trials, [(index, trials)]).divergent_ids
        differ = differ | set(found) if series.c_passes else set(found)
        if series.c_passes:
            drift |= set(compare_pair(series.pair, scored.a_trials, [(index, trials)]).drift_ids)
        failed = sum(1 for t in trials.values() if t.is_transport_failure)
        sink.done(ArmReport(len(trials), failed, 0, len(differ), len(scored.a_trials),
                            so_far=series.c_passes, drift=len(drift)))  # fmt: skip
        if series.stop_on_red is not None:
            proof = red_proof(scored.a_trials, passes[-1], series.stop_on_red)
            if proof.proven:
                sink.extend(-len(plan.items) * (series.count - index - 1))
                return CPasses(tuple(passes), tuple(stats), proof)
    return CPasses(tuple(passes), tuple(stats), None)


def kv_pool(plan: CellPlan) -> KvPool | None:
    """The unified pool the plan's passes stay within (``None``: a split cache)."""
    if plan.kv_pool is None:
        return None
    costs = kv_costs(plan.items, plan.n_predict, plan.kv_pool, plan.parallel)
    return KvPool(plan.kv_pool, plan.parallel, costs)


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
    """The C passes, ending at the first that proves RED when ``plan.stop_on_red``. The
    handle names its engine's busy witnesses (possibly none: F1 then fails closed) and the
    counters read around each pass (vLLM's iteration-tokens histogram: corroboration in the
    arm stats, never read by F1)."""
    series = PassSeries(
        ARM_C, plan.gate_passes, "arm C pass {n}/{of}", "C", "AC", template, c_passes=True,
        stop_on_red=policy if plan.stop_on_red else None,
    )  # fmt: skip
    return run_passes(series, server_bc, Scored(plan, scorer, sink, a_trials, notes))


def _pass_stats(arm: str, result: ConcurrentPass) -> ArmStats:
    return replace(
        arm_stats(arm, result.index, result.wall_s, result.responses),
        server_busy_max=result.server_busy_max,
        busy_source=result.busy_source,
        counter_deltas=result.counter_deltas or None,
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
    busy = result.busy
    if busy.n_samples == 0:
        notes.append(f"C{result.index}: the busy-slot sampler took no samples")
    elif busy.n_answered < busy.n_samples:
        notes.append(
            f"C{result.index}: the server answered {busy.n_answered} of {busy.n_samples} "
            f"busy reads (the rest failed or took over {BUSY_READ_TIMEOUT_S:g} s)"
        )
    return tuple(notes)


#: Per-response "server reused N cached prompt tokens" notes are expected here, not news.
_REUSE_NOTE = "cached prompt tokens (cache_n != 0)"


@dataclass(frozen=True)
class CacheRun:
    """What the prompt-cache arm's server measured."""

    passes: tuple[PassRecord, ...]
    stats: tuple[ArmStats, ...]
    server: ServerRecord
    notes: tuple[str, ...]


def run_cache_arm(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    sink: ProgressSink,
    a_trials: Mapping[str, Trial],
) -> CacheRun:
    """The prompt-cache arm's passes on a fresh ``--parallel N`` server with the cache on:
    the C passes' loop (:func:`~batch_invariance.run.passes.run_passes`), each worker sending
    one conversation's turns in order, no pass counters, never stopped early."""
    series = PassSeries(
        ARM_CACHE, plan.cache_passes, "the prompt-cache arm, pass {n}/{of}", "cache",
        "A_cache", request_template(plan).as_deployed(), conversation_chains(plan.items),
        quiet=_REUSE_NOTE,
    )  # fmt: skip
    notes = Notes()
    with launcher.launch(ServerRole.CACHE, plan.parallel, plan.ctx) as server:
        started = time.monotonic()
        run = run_passes(series, server, Scored(plan, scorer, sink, a_trials, notes))
        record = server_record(ServerRole.CACHE, server, time.monotonic() - started)
    reused = sum(1 for p in run.passes for t in p.trials.values() if reused_tokens(t))
    total = sum(len(p.trials) for p in run.passes)
    notes.add(f"prompt-cache arm: the server reported reused prompt tokens on {reused} of "
              f"{total} request(s)")  # fmt: skip
    return CacheRun(run.passes, run.stats, record, tuple(notes.items))


def reused_tokens(trial: Trial) -> float | None:
    """The prompt tokens the server says it reused for ``trial`` (``None``: it did not say):
    the trial's ``cache_n``, which the response reader fills from every engine's own field
    (llama-server's ``timings.cache_n``, the OpenAI ``cached_tokens``)."""
    return trial.timings.get("cache_n")
