"""The verdict for one cell: a pure function of the evidence and the gate policy.

:func:`decide` walks the rows below in order; the first that matches wins, and
``decision_reasons`` records, in order, why.

1. AC divergent -> ``failed`` (RED). ``divergence_class`` is ``co_batching`` when AB is clean,
   ``slot_allocation(+co_batching)`` when AB diverges too; prefixed ``run_to_run(+...)`` when
   the serial repeat A' already differed from A.
2. Any anti-vacuity gate not met (F1 overlap, F2 floor, F3 coverage, transport, sample size,
   per-prompt bound, answer length, serial repeat (A' equal to A in tokens and numerics),
   prompt cache, arm B on every id, numeric evidence: logprobs at every token of every arm,
   and, where the cell records its slot, sequence length: the longest hot sequence reaches
   3/4 of the slot, :mod:`batch_invariance.core.scope`) -> ``green_unverified`` (UNVERIFIED).
   With the prompt-cache arm measured and AC clean: a scored field that changed only with
   the cache (:mod:`batch_invariance.core.cache_arm`) -> ``failed``, class ``prompt_cache``.
2. (continued) the prompt-cache arm, when measured: too little reuse proven by the server,
   transport failures or missing logprobs in it -> ``green_unverified``.
3. AB divergent, AB token-only differences, or AB numeric drift beyond ``logit_eps`` ->
   ``green_with_caveat`` (AMBER), anomaly ``AC_agree_B_disagrees``.
4. AC token-only differences, or AC numeric drift beyond ``logit_eps`` (F4, armed at exact
   equality by default; anomaly ``latent_numeric_drift``) -> ``green_with_caveat``.
4b. AC bitwise clean but the prompt-cache arm's tokens or logprobs differ from A where no C
   pass did -> ``green_with_caveat``, class and anomaly ``prompt_cache_drift``.
5. Otherwise ``green``: tokens and logprobs bitwise equal (within ``logit_eps``) everywhere,
   the prompt-cache arm included when it ran.

Transport failures never reach row 1 on their own: :mod:`batch_invariance.core.diff` skips any
comparison with a transport failure on either side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from batch_invariance.core import gates as g
from batch_invariance.core import sample as sg
from batch_invariance.core import stats
from batch_invariance.core.cache_arm import PromptCacheOutcome, cache_outcome
from batch_invariance.core.columns import (
    EvidenceColumns,
    arm_columns,
    evidence_columns,
    group_labels,
    unequal_ids,
    unequal_via,
)
from batch_invariance.core.diff import PairReport, compare_columns
from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta
from batch_invariance.core.numerics import (
    NumericEvidenceGate,
    Numerics,
    cell_numerics,
    drift_words,
    numeric_statement,
)
from batch_invariance.core.pair_report import ac_summary
from batch_invariance.core.repeat import SerialRepeatGate, serial_repeat_gate
from batch_invariance.core.schedule import ArmBScopeGate, arm_b_scope_gate, restrict
from batch_invariance.core.scope import (
    UNRECORDED_GATE,
    ScopeGate,
    SequenceScope,
    scope_gate,
    sequence_scope,
)

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
    "Gates",
    "Reports",
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


@dataclass(frozen=True)
class Sensitivity:
    """How much a clean result can say, and what was seen.

    ``n_hot_trials`` counts id x pass comparisons scored ``ok`` in A and in the pass and
    co-batched in it; ``n_distinct_prompts`` the distinct requests (request contents,
    whitespace aside: :func:`~batch_invariance.core.sample.distinct_prompts`) with at least
    one of them. ``n_ac_divergent`` counts the AC id x pass
    comparisons that diverged (an invariant field, or the id missing on one side), out of
    ``n_scored_comparisons``: the comparisons judged (no transport failure on either side).
    """

    n_hot_trials: int
    n_scored_comparisons: int
    n_ac_divergent: int
    n_ac_divergent_ids: int
    n_distinct_prompts: int
    #: The headline: ``3 / n_distinct_prompts`` (rule of three, at most 1) when no AC
    #: divergence was seen, else ``None``. Distinct prompts are the independent samples.
    rate_upper_bound_95: float | None
    #: ``3 / n_hot_trials`` (at most 1) when no AC divergence was seen: per id x pass
    #: comparison, which repetitions of one prompt inflate. Shown beside, never gated on.
    per_comparison_rate_upper_bound_95: float | None
    #: ``n_ac_divergent / n_scored_comparisons`` when divergences were seen, else ``None``.
    observed_rate: float | None
    ci95_low: float | None
    ci95_high: float | None


@dataclass(frozen=True)
class CacheArmGate:
    """Whether the prompt-cache arm, when it ran, can back its claim (reuse proven by the
    server, every request answered with logprobs). Met when it did not run."""

    ok: bool
    measured: bool
    reason: str


@dataclass(frozen=True)
class Gates:
    """Every gate outcome the verdict looked at."""

    overlap: g.OverlapGate
    floor: g.FloorGate
    coverage: g.CoverageGate
    transport: g.TransportGate
    sample: sg.SampleGate
    bound: sg.BoundGate
    length: sg.LengthGate
    serial_repeat: SerialRepeatGate
    prompt_cache: g.PromptCacheGate
    b_scope: ArmBScopeGate
    numeric_evidence: NumericEvidenceGate
    cache_arm: CacheArmGate = CacheArmGate(True, False, "prompt cache not measured")
    #: The measured sequences against the slot (met, "not recorded", when no slot is).
    scope: ScopeGate = UNRECORDED_GATE

    def unmet(self) -> tuple[str, ...]:
        """Reasons of the gates not met, in the verdict's order."""
        return tuple(
            gate.reason
            for gate in (
                self.overlap,
                self.floor,
                self.coverage,
                self.transport,
                self.sample,
                self.bound,
                self.length,
                self.serial_repeat,
                self.prompt_cache,
                self.b_scope,
                self.numeric_evidence,
                self.cache_arm,
                self.scope,
            )
            if not gate.ok
        )


