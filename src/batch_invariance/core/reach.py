"""Whether a planned cell can reach GREEN at all, decided before anything launches (pure).

A cell can only be GREEN if its gates can pass when nothing diverges. Four plans fail a gate
whatever the server does, and each is refused with one line naming the fix:

* too few distinct prompts: the 95% bound over ``n`` distinct prompts with none diverging is
  ``3 / n`` (the rule of three), so ``n`` below ``3 / max_bound`` (30 by default) never passes
  the bound gate;
* an answer budget under the length gate: ``--n-predict`` below ``min_answer_tokens`` caps
  every answer below the median the gate needs;
* a base model on the chat endpoint: a model with no chat template of its own is wrapped in
  llama-server's ChatML fallback, and its answers measure that fallback, not the model;
* a slot the work-set cannot fill: the longest prompt (estimated) plus the answer budget stays
  under 3/4 of the slot, which the scope gate needs. The fix names the largest ``--ctx`` the
  work-set does fill that the engine accepts (a multiple of its ``ctx_multiple``), or says
  that none does, so that following it is not refused in turn.

The estimate of prompt lengths is the offline one; a margin keeps an estimate that is a little
short from refusing a plan that would fill the slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from batch_invariance.core.evidence import GatePolicy
from batch_invariance.core.scope import SLOT_FILL_REQUIRED, required_length

__all__ = ["ESTIMATE_MARGIN", "PlanFacts", "filled_ctx", "min_distinct_prompts", "unreachable"]

#: An offline token estimate may be short by this share of the real count.
ESTIMATE_MARGIN = 0.15


@dataclass(frozen=True)
class PlanFacts:
    """What a plan says about its cell before it runs (``None``: not known yet)."""

    ctx: int
    n_predict: int
    endpoint: str
    policy: GatePolicy
    #: Distinct prompts of the work-set (``None``: a profile builds it on a server).
    distinct_prompts: int | None = None
    #: The longest prompt, estimated offline, in tokens.
    longest_prompt_estimate: int | None = None
    #: Whether the model has its own chat template (``None``: not read, or a template is given).
    model_has_chat_template: bool | None = None
    #: The engine takes a ``--ctx`` that is a multiple of this only (1: any).
    ctx_multiple: int = 1


def min_distinct_prompts(policy: GatePolicy) -> int:
    """The fewest distinct prompts whose rule-of-three bound reaches ``max_bound``."""
    return math.ceil(3 / policy.max_bound - 1e-9)


def filled_ctx(reach: int, fill: float | None = None, ctx_multiple: int = 1) -> int | None:
    """The largest ``--ctx`` whose slot sequences up to ``reach`` tokens fill (``fill`` of it,
    by default 3/4, as :func:`~batch_invariance.core.scope.required_length` counts) and that
    the engine accepts (a multiple of ``ctx_multiple``); ``None`` when none does."""
    step = max(1, ctx_multiple)
    share = SLOT_FILL_REQUIRED if fill is None else Fraction(fill)
    if share <= 0:
        return None  # every slot is filled: no size to name
    fits = math.floor(Fraction(reach) / share) // step * step
    while fits > 0 and required_length(fits, fill) > reach:
        fits -= step
    return fits if fits > 0 else None


def _slot_fixes(reach: int, fill: float | None, ctx_multiple: int) -> str:
    """The fixes for a slot the work-set cannot fill; a smaller ``--ctx`` only where one the
    engine accepts is filled."""
    fits = filled_ctx(reach, fill, ctx_multiple)
    if fits is not None:
        return (
            "leave out --workset to measure the length ladder, give longer prompts, or use "
            f"--ctx {fits} or less"
        )
    step = max(1, ctx_multiple)
    return (
        "leave out --workset to measure the length ladder or give longer prompts (no --ctx "
        f"the engine accepts is filled: the smallest, {step}, needs {required_length(step, fill)}"
        " tokens)"
    )


def _unfilled_slot(facts: PlanFacts) -> str | None:
    """The cause when the work-set cannot fill 3/4 of the slot, with a ``--ctx`` fix the
    engine takes (``None``: it can, or the prompts are not known yet)."""
    if facts.longest_prompt_estimate is None:
        return None
    fill = facts.policy.min_slot_fill
    reach = facts.longest_prompt_estimate + facts.n_predict
    needed = required_length(facts.ctx, fill)
    if reach * (1 + ESTIMATE_MARGIN) >= needed:
        return None
    return (
        f"a slot the work-set cannot fill: its longest prompt (~"
        f"{facts.longest_prompt_estimate} tokens, estimated) plus --n-predict "
        f"{facts.n_predict} reaches ~{reach} of the {needed} tokens (3/4 of --ctx "
        f"{facts.ctx}) a GREEN needs; {_slot_fixes(reach, fill, facts.ctx_multiple)}"
    )


def unreachable(facts: PlanFacts) -> tuple[str, ...]:
    """Why the plan cannot reach GREEN, one line per cause with its fix (empty: it can)."""
    out: list[str] = []
    policy = facts.policy
    needed = min_distinct_prompts(policy)
    if facts.distinct_prompts is not None and facts.distinct_prompts < needed:
        n = facts.distinct_prompts
        bound = "no bound" if n == 0 else f"a 95% bound of 3/{n} = {3 / n:.2f}"
        out.append(
            f"too few distinct prompts: {n} give {bound} even if none diverges, above "
            f"--max-bound {policy.max_bound:g}; give at least {needed} distinct prompts (or "
            "leave out --workset to measure the length ladder)"
        )
    if facts.n_predict < policy.min_answer_tokens:
        out.append(
            f"answer budget under the length gate: --n-predict {facts.n_predict} caps every "
            f"answer below the {policy.min_answer_tokens}-token median a GREEN needs; set "
            f"--n-predict {policy.min_answer_tokens} or more"
        )
    if facts.endpoint == "chat" and facts.model_has_chat_template is False:
        out.append(
            "a base model on the chat endpoint: the model has no chat template, so the server "
            "wraps it in its ChatML fallback and measures that; use --endpoint completions "
            "(the Action: endpoint: completions or auto), or give a template with "
            "--server-flag --chat-template NAME"
        )
    slot = _unfilled_slot(facts)
    if slot is not None:
        out.append(slot)
    return tuple(out)
