"""Whether a prepared cell can reach GREEN: its plan's facts, read before anything launches.

The rules are the core's (:mod:`batch_invariance.core.reach`); this module reads the facts
from the prepared job: the work-set (the length ladder planned with the offline estimate, as
the dry run plans it), the endpoint, the model's chat template and the gate policy.
"""

from __future__ import annotations

from batch_invariance.core.chat_template import sends_chat, sets_template
from batch_invariance.core.reach import PlanFacts, unreachable
from batch_invariance.profiles.tokens import approx_token_count
from batch_invariance.run.workset import Workset
from batch_invariance.service.live import LiveCell

__all__ = ["cannot_be_green", "plan_facts", "planned_workset"]


def planned_workset(cell: LiveCell) -> Workset | None:
    """The work-set the cell will measure, where it is known before a launch (a profile's is
    built on a calibration server; the ladder is planned here with the offline estimate)."""
    if cell.workset is not None:
        return cell.workset
    if cell.profile is None and cell.build_workset is not None:
        return cell.build_workset(cell.ctx, approx_token_count)
    return None


def _prompt_text(workset: Workset) -> list[str]:
    return [
        item.prompt
        if item.prompt is not None
        else "\n".join(content for _, content in item.messages or ())
        for item in workset.items
    ]


def plan_facts(cell: LiveCell) -> PlanFacts:
    m = cell.measurement
    workset = planned_workset(cell)
    items = () if workset is None else workset.items
    chat = sends_chat(m.endpoint, items)
    template = cell.model_template
    has_template: bool | None = None
    if template is not None and not sets_template(cell.server_flags):
        has_template = template.template is not None
    distinct = longest = None
    if workset is not None:
        distinct = len(workset.items) - sum(len(group) - 1 for group in workset.duplicates)
        longest = max((approx_token_count(text) for text in _prompt_text(workset)), default=0)
    return PlanFacts(
        ctx=cell.ctx,
        n_predict=m.n_predict,
        endpoint="chat" if chat else m.endpoint,
        policy=cell.policy,
        distinct_prompts=distinct,
        longest_prompt_estimate=longest,
        model_has_chat_template=has_template,
        # An attached server's context is its own; a launched one must take the --ctx fix.
        ctx_multiple=1 if cell.target.attach is not None else cell.target.engine.ctx_multiple,
    )


def cannot_be_green(cell: LiveCell) -> tuple[str, ...]:
    """Why the cell cannot reach GREEN whatever the server does (empty: it can)."""
    return unreachable(plan_facts(cell))
