"""The views a cert derives from its verdict, in words: the ``gates`` summary (F0-F5 and the
anti-vacuity gates) and the ``promotion_scope`` (this cell only, the MoE caveat and the
rule-of-three statement). Pure.
"""

from __future__ import annotations

from batch_invariance.cert.schema import GATE_ABC_UNION, GateOutcome, PromotionScope
from batch_invariance.core.evidence import CellSpec, GatePolicy, policy_problems
from batch_invariance.core.numerics import Numerics
from batch_invariance.core.scope import scope_words
from batch_invariance.core.verdict import Verdict


def _rule_of_three_text(verdict: Verdict) -> str:
    s = verdict.sensitivity
    if s.n_ac_divergent:
        return (
            f"{s.n_ac_divergent} divergent comparison(s) in {s.n_scored_comparisons}: observed "
            f"rate {s.observed_rate or 0.0:.4g}, exact 95% interval [{s.ci95_low or 0.0:.4g}, "
            f"{s.ci95_high or 0.0:.4g}]"
        )
    if s.rate_upper_bound_95 is None or s.per_comparison_rate_upper_bound_95 is None:
        return "no co-batched comparison was scored: no bound on the divergence rate"
    return (
        f"0 divergences over {s.n_distinct_prompts} distinct co-batched prompts: by the rule "
        f"of three the per-prompt divergence rate is below {s.rate_upper_bound_95:.4g} (about "
        f"95% confidence); per id x pass comparison ({s.n_hot_trials}, repetitions not "
        f"independent) below {s.per_comparison_rate_upper_bound_95:.4g}; rarer effects can "
        "still exist"
    )


def _valid_for(spec: CellSpec, verdict: Verdict) -> str:
    longest = verdict.gates.length.answer_tokens_max
    length = (
        f"; holds for answers up to {longest} tokens"
        if longest is not None
        else "; answer length unknown, so it holds for no answer length"
    )
    # Only a cert that records its slot says the sequence scope (older ones re-derive as
    # they were written; readers say "not recorded" for them).
    sequences = "" if verdict.scope is None else f"; {scope_words(verdict.scope)}"
    return (
        f"only model {spec.model} at ctx {spec.ctx} with --parallel {spec.dispatch_n} "
        f"(KV {spec.kv_label}) on this server build and host{length}{sequences}"
    )


def _moe_warning(is_moe: bool | None) -> str:
    tail = (
        "expert routing can depend on what else shares the batch, so a result for one load, "
        "N or build does not carry over"
    )
    if is_moe is True:
        return f"mixture-of-experts model (from the GGUF header): {tail}"
    if is_moe is False:
        return f"dense model (from the GGUF header); for mixture-of-experts models {tail}"
    return f"expert count unknown; if this is a mixture-of-experts model, {tail}"


def _f4(numerics: Numerics) -> GateOutcome:
    eps = numerics.eps
    at = "exact equality" if eps == 0.0 else f"eps {eps:g}, never promotable"
    if not numerics.evidence.ok:
        return GateOutcome(False, f"F4 armed ({at}) but no numeric evidence to check")
    drift = numerics.ac.drift_ids_beyond(eps)
    if drift:
        return GateOutcome(
            False,
            f"F4 latent numeric drift on {len(drift)} id(s) (armed at {at}; max |delta| "
            f"{numerics.ac.max_abs_delta or 0.0:.3g})",
        )
    return GateOutcome(True, f"F4 armed ({at}): AC logprobs show no drift")


def gates_block(
    verdict: Verdict, spec: CellSpec, source: str, policy: GatePolicy
) -> dict[str, GateOutcome]:
    """The cert's ``gates`` summary: every gate's outcome and reason, F0 to F5."""
    g = verdict.gates
    ac = verdict.reports.ac
    loose = policy_problems(policy)
    promotable = (
        verdict.status == "green" and source == "live" and spec.gate == GATE_ABC_UNION and not loose
    )
    f5_reason = (
        "F5 promotable: status green, source live, gate abc_union, default-or-stricter "
        "policy; valid for this cell only"
        if promotable
        else f"F5 not promotable: needs status green (is {verdict.status}), source live "
        f"(is {source}), gate {GATE_ABC_UNION} (is {spec.gate}) and a policy no looser "
        f"than the defaults ({'; '.join(loose) if loose else 'it is'})"
    )
    f0_reason = (
        f"F0 exact match: AC clean on {ac.n_compared} id(s) over every pass"
        if ac.clean
        else f"F0 exact match failed: {ac.n_divergent} id(s) diverged"
    )
    scope = {"arm_b_scope": GateOutcome(g.b_scope.ok, g.b_scope.reason)} if g.b_scope.scoped else {}
    if g.cache_arm.measured:  # only in a cert that measured the prompt cache
        scope["prompt_cache_arm"] = GateOutcome(g.cache_arm.ok, g.cache_arm.reason)
    if g.scope.recorded:  # only in a cert that records its slot
        scope["sequence_length"] = GateOutcome(g.scope.ok, g.scope.reason)
    return {
        "F0": GateOutcome(ac.clean, f0_reason),
        "F1": GateOutcome(g.overlap.ok, g.overlap.reason),
        "F2": GateOutcome(g.floor.ok, g.floor.reason),
        "F3": GateOutcome(g.coverage.ok, g.coverage.reason),
        "F4": _f4(verdict.numerics),
        "F5": GateOutcome(promotable, f5_reason),
        "transport": GateOutcome(g.transport.ok, g.transport.reason),
        "min_hot_trials": GateOutcome(g.sample.ok, g.sample.reason),
        "per_prompt_bound": GateOutcome(g.bound.ok, g.bound.reason),
        "answer_length": GateOutcome(g.length.ok, g.length.reason),
        "serial_repeat": GateOutcome(g.serial_repeat.ok, g.serial_repeat.reason),
        "prompt_cache": GateOutcome(g.prompt_cache.ok, g.prompt_cache.reason),
        "numeric_evidence": GateOutcome(g.numeric_evidence.ok, g.numeric_evidence.reason),
        # Only in a cert whose B ran on a RED cell's divergent ids (older certs lack it).
        **scope,
    }


def promotion_scope(spec: CellSpec, verdict: Verdict) -> PromotionScope:
    """What the cert speaks for: this cell only, with its limits said in words."""
    return PromotionScope(
        model=spec.model,
        ctx=spec.ctx,
        dispatch_n=spec.dispatch_n,
        kv_label=spec.kv_label,
        valid_for=_valid_for(spec, verdict),
        generalizes=False,
        is_moe=spec.is_moe,
        moe_warning=_moe_warning(spec.is_moe),
        rule_of_three=_rule_of_three_text(verdict),
        answer_tokens_min=verdict.gates.length.answer_tokens_min,
        answer_tokens_median=verdict.gates.length.answer_tokens_median,
        answer_tokens_max=verdict.gates.length.answer_tokens_max,
        share_cut_by_budget=verdict.gates.length.share_cut_by_budget,
    )
