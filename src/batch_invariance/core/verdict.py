"""The verdict for one cell: a pure function of the evidence and the gate policy.

:func:`decide` computes the findings once (:func:`batch_invariance.core.findings.find`), then
asks the rules of :data:`RULES` in order; the first that matches gives the status, class,
anomaly and reasons (``decision_reasons``, in order: why). Each rule is one named function:

1. :func:`red_ac` -- AC divergent -> ``failed`` (RED). ``divergence_class`` is ``co_batching``
   when AB is clean, ``slot_allocation(+co_batching)`` when AB diverges too; prefixed
   ``run_to_run(+...)`` when the serial repeat A' already differed from A.
2. :func:`red_prompt_cache` -- AC clean, but a scored field changed only with the prompt
   cache on (:mod:`batch_invariance.core.cache_arm`) -> ``failed``, class ``prompt_cache``.
3. :func:`unverified` -- any gate not met (F1 overlap, F2 floor, F3 coverage, transport,
   sample size, per-prompt bound, answer length, serial repeat (A' equal to A in tokens and
   numerics), prompt cache, arm B on every id, numeric evidence: logprobs at every token of
   every arm, the prompt-cache arm when measured (reuse proven by the server, no transport
   failure, logprobs everywhere), and, where the cell records its slot, sequence length: the
   longest hot sequence reaches 3/4 of the slot, :mod:`batch_invariance.core.scope`) ->
   ``green_unverified`` (UNVERIFIED).
4. :func:`amber_arm_b` -- AB divergent, AB token-only differences, or AB numeric drift beyond
   ``logit_eps`` -> ``green_with_caveat`` (AMBER), anomaly ``AC_agree_B_disagrees``.
5. :func:`amber_ac` -- AC token-only differences, or AC numeric drift beyond ``logit_eps``
   (F4, armed at exact equality by default; anomaly ``latent_numeric_drift``) ->
   ``green_with_caveat``.
6. :func:`amber_prompt_cache` -- AC bitwise clean but the prompt-cache arm's tokens or
   logprobs differ from A where no C pass did -> ``green_with_caveat``, class and anomaly
   ``prompt_cache_drift``.
7. :func:`green` -- otherwise ``green``: tokens and logprobs bitwise equal (within
   ``logit_eps``) everywhere, the prompt-cache arm included when it ran.

Transport failures never reach rule 1 on their own: :mod:`batch_invariance.core.diff` skips
any comparison with a transport failure on either side. What a reason tells the reader to
change in the deploy is in the serving engine's words (:class:`EngineAdvice`), given by the
caller: the core names no engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from batch_invariance.core.cache_arm import PromptCacheOutcome
from batch_invariance.core.evidence import CellEvidence, GatePolicy
from batch_invariance.core.findings import (
    NO_ADVICE,
    EngineAdvice,
    Findings,
    Gates,
    Reports,
    Sensitivity,
    build_reports,
    find,
    sensitivity,
)
from batch_invariance.core.numerics import Numerics, drift_words
from batch_invariance.core.pair_report import ac_summary
from batch_invariance.core.scope import SequenceScope

__all__ = [
    "ANOMALY_B",
    "ANOMALY_CACHE",
    "ANOMALY_DRIFT",
    "CLASS_CACHE",
    "CLASS_CACHE_DRIFT",
    "CLASS_CO_BATCHING",
    "CLASS_DRIFT",
    "CLASS_LOGIT",
    "CLASS_RUN_TO_RUN",
    "CLASS_SLOT",
    "CLASS_TOKEN_ONLY",
    "NO_ADVICE",
    "RULES",
    "EngineAdvice",
    "Gates",
    "Reports",
    "Rule",
    "Ruling",
    "Sensitivity",
    "Status",
    "Verdict",
    "build_reports",
    "decide",
    "sensitivity",
]


Status = Literal["failed", "green_unverified", "green_with_caveat", "green"]

ANOMALY_B = "AC_agree_B_disagrees"
ANOMALY_DRIFT = "latent_numeric_drift"
CLASS_CO_BATCHING = "co_batching"
CLASS_SLOT = "slot_allocation(+co_batching)"
CLASS_RUN_TO_RUN = "run_to_run"
CLASS_TOKEN_ONLY = "token_only"
CLASS_LOGIT = "token_and_logit_drift"
CLASS_DRIFT = "logit_drift"
#: Differences that appear only with the prompt cache on (the fix is the cache switch).
CLASS_CACHE = "prompt_cache"
CLASS_CACHE_DRIFT = "prompt_cache_drift"
ANOMALY_CACHE = "prompt_cache_drift"

#: The prefix of every reason about the prompt-cache arm.
_CACHE_ARM = "prompt-cache arm:"


@dataclass(frozen=True)
class Verdict:
    status: Status
    divergence_class: str | None
    anomaly: str | None
    decision_reasons: tuple[str, ...]
    reports: Reports
    gates: Gates
    sensitivity: Sensitivity
    numerics: Numerics
    #: The prompt-cache arm against A; ``None`` when the cache was not measured.
    prompt_cache: PromptCacheOutcome | None = None
    #: The sequence lengths measured against the slot; ``None`` when no slot was recorded.
    scope: SequenceScope | None = None


@dataclass(frozen=True)
class Ruling:
    """What the rule that matched says: the status, class, anomaly and reasons."""

    status: Status
    divergence_class: str | None
    anomaly: str | None
    reasons: tuple[str, ...]


#: One row of the verdict: a :class:`Ruling` when it matches the findings, else ``None``.
Rule = Callable[[Findings], Ruling | None]


def _run_to_run(f: Findings, cls: str) -> tuple[str, tuple[str, ...]]:
    """``cls`` and the serial repeat's reason when A' differed from A (else no reason)."""
    if f.run_to_run:
        return f"{CLASS_RUN_TO_RUN}(+{cls})", (f.gates.serial_repeat.reason,)
    return cls, ()


def red_ac(f: Findings) -> Ruling | None:
    """RED: a score-bearing difference between ground truth and the arm under test."""
    ac, ab = f.reports.ac, f.reports.ab
    if ac.clean:
        return None
    if ab.clean:
        b_scope = f.gates.b_scope
        where = f" on the {b_scope.n_b_ids} divergent id(s) B ran on" if b_scope.scoped else ""
        why = (
            f"AB clean{where}: the parallel server agrees with A when serial, so the "
            "difference comes with concurrent dispatch (co-batching)"
        )
        cls, repeat = _run_to_run(f, CLASS_CO_BATCHING)
    else:
        why = (
            f"AB also diverged on {ab.n_divergent} id(s): slot allocation "
            "already changes outputs without concurrency"
        )
        cls, repeat = _run_to_run(f, CLASS_SLOT)
    return Ruling("failed", cls, None, (ac_summary(ac), why, *repeat))


def red_prompt_cache(f: Findings) -> Ruling | None:
    """RED: only the prompt cache changed a scored field (AC was clean)."""
    if f.cache is None or f.cache.status != "changed":
        return None
    clean = (
        f"AC clean on {f.reports.ac.n_compared} id(s): co-batching with the cache off changed "
        "no scored field"
    )
    cache = f"{_CACHE_ARM} {f.cache.reason}; {f.advice.cache_switch()}"
    cls, repeat = _run_to_run(f, CLASS_CACHE)
    return Ruling("failed", cls, None, (clean, cache, *repeat))


def unverified(f: Findings) -> Ruling | None:
    """UNVERIFIED: a clean comparison that does not prove enough."""
    unmet = f.gates.unmet()
    if not unmet:
        return None
    head = (
        f"AC clean on {f.reports.ac.n_compared} id(s) over {len(f.evidence.c_passes)} "
        "pass(es), but the comparison is not proven to be meaningful:"
    )
    cls = CLASS_RUN_TO_RUN if f.run_to_run else None
    return Ruling("green_unverified", cls, None, (head, *unmet))


def _arm_b_reason(f: Findings) -> str:
    ab, numerics = f.reports.ab, f.numerics
    if f.ab_drift and ab.clean and not ab.n_token_only:
        c_side = "C drifts too" if f.ac_drift else "C equals A bitwise"
        drift = drift_words(numerics.ab, f.ab_drift, f.reports.ac.n_compared)
        return (
            f"AB numeric drift on {drift} with equal tokens while {c_side}: slot allocation "
            "on the parallel server changes the numerics even when serial"
        )
    if not ab.clean:
        return (
            f"AB diverged on {ab.n_divergent} id(s) while AC agreed: "
            "the parallel server disagrees with A even when serial"
        )
    return (
        f"AB token-only differences on {ab.n_token_only} id(s) while AC agreed: "
        "the parallel server's content differs from A even when serial"
    )


def amber_arm_b(f: Findings) -> Ruling | None:
    """AMBER: the serial control on the parallel server disagrees (in an invariant field or,
    like :func:`amber_ac` for AC, only in its tokens or its numerics)."""
    ab = f.reports.ab
    if ab.clean and not ab.n_token_only and not f.ab_drift:
        return None
    return Ruling("green_with_caveat", None, ANOMALY_B, (f.every_gate_met(), _arm_b_reason(f)))


def amber_ac(f: Findings) -> Ruling | None:
    """AMBER: content moved but no invariant field did, or the numerics drifted (F4)."""
    ac, eps = f.reports.ac, f.policy.logit_eps
    if not ac.n_token_only and not f.ac_drift:
        return None
    reasons = [f.every_gate_met()]
    if ac.n_token_only:
        reasons.append(
            f"AC token-only differences on {ac.n_token_only} id(s): content "
            "changed but every invariant field matched"
        )
    if f.ac_drift:
        beyond = "" if eps == 0.0 else f" beyond eps {eps:g}"
        drift = drift_words(f.numerics.ac, f.ac_drift, ac.n_compared)
        reasons.append(
            f"F4 latent numeric drift{beyond}: batching changed the numerics on {drift}; "
            "no answer changed in this sample"
        )
    if not f.ac_drift:
        return Ruling("green_with_caveat", CLASS_TOKEN_ONLY, None, tuple(reasons))
    cls = CLASS_LOGIT if ac.n_token_only else CLASS_DRIFT
    return Ruling("green_with_caveat", cls, ANOMALY_DRIFT, tuple(reasons))


def amber_prompt_cache(f: Findings) -> Ruling | None:
    """AMBER: tokens or numerics moved only with the prompt cache on."""
    if f.cache is None or f.cache.status != "drift":
        return None
    cache = (
        f"{_CACHE_ARM} {f.cache.reason}; no answer changed in this sample; "
        f"{f.advice.cache_switch()}"
    )
    reasons = (f.every_gate_met(), cache)
    return Ruling("green_with_caveat", CLASS_CACHE_DRIFT, ANOMALY_CACHE, reasons)


def green(f: Findings) -> Ruling:
    """GREEN: every gate met and nothing moved; the numerics' statement and the prompt-cache
    arm's reason close the reasons."""
    said = _cache_note(f, (f.every_gate_met(), "AB clean, no token-only differences"))
    cache = () if f.cache is None else (f.cache.reason,)
    return Ruling("green", None, None, (*said, f.statement(green=True), *cache))


