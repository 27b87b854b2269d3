"""The prompt-cache arm: the cell's requests sent the way a deployed client sends them (no
``cache_prompt`` field) to a ``--parallel N`` server with its prompt cache on (llama-server's
default ``--cache-ram``, or the value under test; vLLM with prefix caching), N at once.

It runs on its own server (``launcher.launch(ServerRole.CACHE, N, ctx)``), after the C passes and B,
so the cold arms never share a process with a warm cache. Each worker sends one
conversation's turns one after another (:func:`core.cache_shape.conversation_chains`), as a
client does, so a later turn goes out only once its earlier turn was answered; the server's
own per-response reuse count (``timings.cache_n``, or ``cached_tokens``) goes into each
trial and :mod:`batch_invariance.core.cache_arm` judges it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from batch_invariance.core.cache_shape import conversation_chains
from batch_invariance.core.evidence import ARM_CACHE, PassRecord, Trial
from batch_invariance.core.plan import CellPlan
from batch_invariance.core.roles import ServerRole
from batch_invariance.core.scoring import Scorer
from batch_invariance.run.arms import request_template, server_record
from batch_invariance.run.passes import PassSeries, Scored, run_passes
from batch_invariance.run.progress import ProgressSink
from batch_invariance.run.protocols import ServerLauncher
from batch_invariance.run.records import ArmStats, ServerRecord
from batch_invariance.run.trials import Notes

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
