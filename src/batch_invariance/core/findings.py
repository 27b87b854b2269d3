"""What the verdict reads of one cell, computed once (pure).

:func:`find` turns the evidence and the gate policy into :class:`Findings`: the pairwise
reports (AC, AB, BC, A A'), the hot comparisons and the sample's sensitivity, the numerics,
every anti-vacuity gate, the prompt-cache arm and the sequence scope. The rules of
:mod:`batch_invariance.core.verdict` only read them; none computes anything of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    numeric_statement,
)
from batch_invariance.core.schedule import (
    ArmBScopeGate,
    SerialRepeatGate,
    arm_b_scope_gate,
    restrict,
    serial_repeat_gate,
)
from batch_invariance.core.scope import (
    UNRECORDED_GATE,
    ScopeGate,
    SequenceScope,
    scope_gate,
    sequence_scope,
)

__all__ = [
    "NO_ADVICE",
    "CacheArmGate",
    "EngineAdvice",
    "Findings",
    "Gates",
    "Reports",
    "Sensitivity",
    "build_reports",
    "find",
    "sensitivity",
]


@dataclass(frozen=True)
class EngineAdvice:
    """What a reason tells the reader to change, in the serving engine's own words.

    The core names no engine: the layer that knows which engine served passes its words.
    ``cache_off`` is the deploy switch that turns its prompt cache off (``None``: the
    reason says only that the cache is the switch)."""

    cache_off: str | None = None

    def cache_switch(self) -> str:
        """The switch that fixes a difference that comes with the prompt cache."""
        where = "turned off" if self.cache_off is None else self.cache_off
        return f"the switch that fixes it is the prompt cache ({where} in the deploy)"


#: No engine's words: reasons name the switch without its flags.
NO_ADVICE = EngineAdvice()


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
class Findings:
    """Everything the verdict's rules read, computed once by :func:`find`."""

    evidence: CellEvidence
    policy: GatePolicy
    advice: EngineAdvice
    reports: Reports
    gates: Gates
    sensitivity: Sensitivity
    numerics: Numerics
    #: The prompt-cache arm against A; ``None`` when the cache was not measured.
    cache: PromptCacheOutcome | None
    #: The sequence lengths measured against the slot; ``None`` when no slot was recorded.
    scope: SequenceScope | None
    #: AC and AB ids whose numerics drifted beyond the policy's ``logit_eps``.
    ac_drift: tuple[str, ...]
    ab_drift: tuple[str, ...]

    @property
    def run_to_run(self) -> bool:
        """The serial repeat A' differed from A: the server is not even run-to-run stable."""
        return not self.gates.serial_repeat.ok

    def statement(self, green: bool) -> str:
        """What the numerics (and the sequence scope, when recorded) prove, in words."""
        s = self.sensitivity
        said = numeric_statement(
            self.numerics, green, s.n_distinct_prompts, s.n_hot_trials,
            len(self.evidence.c_passes),
        )  # fmt: skip
        return said if self.scope is None else f"{said}; {self.scope.statement}"

    def every_gate_met(self) -> str:
        """The reason that opens every clean verdict: each gate met, with its numbers."""
        s, p, length, scope = self.sensitivity, self.policy, self.gates.length, self.scope
        reach = (
            ""
            if scope is None
            else f", sequences up to {scope.longest} >= {scope.required} "
            f"of the slot's {scope.slot_ctx} tokens"
        )
        return (
            "AC clean and every gate met (F1 overlap, F2 floor, F3 coverage, transport, "
            f"sample size {s.n_hot_trials} >= {p.min_hot_trials}, per-prompt bound "
            f"{s.rate_upper_bound_95:.4g} <= {p.max_bound:g} from "
            f"{s.n_distinct_prompts} distinct prompts, median answer "
            f"{length.answer_tokens_median} >= {p.min_answer_tokens} tokens{reach})"
        )


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


def _numerics(evidence: CellEvidence, eps: float) -> Numerics:
    ordered = sorted(evidence.c_passes, key=lambda p: p.index)
    c_passes = [(p.index, p.trials) for p in ordered]
    return cell_numerics(evidence.a, evidence.a_repeat, evidence.b, c_passes, eps)


def find(evidence: CellEvidence, policy: GatePolicy, advice: EngineAdvice = NO_ADVICE) -> Findings:
    """Every finding of one cell, each computed once: the verdict's rules only read them."""
    cols = evidence_columns(evidence)  # the one scan of every trial; all below read it
    reports = build_reports(evidence, cols)
    co_sets = g.cobatched_by_pass(cols.passes, policy.overlap_margin_s)
    hot = sg.hot_by_pass(cols.a, cols.passes, co_sets)
    sens = sensitivity(hot, reports.ac, evidence.items)
    eps = policy.logit_eps
    numerics = _numerics(evidence, eps)
    cache = _cache_arm(evidence, reports, numerics, eps)
    scope = None
    if evidence.slot_ctx is not None:
        scope = sequence_scope(
            evidence, evidence.slot_ctx, hot, reports.ac, numerics.ac, policy.min_slot_fill
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
        cache_arm=_cache_gate(cache),
        scope=UNRECORDED_GATE if scope is None else scope_gate(scope),
    )
    return Findings(
        evidence, policy, advice, reports, gates, sens, numerics, cache, scope,
        ac_drift=numerics.ac.drift_ids_beyond(eps),
        ab_drift=numerics.ab.drift_ids_beyond(eps),
    )  # fmt: skip
