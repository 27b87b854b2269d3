"""The anti-vacuity gates (pure): what must hold before a clean comparison may be GREEN.

A clean A/C comparison proves nothing unless requests really shared batches, enough of them
were genuinely scored, and nothing got in the way. Each gate here returns a small frozen
record with ``ok`` and a one-line ``reason``; :mod:`batch_invariance.core.verdict` combines them.
Every gate fails closed: missing evidence (no passes, no server signal, a missing interval)
counts as "not met", never as "met".

* F1 overlap - in EVERY C pass the client intervals reach depth >= 2 AND the server itself
  reported >= 2 busy slots (``PassRecord.server_busy_max``).
* F2 completion floor - at least ``completion_floor`` of the id x pass comparisons are
  genuinely scored (``failure_mode == "ok"``) in both A and that C pass.
* F3 co-batch coverage - per pass, from that pass's own intervals: at least
  ``max(2, ceil(coverage_fraction x ids))`` ids overlap another request of the pass by at
  least ``overlap_margin_s``; any trial without an interval fails the pass.
* transport - no transport failure in any arm.
* prompt cache - every answered trial reported ``cache_n == 0`` (unreported fails).

How much a clean result covers (sample size, per-prompt bound, answer length) is in
:mod:`batch_invariance.core.sample`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from fractions import Fraction

from batch_invariance.core.columns import (
    ArmColumns,
    EvidenceColumns,
    PassColumns,
    PassesLike,
    as_arm_columns,
    as_evidence_columns,
    as_pass_columns,
    same_order,
)
from batch_invariance.core.evidence import (
    ARM_A,
    ARM_A_REPEAT,
    ARM_B,
    ARM_C,
    CellEvidence,
    GatePolicy,
    Trial,
)
from batch_invariance.core.intervals import cobatched, cobatched_flags, max_overlap_depth
from batch_invariance.core.intervals import depth as overlap_depth

#: Interval functions the gates are built on, importable from here by the shell's callers.
__all__ = ["cobatched_flags", "max_overlap_depth"]

#: Both the client-side overlap depth and the server's busy slots must reach this.
REQUIRED_DEPTH = 2


def exact_fraction(value: float) -> Fraction:
    """An exact fraction for a policy threshold (0.8 is 4/5, not 0.8000000000000000444)."""
    return Fraction(repr(float(value)))


# --------------------------------------------------------------------------- co-batching


#: Ids of one pass, as a set: a frozenset, or the pass's own keys when that is every id.
IdSet = AbstractSet[str]


def cobatched_of(pc: PassColumns, margin: float) -> IdSet:
    """Ids of the pass whose interval overlaps another of the same pass by ``margin``.

    Trials without an interval are ignored here (they can never be attributed); the coverage
    gate fails such a pass closed separately.
    """
    flags = cobatched(pc.intervals, margin)
    if flags.all():  # all of them, the usual case: no need to pick them out
        # Every trial of the pass, when each has an interval: its own keys, with no copy.
        return pc.arm.trials.keys() if not pc.arm.n_untimed else frozenset(pc.arm.timed_ids)
    return frozenset(map(pc.arm.timed_ids.__getitem__, pc.intervals.order[flags].tolist()))


# --------------------------------------------------------------------------- F1 overlap


@dataclass(frozen=True)
class PassOverlap:
    index: int
    client_max_depth: int
    server_busy_max: int | None
    busy_source: str
    ok: bool


@dataclass(frozen=True)
class OverlapGate:
    ok: bool
    required_depth: int
    per_pass: tuple[PassOverlap, ...]
    reason: str


def overlap_gate(passes: PassesLike) -> OverlapGate:
    """F1: every pass shows client depth >= 2 and server busy slots >= 2."""
    rows: list[PassOverlap] = []
    for pc in as_pass_columns(passes):
        p = pc.record
        depth = overlap_depth(pc.intervals)
        busy = p.server_busy_max
        ok = depth >= REQUIRED_DEPTH and busy is not None and busy >= REQUIRED_DEPTH
        rows.append(PassOverlap(p.index, depth, busy, p.busy_source, ok))
    if not rows:
        return OverlapGate(False, REQUIRED_DEPTH, (), "F1 overlap not met: no C pass ran")
    bad = [r for r in rows if not r.ok]
    if not bad:
        return OverlapGate(
            True,
            REQUIRED_DEPTH,
            tuple(rows),
            f"F1 overlap met in all {len(rows)} pass(es) (client depth and server busy >= 2)",
        )
    first = bad[0]
    busy_text = "no server signal" if first.server_busy_max is None else first.server_busy_max
    return OverlapGate(
        False,
        REQUIRED_DEPTH,
        tuple(rows),
        f"F1 overlap not met in {len(bad)} of {len(rows)} pass(es); pass {first.index}: "
        f"client depth {first.client_max_depth}, server busy {busy_text} (need both >= 2)",
    )


# --------------------------------------------------------------------------- F2 floor


@dataclass(frozen=True)
class FloorGate:
    ok: bool
    required: float
    observed: float | None
    n_scored: int
    n_total: int
    reason: str


def completion_floor_gate(
    a: Mapping[str, Trial] | ArmColumns, passes: PassesLike, policy: GatePolicy
) -> FloorGate:
    """F2: the share of id x pass comparisons scored ``ok`` in both A and the pass."""
    total = scored = 0
    a_cols = as_arm_columns(a)
    a_ids = a_cols.trials.keys()
    for pc in as_pass_columns(passes):
        c_ids = pc.arm.trials.keys()
        # |A ids & pass ids| and |A ids | pass ids|, counted without building either set
        same = same_order(pc.arm.ids, a_cols.ids)  # then every id is common
        common = len(a_ids) if same else sum(map(a_ids.__contains__, pc.arm.ids))
        total += len(a_ids) + len(pc.arm.ids) - common
        # Scored in both: the common ids less those either side did not score.
        unscored = a_cols.not_ok | pc.arm.not_ok
        scored += common - sum(1 for i in unscored if i in a_ids and i in c_ids)
    required = policy.completion_floor
    if total == 0:
        return FloorGate(False, required, None, 0, 0, "F2 completion floor not met: no trials")
    observed = scored / total
    ok = Fraction(scored, total) >= exact_fraction(required)
    verb = "met" if ok else "not met"
    return FloorGate(
        ok,
        required,
        observed,
        scored,
        total,
        f"F2 completion floor {verb}: {scored}/{total} comparisons scored ok in both A and C "
        f"(need >= {required:.0%})",
    )


# --------------------------------------------------------------------------- F3 coverage


@dataclass(frozen=True)
class PassCoverage:
    index: int
    n_ids: int
    n_cobatched: int
    required: int
    missing_intervals: int
    ok: bool


@dataclass(frozen=True)
class CoverageGate:
    ok: bool
    margin_s: float
    fraction: float
    per_pass: tuple[PassCoverage, ...]
    reason: str


def required_cobatched(n_ids: int, fraction: float) -> int:
    """``max(2, ceil(fraction x n_ids))``, computed exactly."""
    return max(REQUIRED_DEPTH, math.ceil(exact_fraction(fraction) * n_ids))


def cobatched_by_pass(passes: PassesLike, margin: float) -> dict[int, IdSet]:
    """:func:`cobatched_of` for every pass, keyed by pass index (computed once, shared)."""
    return {pc.record.index: cobatched_of(pc, margin) for pc in as_pass_columns(passes)}


def coverage_gate(
    passes: PassesLike,
    policy: GatePolicy,
    cobatched: Mapping[int, IdSet] | None = None,
) -> CoverageGate:
    """F3: per pass, enough ids co-batched with a real margin; a missing interval fails.
    ``cobatched`` may pass in :func:`cobatched_by_pass` already computed for ``passes``."""
    margin = policy.overlap_margin_s
    columns = as_pass_columns(passes)
    co_sets = cobatched if cobatched is not None else cobatched_by_pass(columns, margin)
    rows: list[PassCoverage] = []
    for pc in columns:
        p = pc.record
        n_ids = len(p.trials)
        missing = pc.arm.n_untimed
        n_co = len(co_sets[p.index])
        required = required_cobatched(n_ids, policy.coverage_fraction)
        ok = missing == 0 and n_co >= required
        rows.append(PassCoverage(p.index, n_ids, n_co, required, missing, ok))
    if not rows:
        return CoverageGate(
            False, margin, policy.coverage_fraction, (), "F3 coverage not met: no C pass ran"
        )
    bad = [r for r in rows if not r.ok]
    if not bad:
        worst = min(rows, key=lambda r: (r.n_cobatched - r.required, r.index))
        return CoverageGate(
            True,
            margin,
            policy.coverage_fraction,
            tuple(rows),
            f"F3 co-batch coverage met in all {len(rows)} pass(es) "
            f"(lowest: pass {worst.index}, {worst.n_cobatched}/{worst.n_ids} ids, "
            f"need {worst.required})",
        )
    first = bad[0]
    if first.missing_intervals:
        detail = (
            f"pass {first.index}: {first.missing_intervals} trial(s) have no request interval "
            "so co-batching cannot be attributed"
        )
    else:
        detail = (
            f"pass {first.index}: {first.n_cobatched}/{first.n_ids} ids co-batched by "
            f">= {margin * 1000:g} ms, need {first.required}"
        )
    return CoverageGate(
        False,
        margin,
        policy.coverage_fraction,
        tuple(rows),
        f"F3 co-batch coverage not met in {len(bad)} of {len(rows)} pass(es); {detail}",
    )


# --------------------------------------------------------------------------- transport


@dataclass(frozen=True)
class TransportGate:
    ok: bool
    #: Transport failures per arm label ("A", "A_repeat", "B", "C[k]"), only non-zero ones.
    counts: Mapping[str, int]
    ids: tuple[str, ...]
    reason: str


def _arms(evidence: CellEvidence | EvidenceColumns) -> list[tuple[str, ArmColumns]]:
    """Every arm's columns with its label ("A", "A_repeat", "B", "C[k]"), in a fixed order."""
    columns = as_evidence_columns(evidence)
    arms: list[tuple[str, ArmColumns]] = [(ARM_A, columns.a)]
    if columns.a_repeat is not None:
        arms.append((ARM_A_REPEAT, columns.a_repeat))
    arms.append((ARM_B, columns.b))
    for pc in columns.passes:
        arms.append((f"{ARM_C}[{pc.record.index}]", pc.arm))
    return arms


