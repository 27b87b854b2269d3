"""The length ladder: the default work-set of a cell, filling its whole slot.

A cert speaks for the sequence lengths it measured (:mod:`batch_invariance.core.scope`), so
the work-set every default runs (``run-live`` and ``sweep`` without ``--workset``, ``demo``,
the Action) is built for the cell: :data:`LADDER_PROMPTS` distinct prompts whose sequences
(prompt + answer budget) climb through every quarter band of the slot, the top band reaching
past 3/4 of it. The text is real: documents of prose, news items and code from the spark
profile's hermetic corpus, each prompt its own seeded stream, so no two prompts are one.

The prompts are fitted with a token counter: the A server's own ``/tokenize`` where the tool
launches a llama-server (the calibration path profiles use), else the offline estimate. The
cert records the lengths the server really counted, so a fit that misses only moves where a
prompt lands; the scope rule judges what was measured.

On a unified KV pool (``ctx * N`` tokens any slot may fill) the ladder adds
:data:`POOL_RUNGS` longer prompts whose sequences climb from past 3/4 of the POOL to as far as
a short companion still fits beside them (:func:`pool_rung_targets`): the passes co-batch each
with a companion and never ask the server for more KV than the pool holds
(:mod:`batch_invariance.core.kv_budget`).

Deterministic: the same ctx, answer budget, seed and counter give byte-identical items.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from batch_invariance.core.kv_budget import KV_FRAME_ALLOWANCE
from batch_invariance.core.plan import WorkItem, normalise_whitespace
from batch_invariance.core.scope import N_BANDS, band_edges, required_length
from batch_invariance.errors import UsageError
from batch_invariance.profiles.spark.calibrate import (
    TOLERANCE,
    Fitted,
    NoFit,
    PromptParts,
    TokenCounter,
    assemble,
    fit_prompt,
)
from batch_invariance.profiles.spark.haystack import haystack_blocks
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import Workset, workset_from_items

__all__ = [
    "LADDER",
    "LADDER_PROMPTS",
    "POOL_RUNGS",
    "LadderPlan",
    "build_ladder",
    "ladder_builder",
    "ladder_plan",
    "pool_ladder_problem",
    "pool_rung_targets",
    "smallest_ladder_ctx",
]

#: The name the defaults use for the ladder where a work-set name is asked for.
LADDER = "ladder"
#: Distinct prompts: above the 30 the per-prompt bound needs, eight per quarter band.
LADDER_PROMPTS = 32
#: Haystack tokens every prompt carries at least (two prompts are never the bare frame).
MIN_HAYSTACK = 16
#: Tokens kept free at the top of the slot for BOS and a chat template's frame.
FRAME_ALLOWANCE = 8
#: Tokens a short prompt may land from its target (a real tokenizer moves in steps of
#: several tokens: 3% of a 60-token target is less than one step).
FIT_TOLERANCE = 6.0
#: The top sequence target, as a share of the slot (the fit may land 3% above a target).
TOP_FILL = 0.95
#: Prompts a unified pool's ladder adds past 3/4 of the pool, each with its own companion.
POOL_RUNGS = 4

INTRO = (
    "Read the document below. It mixes stories, news items and code. Then write a short "
    "summary of what it says."
)
QUESTION = "Summary of the document, in plain sentences:"


def _parts() -> PromptParts:
    return PromptParts(intro=INTRO, needles=(), depths=(), question=QUESTION)


@dataclass(frozen=True)
class LadderPlan:
    """The prompt-token targets of one ladder: where each sequence is meant to land."""

    ctx: int
    n_predict: int
    #: Tokens of the bare prompt frame (intro and question, no document), as counted.
    frame_tokens: int
    #: Per prompt: the target sequence length (prompt + answer budget) and prompt length.
    sequence_targets: tuple[int, ...]
    prompt_targets: tuple[int, ...]


def _top_sequence(ctx: int) -> int:
    return math.floor(TOP_FILL * ctx) - FRAME_ALLOWANCE


def smallest_ladder_ctx(frame_tokens: int, n_predict: int) -> int:
    """The smallest slot whose top sequence holds the bare frame, some document and the
    whole answer budget, and still reaches 3/4 of the slot."""
    ctx = 1
    while _top_sequence(ctx) - n_predict < frame_tokens + MIN_HAYSTACK or _top_sequence(
        ctx
    ) < required_length(ctx):
        ctx += 1
    return ctx


def ladder_plan(ctx: int, n_predict: int, frame_tokens: int) -> LadderPlan:
    """Eight sequence targets in each quarter band of the slot, evenly spaced inside it;
    a target below the shortest possible prompt plus the answer budget is raised to it
    (with a small answer budget every band is reached). UsageError when the slot cannot
    hold the ladder, naming the smallest ctx that can."""
    top = _top_sequence(ctx)
    floor = frame_tokens + MIN_HAYSTACK
    if top - n_predict < floor or top < required_length(ctx):
        smallest = smallest_ladder_ctx(frame_tokens, n_predict)
        raise UsageError(
            f"--ctx {ctx}: too small for the length ladder with --n-predict {n_predict} (a "
            f"prompt takes at least {floor} tokens and its sequence must reach 3/4 of the "
            f"slot); the smallest ctx it can fill is {smallest}: use --ctx {smallest} or "
            "more, lower --n-predict, or give a --workset"
        )
    per_band = LADDER_PROMPTS // N_BANDS
    sequences: list[int] = []
    edges = band_edges(ctx)
    for band, (low, high) in enumerate(edges):
        if band == len(edges) - 1:
            # The top band climbs from just past 3/4 of the slot to the top: an answer that
            # stops before its budget still leaves most of these sequences past 3/4.
            low, high = required_length(ctx), top
            spots = [low + (high - low) * (j + 1) / per_band for j in range(per_band)]
        else:
            spots = [low + (high - low) * (j + 0.5) / per_band for j in range(per_band)]
        sequences += [min(top, max(floor + n_predict, round(at))) for at in spots]
    prompts = tuple(s - n_predict for s in sequences)
    return LadderPlan(ctx, n_predict, frame_tokens, tuple(sequences), prompts)


def _kv_bound(sequence: int, n_predict: int) -> int:
    """The most KV cells a prompt fitted for ``sequence`` can hold: the fit may land
    :data:`TOLERANCE` (or :data:`FIT_TOLERANCE` tokens) above its prompt target."""
    slack = max(math.ceil(TOLERANCE * (sequence - n_predict)), math.ceil(FIT_TOLERANCE))
    return sequence + slack + KV_FRAME_ALLOWANCE


def _rungs(plan: LadderPlan, pool: int) -> tuple[int, ...] | str:
    """The rungs' sequence targets (:func:`pool_rung_targets`), or why there are none."""
    low = required_length(pool)
    companions = sorted(plan.sequence_targets)[:POOL_RUNGS]
    highs = []
    for companion in companions:
        room = pool - _kv_bound(companion, plan.n_predict)
        high = room  # the largest sequence whose bound fits the room
        while high > low and _kv_bound(high, plan.n_predict) > room:
            high -= 1
        highs.append(high)
    if len(companions) < POOL_RUNGS or highs[-1] <= low:
        bound = _kv_bound(companions[-1], plan.n_predict) if companions else 0
        return (
            f"the pool of {pool} tokens (--ctx {plan.ctx} x N {pool // plan.ctx}) cannot hold "
            f"sequences of 3/4 of it ({low} tokens) beside short co-batched companions (up to "
            f"{bound} tokens each with --n-predict {plan.n_predict}); lower --n-predict or "
            "raise --ctx"
        )
    top = highs[0]
    spots = [low + (top - low) * (POOL_RUNGS - j) / POOL_RUNGS for j in range(POOL_RUNGS)]
    return tuple(
        max(low + 1, min(high, math.floor(at))) for high, at in zip(highs, spots, strict=True)
    )