@dataclass(frozen=True)
class Reports:
    ac: PairReport
    ab: PairReport
    bc: PairReport
    #: A against its serial repeat A'; ``None`` when A' was not run.
    aa: PairReport | None


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


def _cache_arm(
    evidence: CellEvidence, reports: Reports, numerics: Numerics, eps: float
) -> PromptCacheOutcome | None:
    """The prompt-cache arm against A, attributing to the cache only what no C pass showed."""
    if evidence.cache_passes is None:
        return None
    ac = reports.ac
    c_differs = {*ac.divergent_ids, *ac.token_divergence_ids, *numerics.ac.drift_ids_beyond(eps)}
    return cache_outcome(evidence.a, evidence.cache_passes, evidence.items, c_differs, eps)


def _cache_gate(cache: PromptCacheOutcome | None) -> CacheArmGate:
    if cache is None:
        return CacheArmGate(True, False, "prompt cache not measured")
    if cache.status == "unverified":
        return CacheArmGate(False, True, f"prompt-cache arm: {cache.reason}")
    return CacheArmGate(True, True, f"prompt-cache arm: {cache.reuse.reason}")


def build_reports(evidence: CellEvidence, columns: EvidenceColumns | None = None) -> Reports:
    """The AC, AB, BC (and A A') reports; AC and BC are unions over the C passes. Each arm is
    read once (``columns``, when given, must be :func:`evidence_columns` of ``evidence``) and
    shared by every report that reads it."""
    cols = columns if columns is not None else evidence_columns(evidence)
    passes = [(pc.record.index, pc.arm) for pc in cols.passes]
    labels = group_labels(evidence.items)
    a, b = cols.a, cols.b
    aa = None
    if cols.a_repeat is not None:
        aa = compare_columns("AA", a, [(None, cols.a_repeat)], labels)
    ac_unequal = [unequal_ids(a, c) for _, c in passes]
    ac = compare_columns("AC", a, passes, labels, ac_unequal)
    scope = evidence.b_ids
    if scope is not None:
        # B ran on these ids only (a RED cell's divergent ids): AB and BC compare them alone.
        a_b = arm_columns(restrict(a.trials, scope))
        passes_b = [(i, arm_columns(restrict(c.trials, scope), keyed=False)) for i, c in passes]
        return Reports(
            ac=ac,
            ab=compare_columns("AB", a_b, [(None, b)], labels),
            bc=compare_columns("BC", b, passes_b, labels),
            aa=aa,
        )
    # Each C pass's keys are compared with A's once; B's comparison reuses that wherever B
    # has A's key (nearly everywhere when AB is clean), and compares the rest directly.
    ab_unequal = unequal_ids(a, b)
    agree = frozenset(b.ids).difference(ab_unequal)
    bc_unequal = [unequal_via(u, agree, b, c) for u, (_, c) in zip(ac_unequal, passes, strict=True)]
    return Reports(
        ac=ac,
        ab=compare_columns("AB", a, [(None, b)], labels, [ab_unequal]),
        bc=compare_columns("BC", b, passes, labels, bc_unequal),
        aa=aa,
    )


def _bound(n: int) -> float | None:
    """The rule-of-three bound as a probability: ``min(1, 3 / n)``; ``None`` when ``n == 0``."""
    bound = stats.rule_of_three(n)
    return None if bound is None else min(1.0, bound)


