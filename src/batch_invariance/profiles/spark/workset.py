"""The spark work-set generator: ten agentic-coding task families at corner-specific fills.

``generate(ctx, corner, seed, token_counter)`` is the profile entry point (see
:mod:`batch_invariance.profiles`). It is deterministic: the same arguments and the same
counter give byte-identical items. Needles, questions and answers depend only on the seed,
the family and the fill index; the counter decides only how much haystack surrounds them, so
each prompt lands within 3% of ``fill x ctx`` tokens of the tokenizer that counts them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from batch_invariance.core.plan import WorkItem
from batch_invariance.errors import UsageError
from batch_invariance.profiles.spark.calibrate import (
    TOLERANCE,
    Fitted,
    PromptParts,
    TokenCounter,
    fit_prompt,
)
from batch_invariance.profiles.spark.families import FAMILIES
from batch_invariance.profiles.spark.haystack import haystack_blocks

#: Fill ratios (of ctx) per corner.
CORNERS: Mapping[str, tuple[float, ...]] = {
    "balanced": (0.10, 0.35, 0.60, 0.85),
    "short": (0.05, 0.15),
    "long": (0.75, 0.90, 0.97),
}

DEFAULT_CORNER = "balanced"

INTRO = (
    "Read the document below, then answer the question that follows it. The document mixes "
    "stories, news items and code; the question is about specific passages inside it."
)


def item_id(family: str, fill: float) -> str:
    """The stable test id of one (family, fill): ``A2-fill05`` for 5% of ctx."""
    return f"{family}-fill{round(fill * 100):02d}"


def generate(
    ctx: int,
    corner: str,
    seed: int,
    token_counter: TokenCounter,
    *,
    families: Iterable[str] | None = None,
    skipped: list[str] | None = None,
) -> list[WorkItem]:
    """The spark work-set for one ctx and corner.

    ``families`` restricts the families (default: all ten, in order). A (family, fill) whose
    needles and question alone exceed the target is left out and described in ``skipped``;
    when nothing fits, :class:`UsageError` says how large a ctx would be needed.
    """
    if ctx < 1:
        raise UsageError(f"--ctx must be a positive number of tokens (got {ctx})")
    if corner not in CORNERS:
        raise UsageError(f"--corner {corner!r}: expected one of {', '.join(CORNERS)}")
    chosen = list(FAMILIES) if families is None else list(families)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown or not chosen:
        raise UsageError(
            f"spark: unknown families {unknown or chosen}; known: {', '.join(FAMILIES)}"
        )
    items: list[WorkItem] = []
    notes: list[str] = []
    smallest: int | None = None
    for family in chosen:
        builder = FAMILIES[family]
        seen: set[str] = set()
        for index, fill in enumerate(CORNERS[corner]):
            rng = random.Random(f"spark|{seed}|{family}|{index}")
            task = builder(rng)
            while task.expected in seen:  # each fill of a family gets its own answer
                task = builder(rng)
            seen.add(task.expected)
            target = max(1, round(fill * ctx))
            parts = PromptParts(
                intro=INTRO, needles=task.needles, depths=task.depths, question=task.question
            )
            fit = fit_prompt(
                parts, haystack_blocks(f"{seed}|{family}|{index}"), target, token_counter
            )
            if not isinstance(fit, Fitted):
                notes.append(f"{item_id(family, fill)}: {fit.reason}")
                smallest = fit.min_tokens if smallest is None else min(smallest, fit.min_tokens)
                continue
            meta: dict[str, Any] = {
                "profile": "spark",
                "corner": corner,
                "ctx": ctx,
                "seed": seed,
                "target_tokens": target,
                "calibrated_tokens": fit.tokens,
                "needle_depths": list(task.depths),
            }
            meta.update(task.meta)
            items.append(
                WorkItem(
                    test_id=item_id(family, fill),
                    prompt=fit.prompt,
                    messages=None,
                    expected_answer=task.expected,
                    family=family,
                    fill=fill,
                    meta=meta,
                )
            )
    if skipped is not None:
        skipped.extend(notes)
    if not items:
        need = "" if smallest is None else f" (the smallest prompt needs {smallest} tokens)"
        raise UsageError(
            f"spark: --ctx {ctx} is too small for the {corner} corner: no family fits within "
            f"{TOLERANCE:.0%} of its target{need}; use a larger --ctx or --corner balanced"
        )
    return items