def pool_rung_targets(plan: LadderPlan, pool: int) -> tuple[int, ...]:
    """The sequence targets of the :data:`POOL_RUNGS` long prompts of a unified ``pool``,
    longest first: rung ``j`` fits beside the ``j``-th shortest ladder prompt (its
    companion), and the rungs climb evenly from past 3/4 of the pool to the top one. A
    UsageError when 3/4 of the pool and a companion cannot both be in flight."""
    rungs = _rungs(plan, pool)
    if isinstance(rungs, str):
        raise UsageError(f"--kv-layout unified: {rungs}")
    return rungs


def pool_ladder_problem(ctx: int, parallel: int, n_predict: int) -> str | None:
    """Why the length ladder cannot fill a unified pool of ``ctx * parallel`` tokens at
    ``n_predict`` (planned with the offline estimate, as a dry run plans it); ``None``: it
    can. The one line ``check-deploy --plan`` gives for a unified cell it leaves out."""
    frame = approx_token_count(assemble(_parts(), [], [0]))
    try:
        plan = ladder_plan(ctx, n_predict, frame)
    except UsageError as exc:  # a slot too small for the ladder itself
        return str(exc)
    rungs = _rungs(plan, ctx * parallel)
    return rungs if isinstance(rungs, str) else None


def _item_id(index: int, sequence: int) -> str:
    return f"ladder-{index:02d}-seq{sequence}"