#: The verdict's rules, in order: the first that matches decides. :func:`green` always does.
RULES: tuple[Rule, ...] = (
    red_ac, red_prompt_cache, unverified, amber_arm_b, amber_ac, amber_prompt_cache, green,
)  # fmt: skip


def _cache_note(f: Findings, reasons: tuple[str, ...]) -> tuple[str, ...]:
    """``reasons`` and, when the prompt-cache arm saw something no reason names yet, its
    reason."""
    cache = f.cache
    said = any(r.startswith(_CACHE_ARM) for r in reasons)
    if cache is None or cache.status in ("clean", "unverified") or said:
        return reasons
    return (*reasons, f"{_CACHE_ARM} {cache.reason}")


def _first_match(f: Findings) -> Ruling:
    for rule in RULES:
        ruling = rule(f)
        if ruling is not None:
            return ruling
    raise AssertionError("the last rule always matches")  # pragma: no cover


def decide(evidence: CellEvidence, policy: GatePolicy, advice: EngineAdvice = NO_ADVICE) -> Verdict:
    """The verdict for one cell. Pure and deterministic: the same evidence always gives the
    same verdict, whatever the iteration order of its maps. ``advice`` is the serving
    engine's words for what a reason tells the reader to change."""
    f = find(evidence, policy, advice)
    r = _first_match(f)
    numerics = replace(f.numerics, statement=f.statement(green=r.status == "green"))
    return Verdict(
        r.status, r.divergence_class, r.anomaly, _cache_note(f, r.reasons), f.reports,
        f.gates, f.sensitivity, numerics, f.cache, f.scope,
    )  # fmt: skip
