"""The prompt-cache arm: the cell's requests sent the way a deployed client sends them (no
``cache_prompt`` field) to a ``--parallel N`` server with its prompt cache on (llama-server's
default ``--cache-ram``, or the value under test; vLLM with prefix caching), N at once.

It runs on its own server (``launcher.launch("cache", N, ctx)``), after the C passes and B,
so the cold arms never share a process with a warm cache. Each worker sends one
conversation's turns one after another (:func:`core.cache_shape.conversation_chains`), as a
client does, so a later turn goes out only once its earlier turn was answered; the server's
own per-response reuse count (``timings.cache_n``, or ``cached_tokens``) goes into each
trial and :mod:`batch_invariance.core.cache_arm` judges it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from batch_invariance.core.cache_shape import conversation_chains
from batch_invariance.core.diff import compare
from batch_invariance.core.evidence import ARM_CACHE, PassRecord, Trial
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.scoring import Scorer
from batch_invariance.run.arms import request_template, server_record
from batch_invariance.run.dispatch import run_concurrent_pass
from batch_invariance.run.passes import arm_stats, stops_the_run, ticker
from batch_invariance.run.progress import ArmReport, ProgressSink
from batch_invariance.run.protocols import ServerLauncher
from batch_invariance.run.records import ArmStats, ServerRecord
from batch_invariance.run.trials import Notes, trials_for

__all__ = ["CacheRun", "run_cache_arm"]

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
    """The prompt-cache arm's passes on a fresh ``--parallel N`` server with the cache on."""
    template = request_template(plan).as_deployed()
    chains = conversation_chains(plan.items)
    notes = Notes()
    passes: list[PassRecord] = []
    stats: list[ArmStats] = []
    with launcher.launch("cache", plan.parallel, plan.ctx) as server:
        started = time.monotonic()
        for index in range(plan.cache_passes):
            sink.arm(ARM_CACHE, index, plan.cache_passes)
            with stops_the_run(f"the prompt-cache arm, pass {index + 1}/{plan.cache_passes}"):
                result = run_concurrent_pass(
                    server.base_url, template, plan.items, workers=plan.parallel,
                    pass_index=index, seed=plan.seed, probes=server.busy_probes,
                    check_alive=server.check_alive, on_done=ticker(sink), chains=chains,
                )  # fmt: skip
            stats.append(
                replace(
                    arm_stats(ARM_CACHE, index, result.wall_s, result.responses),
                    server_busy_max=result.server_busy_max,
                    busy_source=result.busy_source,
                )
            )
            own = Notes()
            trials = trials_for(result.responses, plan.items, scorer, plan.n_predict, own,
                                f"cache{index}")  # fmt: skip
            for note in own.items:
                if _REUSE_NOTE not in note:
                    notes.add(note)
            measured = PassRecord(
                index, trials, result.server_busy_max, result.busy_source, result.order
            )
            passes.append(measured)
            differ = compare("A_cache", a_trials, [(index, trials)]).divergent_ids
            failed = sum(1 for t in trials.values() if t.is_transport_failure)
            sink.done(ArmReport(len(trials), failed, 0, len(differ), len(a_trials)))
        record = server_record("cache", server, time.monotonic() - started)
    reused = sum(1 for p in passes for t in p.trials.values() if t.timings.get("cache_n"))
    total = sum(len(p.trials) for p in passes)
    notes.add(f"prompt-cache arm: the server reported reused prompt tokens on {reused} of "
              f"{total} request(s)")  # fmt: skip
    return CacheRun(tuple(passes), tuple(stats), record, tuple(notes.items))