#: Streams tried for one prompt before giving up on a distinct one.
_ATTEMPTS = 16


def _distinct_fit(
    parts: PromptParts, key: str, target: int, counter: TokenCounter, seen: set[str]
) -> Fitted | NoFit:
    """The fit of the first haystack stream for ``key`` whose prompt no earlier prompt of the
    ladder carries (whitespace aside): two short prompts can open with the same template, and
    a repeated prompt is no new sample."""
    fit: Fitted | NoFit = NoFit("no stream tried", 0)
    for attempt in range(_ATTEMPTS):
        stream = key if attempt == 0 else f"{key}|{attempt}"
        fit = fit_prompt(
            parts, haystack_blocks(stream), target, counter, min_tolerance=FIT_TOLERANCE
        )
        if not isinstance(fit, Fitted):
            return fit
        text = normalise_whitespace(fit.prompt)
        if text not in seen:
            seen.add(text)
            return fit
    return NoFit(f"no distinct prompt in {_ATTEMPTS} haystack streams", 0)


def build_ladder(
    ctx: int, n_predict: int, seed: int, counter: TokenCounter, pool: int | None = None
) -> list[WorkItem]:
    """The ladder's items for one slot, and the long rungs of a unified ``pool`` where one
    is given (see the module docstring)."""
    parts = _parts()
    frame = counter(assemble(parts, [], [0]))
    plan = ladder_plan(ctx, n_predict, frame)
    rungs = () if pool is None else pool_rung_targets(plan, pool)
    edges = band_edges(ctx)
    items: list[WorkItem] = []
    seen: set[str] = set()
    sequences = (*plan.sequence_targets, *rungs)
    for index, sequence in enumerate(sequences):
        target = sequence - n_predict
        fit = _distinct_fit(parts, f"ladder|{seed}|{index}", target, counter, seen)
        if not isinstance(fit, Fitted):
            raise UsageError(
                f"the length ladder could not fit prompt {index} to {target} tokens at --ctx "
                f"{ctx} ({fit.reason}); give a --workset"
            )
        band = next((k for k, (_, high) in enumerate(edges) if sequence <= high), None)
        items.append(
            WorkItem(
                test_id=_item_id(index, sequence),
                prompt=fit.prompt,
                messages=None,
                family="pool" if band is None else f"band{band + 1}",
                fill=round(sequence / ctx, 4),
                meta={
                    "ladder": True,
                    "ctx": ctx,
                    "seed": seed,
                    "n_predict": n_predict,
                    "sequence_target": sequence,
                    "target_tokens": target,
                    "calibrated_tokens": fit.tokens,
                    **({} if pool is None else {"pool": pool}),
                },
            )
        )
    return items


def ladder_builder(
    n_predict: int, seed: int, counted_by: str, parallel: int | None = None
) -> Callable[[int, TokenCounter], Workset]:
    """The work-set builder a job holds: ``(ctx, counter) -> Workset``, as a profile's;
    with ``parallel`` (a unified pool of ``ctx * parallel``), the pool's rungs as well."""

    def build(ctx: int, counter: TokenCounter) -> Workset:
        pool = None if parallel is None else ctx * parallel
        items = build_ladder(ctx, n_predict, seed, counter, pool)
        where = "" if pool is None else f", unified pool {pool}"
        return workset_from_items(
            items, f"length ladder (ctx {ctx}{where}, --n-predict {n_predict}, seed {seed}, "
            f"{len(items)} prompts, tokens counted by {counted_by})",
        )  # fmt: skip

    return build