def sensitivity(hot: sg.HotByPass, ac: PairReport, items: Sequence[ItemMeta]) -> Sensitivity:
    """Counts, the rule-of-three bounds, and the exact interval when divergences were seen.

    A missing id is a judged, divergent comparison: it counts in both numbers."""
    scored = sum(p.n_compared for p in ac.per_pass)
    divergent = sum(p.n_divergent for p in ac.per_pass)
    n_hot = sum(map(len, hot.values()))
    n_distinct = sg.distinct_prompts(set().union(*hot.values()), items)
    if divergent == 0:
        return Sensitivity(
            n_hot, scored, 0, ac.n_divergent, n_distinct, _bound(n_distinct), _bound(n_hot),
            None, None, None,
        )  # fmt: skip
    ci = stats.clopper_pearson(divergent, scored)
    return Sensitivity(
        n_hot, scored, divergent, ac.n_divergent, n_distinct, None, None,
        divergent / scored, ci.low, ci.high,
    )  # fmt: skip


def decide(evidence: CellEvidence, policy: GatePolicy) -> Verdict:
    """The verdict for one cell. Pure and deterministic: the same evidence always gives the
    same verdict, whatever the iteration order of its maps."""
    cols = evidence_columns(evidence)  # the one scan of every trial; all below read it
    reports = build_reports(evidence, cols)
    co_sets = g.cobatched_by_pass(cols.passes, policy.overlap_margin_s)
    hot = sg.hot_by_pass(cols.a, cols.passes, co_sets)
    sens = sensitivity(hot, reports.ac, evidence.items)
    eps = policy.logit_eps
    numerics = cell_numerics(
        evidence.a,
        evidence.a_repeat,
        evidence.b,
        [(p.index, p.trials) for p in sorted(evidence.c_passes, key=lambda p: p.index)],
        eps,
    )
    gates = Gates(
        overlap=g.overlap_gate(cols.passes),
        floor=g.completion_floor_gate(cols.a, cols.passes, policy),
        coverage=g.coverage_gate(cols.passes, policy, co_sets),
        transport=g.transport_gate(cols),
        sample=sg.sample_gate(sens.n_hot_trials, policy),
        bound=sg.bound_gate(sens.n_distinct_prompts, sens.rate_upper_bound_95, policy),
        length=sg.length_gate(cols.a, cols.passes, hot, policy),
        serial_repeat=serial_repeat_gate(reports.aa, reports.ab, numerics.aa, eps),
        prompt_cache=g.prompt_cache_gate(cols),
        b_scope=arm_b_scope_gate(evidence),
        numeric_evidence=numerics.evidence,
    )
    cache = _cache_arm(evidence, reports, numerics, eps)
    scope = None
    if evidence.slot_ctx is not None:
        scope = sequence_scope(
            evidence, evidence.slot_ctx, hot, reports.ac, numerics.ac, policy.min_slot_fill
        )
    gates = replace(
        gates,
        cache_arm=_cache_gate(cache),
        scope=UNRECORDED_GATE if scope is None else scope_gate(scope),
    )
    run_to_run = not gates.serial_repeat.ok
    ac, ab = reports.ac, reports.ab

    def verdict(
        status: Status, cls: str | None, anomaly: str | None, reasons: list[str]
    ) -> Verdict:
        said = numeric_statement(
            numerics, status == "green", sens.n_distinct_prompts, sens.n_hot_trials,
            len(evidence.c_passes),
        )  # fmt: skip
        if scope is not None:
            said = f"{said}; {scope.statement}"
        said_cache = any(r.startswith("prompt-cache arm:") for r in reasons)
        if cache is not None and cache.status not in ("clean", "unverified") and not said_cache:
            reasons = [*reasons, f"prompt-cache arm: {cache.reason}"]
        return Verdict(
            status, cls, anomaly, tuple(reasons), reports, gates, sens,
            replace(numerics, statement=said), cache, scope,
        )  # fmt: skip

    # 1. RED: a score-bearing difference between ground truth and the arm under test.
    if not ac.clean:
        reasons = [ac_summary(ac)]
        if ab.clean:
            cls = CLASS_CO_BATCHING
            where = (
                f" on the {gates.b_scope.n_b_ids} divergent id(s) B ran on"
                if gates.b_scope.scoped
                else ""
            )
            reasons.append(
                f"AB clean{where}: the parallel server agrees with A when serial, so the "
                "difference comes with concurrent dispatch (co-batching)"
            )
        else:
            cls = CLASS_SLOT
            reasons.append(
                f"AB also diverged on {ab.n_divergent} id(s): slot allocation "
                "already changes outputs without concurrency"
            )
        if run_to_run:
            cls = f"{CLASS_RUN_TO_RUN}(+{cls})"
            reasons.append(gates.serial_repeat.reason)
        return verdict("failed", cls, None, reasons)

    # 1b. RED: only the prompt cache changed a scored field (AC was clean).
    if cache is not None and cache.status == "changed":
        reasons = [
            f"AC clean on {ac.n_compared} id(s): co-batching with the cache off changed no "
            "scored field",
            f"prompt-cache arm: {cache.reason}; the switch that fixes it is the prompt cache "
            "(--no-cache-prompt --cache-ram 0 in the deploy)",
        ]
        cls = f"{CLASS_RUN_TO_RUN}(+{CLASS_CACHE})" if run_to_run else CLASS_CACHE
        if run_to_run:
            reasons.append(gates.serial_repeat.reason)
        return verdict("failed", cls, None, reasons)

    # 2. UNVERIFIED: a clean comparison that does not prove enough.
    unmet = gates.unmet()
    if unmet:
        head = (
            f"AC clean on {ac.n_compared} id(s) over {len(evidence.c_passes)} pass(es), but "
            "the comparison is not proven to be meaningful:"
        )
        unverified_cls: str | None = CLASS_RUN_TO_RUN if run_to_run else None
        return verdict("green_unverified", unverified_cls, None, [head, *unmet])

    length = gates.length
    met = (
        "AC clean and every gate met (F1 overlap, F2 floor, F3 coverage, transport, "
        f"sample size {sens.n_hot_trials} >= {policy.min_hot_trials}, per-prompt bound "
        f"{sens.rate_upper_bound_95:.4g} <= {policy.max_bound:g} from "
        f"{sens.n_distinct_prompts} distinct prompts, median answer "
        f"{length.answer_tokens_median} >= {policy.min_answer_tokens} tokens"
        + (
            ""
            if scope is None
            else f", sequences up to {scope.longest} >= {scope.required} "
            f"of the slot's {scope.slot_ctx} tokens"
        )
        + ")"
    )

    # 3. AMBER: the serial control on the parallel server disagrees (in an invariant field
    # or, like row 4 for AC, only in its tokens or its numerics).
    ab_drift = numerics.ab.drift_ids_beyond(eps)
    ac_drift = numerics.ac.drift_ids_beyond(eps)
    n_rows = ac.n_compared
    if not ab.clean or ab.n_token_only or ab_drift:
        if ab_drift and ab.clean and not ab.n_token_only:
            c_side = "C drifts too" if ac_drift else "C equals A bitwise"
            b_reason = (
                f"AB numeric drift on {drift_words(numerics.ab, ab_drift, n_rows)} with equal "
                f"tokens while {c_side}: slot allocation on the parallel server changes the "
                "numerics even when serial"
            )
        elif not ab.clean:
            b_reason = (
                f"AB diverged on {ab.n_divergent} id(s) while AC agreed: "
                "the parallel server disagrees with A even when serial"
            )
        else:
            b_reason = (
                f"AB token-only differences on {ab.n_token_only} id(s) while AC agreed: "
                "the parallel server's content differs from A even when serial"
            )
        return verdict("green_with_caveat", None, ANOMALY_B, [met, b_reason])

    # 4. AMBER: content moved but no invariant field did, or the numerics drifted (F4).
    if ac.n_token_only or ac_drift:
        reasons = [met]
        if ac.n_token_only:
            reasons.append(
                f"AC token-only differences on {ac.n_token_only} id(s): content "
                "changed but every invariant field matched"
            )
        if ac_drift:
            beyond = "" if eps == 0.0 else f" beyond eps {eps:g}"
            reasons.append(
                f"F4 latent numeric drift{beyond}: batching changed the numerics on "
                f"{drift_words(numerics.ac, ac_drift, n_rows)}; no answer changed in this "
                "sample"
            )
        cls = (CLASS_LOGIT if ac.n_token_only else CLASS_DRIFT) if ac_drift else CLASS_TOKEN_ONLY
        return verdict("green_with_caveat", cls, ANOMALY_DRIFT if ac_drift else None, reasons)

    # 4b. AMBER: tokens or numerics moved only with the prompt cache on.
    if cache is not None and cache.status == "drift":
        reasons = [
            met,
            f"prompt-cache arm: {cache.reason}; no answer changed in this sample; the switch "
            "that fixes it is the prompt cache (--no-cache-prompt --cache-ram 0 in the deploy)",
        ]
        return verdict("green_with_caveat", CLASS_CACHE_DRIFT, ANOMALY_CACHE, reasons)

    # 5. GREEN.
    green = verdict("green", None, None, [met, "AB clean, no token-only differences"])
    tail = (green.numerics.statement, *(() if cache is None else (cache.reason,)))
    return replace(green, decision_reasons=(*green.decision_reasons, *tail))