def transport_gate(evidence: CellEvidence | EvidenceColumns) -> TransportGate:
    """No transport failure anywhere. They are never divergence, but they make GREEN
    impossible: a comparison that could not be made is not a clean one."""
    counts: dict[str, int] = {}
    ids: set[str] = set()
    modes: set[str] = set()
    for label, arm in _arms(evidence):
        failed = arm.transport
        if failed:
            counts[label] = len(failed)
            ids |= failed
            modes.update(arm.trials[test_id].failure_mode for test_id in failed)
    if not counts:
        return TransportGate(True, {}, (), "transport: no transport failures in any arm")
    where = _per_arm(counts)
    return TransportGate(
        False,
        counts,
        tuple(sorted(ids)),
        f"transport failures ({', '.join(sorted(modes))}) in {where}; they are not divergence "
        "but leave comparisons unmade, so GREEN is impossible",
    )


# --------------------------------------------------------------------------- prompt cache


@dataclass(frozen=True)
class PromptCacheGate:
    ok: bool
    #: Trials per arm label whose server reported ``timings.cache_n > 0``.
    counts: Mapping[str, int]
    ids: tuple[str, ...]
    reason: str
    #: Answered trials per arm label whose server reported no ``cache_n`` at all.
    unreported: Mapping[str, int] = field(default_factory=dict)


