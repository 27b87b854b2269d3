"""Running one cell: arms A, B, the C passes and A' over a :class:`ServerLauncher`.

:func:`run_cell` owns exactly one server at a time. The A server (``--parallel 1``) runs arm A
serially; it is torn down before the B/C server (``--parallel N``) starts, which runs the T
concurrent C passes (ending at the first that proves RED when the plan says ``stop_on_red``)
and then arm B serially: on every id when AC is clean, else on the divergent ids alone unless
it differs from A on one of them (:func:`~batch_invariance.run.arms.run_parallel`). The serial
repeat A' runs last, on a fresh ``--parallel 1`` server, and only when B differed from A
(:mod:`batch_invariance.core.schedule`). A sweep calls the same pieces (:func:`run_reference`,
:func:`run_parallel`, :func:`complete_reference`, :func:`assemble`) with one reference shared
by every N.
Every request becomes a :class:`~batch_invariance.core.evidence.Trial` (transport failures too, as
failure modes), scored through :func:`batch_invariance.core.scoring.evaluate`. The result is a
:class:`CellRun` whose ``evidence`` the pure core judges.

:func:`~batch_invariance.service.finish.finish_cell` turns a :class:`CellRun` into a written
cert. ``run-mock``, ``run-live``, ``demo`` and the Action all go through these two functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.scoring import Scorer
from batch_invariance.errors import UsageError
from batch_invariance.run.arms import (
    ParallelRun,
    Reference,
    complete_reference,
    run_parallel,
    run_reference,
    schedule_record,
)
from batch_invariance.run.passes import CacheRun, request_template, run_cache_arm, slot_notes
from batch_invariance.run.progress import NullProgress, ProgressSink
from batch_invariance.run.records import CellRun, ServerLauncher
from batch_invariance.run.trials import Notes

#: Names other modules import from here (the launcher Protocols live in run.records).
__all__ = [
    "CellPlan",
    "CellRun",
    "assemble",
    "request_template",
    "run_cell",
    "run_cells",
    "slot_notes",
]


def assemble(
    plan: CellPlan,
    ref: Reference,
    parallel: ParallelRun,
    *,
    scorer: Scorer,
    source: Literal["live", "mock", "attached"],
    launches: int,
    wall_s: float,
    shared_reference: str | None = None,
    cache: CacheRun | None = None,
) -> CellRun:
    """The :class:`CellRun` of one cell from its reference and its parallel server's run
    (and the prompt-cache arm's, when it ran)."""
    notes = Notes()
    for note in (*ref.notes, *parallel.notes, *(cache.notes if cache else ())):
        notes.add(note)
    template = request_template(plan)
    evidence = CellEvidence(
        items=tuple(
            ItemMeta(i.test_id, i.family, i.fill, template.request_key(i)) for i in plan.items
        ),
        a=ref.a_trials,
        a_repeat=ref.repeat_trials,
        b=parallel.b_trials,
        c_passes=parallel.c_passes,
        b_ids=parallel.b_ids,
        cache_passes=None if cache is None else cache.passes,
        slot_ctx=plan.ctx,
    )
    stats = (ref.a_stats, *((ref.repeat_stats,) if ref.repeat_stats else ()), *parallel.stats,
             *(cache.stats if cache else ()))  # fmt: skip
    servers = (ref.server, parallel.server, *((ref.repeat_server,) if ref.repeat_server else ()),
               *((cache.server,) if cache else ()))  # fmt: skip
    return CellRun(
        plan=plan,
        evidence=evidence,
        arm_stats=stats,
        request_template=template.to_record(),
        servers=servers,
        launches=launches,
        scorer_id=str(getattr(scorer, "scorer_id", type(scorer).__name__)),
        wall_s=wall_s,
        source=source,
        notes=tuple(notes.items),
        schedule=schedule_record(plan, ref, parallel, shared_reference),
        server_chat_template=ref.chat_template,
        chat_fallback=ref.chat_fallback,
    )


def run_cells(
    plans: Sequence[CellPlan],
    runner: ServerLauncher,
    scorer: Scorer,
    policy: GatePolicy,
    sink: ProgressSink,
    finish: Callable[[CellRun], None],
) -> None:
    """Measure arm A once (``plans`` differ only in N), then each N on its own server, handing
    every :class:`CellRun` to ``finish`` as soon as it is measured. With more than one plan
    (a sweep) each cell's provenance says the reference is shared."""
    first = plans[0]
    sink.begin(len(first.items) * (1 + sum(1 + p.gate_passes + p.cache_passes for p in plans)))
    if len(plans) > 1:
        sink.scope(f"reference (ctx {first.ctx})")
    t0 = time.monotonic()
    ref = run_reference(first, runner, scorer, sink)
    reference_wall_s = time.monotonic() - t0
    parallels = [p.parallel for p in plans]
    for k, plan in enumerate(plans, 1):
        started = time.monotonic()
        if len(plans) > 1:
            sink.scope(f"cell {k} of {len(plans)} (N={plan.parallel})")
        par = run_parallel(plan, runner, scorer, sink, ref.a_trials, policy)
        ref = complete_reference(plan, runner, scorer, sink, ref, par)
        cache = (
            run_cache_arm(plan, runner, scorer, sink, ref.a_trials) if plan.cache_passes else None
        )
        shared = _shared_text(plan.ctx, ref.repeat_trials is not None, parallels)
        finish(
            assemble(
                plan,
                ref,
                par,
                scorer=scorer,
                source=runner.source,
                launches=ref.launches + 1 + (cache is not None),
                wall_s=time.monotonic() - started + reference_wall_s,
                shared_reference=shared if len(plans) > 1 else None,
                cache=cache,
            )
        )


def _shared_text(ctx: int, with_repeat: bool, parallels: Sequence[int]) -> str:
    arms = "A and A'" if with_repeat else "A"
    ns = ", ".join(str(n) for n in parallels)
    return (
        f"sweep: arm {arms} ran once for ctx {ctx} on --parallel 1 server(s) and are shared "
        f"by the cells N={ns}; this cell's --parallel N server ran B and its C passes"
    )


def run_cell(
    plan: CellPlan,
    launcher: ServerLauncher,
    scorer: Scorer,
    progress: ProgressSink | None = None,
    policy: GatePolicy | None = None,
) -> CellRun:
    """Measure one cell: A, then the C passes and B, then A' where it decides something.

    Raises only for infrastructure failures (a launch that failed, a server that died or
    was aborted: :class:`~batch_invariance.errors.InfraError`, naming the arm and pass) and
    interrupts. Transport failures of single requests on a live server are recorded in the
    trials (a serial one after one retry), never raised. ``policy`` is what the early
    stop checks a pass's gates against (default: the gate policy's defaults).
    """
    problems = plan.problems()
    if problems:
        raise UsageError(problems[0])
    sink: ProgressSink = progress if progress is not None else NullProgress()
    runs: list[CellRun] = []
    try:
        run_cells([plan], launcher, scorer, policy or GatePolicy(), sink, runs.append)
    finally:
        sink.end()
    return runs[0]