def _per_arm(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items())


def prompt_cache_gate(evidence: CellEvidence | EvidenceColumns) -> PromptCacheGate:
    """Every answered request must have evaluated its whole prompt: the server reported
    ``cache_n == 0``. A reused KV prefix means the arms did not compute the same thing, and a
    server that does not report ``cache_n`` leaves that unproven; either makes GREEN
    impossible. Transport failures are left to the transport gate."""
    counts: dict[str, int] = {}
    unreported: dict[str, int] = {}
    ids: set[str] = set()
    for label, arm in _arms(evidence):
        silent, reused = arm.cache_unreported, arm.cache_reused
        if silent:
            unreported[label] = len(silent)
        if reused:
            counts[label] = len(reused)
        ids.update(silent)
        ids.update(reused)
    if not counts and not unreported:
        return PromptCacheGate(
            True, {}, (), "prompt cache: every trial reported cache_n 0 (whole prompts evaluated)"
        )
    if counts:
        reason = (
            f"prompt cache: the server reused cached prompt tokens (cache_n > 0) in "
            f"{_per_arm(counts)} despite cache_prompt=false, so the arms did not compute the "
            "same thing; GREEN is impossible"
        )
    else:
        reason = (
            f"prompt cache: the server did not report timings.cache_n for "
            f"{_per_arm(unreported)} trial(s), so a reused prompt cache cannot be ruled out; "
            "GREEN is impossible"
        )
    return PromptCacheGate(False, counts, tuple(sorted(ids)), reason, unreported)
