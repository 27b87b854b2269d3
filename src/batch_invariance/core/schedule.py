"""Which arms a cell still needs: the early stop once RED is proven, and the serial repeat A'
only where it decides something. Pure: the driver asks, these functions answer from the
evidence measured so far.

* :func:`red_proof`: one C pass whose comparison with A shows an invariant divergence, with
  that pass's own gates met (F1 overlap, F3 coverage) and no transport failure on the
  divergent ids, proves RED: row 1 of the verdict table holds whatever later passes show
  (a union over passes only grows). ``--stop-on-red`` ends the cell there.
* :func:`serial_repeat_decision`: A' tells run-to-run noise from slot allocation. When B
  (serial, on a second server instance) reproduced A exactly, two serial runs already agree
  and A' adds nothing to the verdict; A' runs only when B differs from A.
* :func:`b_first_ids`, :func:`b_scope_after` and :func:`arm_b_scope_gate`: B runs after the
  passes. When AC diverged (RED whatever B shows), B runs on the divergent ids alone, since
  it decides only their divergence class; when B reproduces A on all of them the cell ends
  there, else B runs on the rest too. A clean AC gets B on every id, or, where the plan asks
  and every C pass equals A bitwise, on a seeded sample (:mod:`batch_invariance.core.b_sample`).
  A cell whose B covers fewer ids than the work-set can be RED and nothing else, unless it is
  such a sample: the B-scope gate is then unmet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from batch_invariance.core import gates as g
from batch_invariance.core.b_sample import bitwise_equal_everywhere, sample_size
from batch_invariance.core.diff import PairReport, compare, diff_pair
from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta, PassRecord, Trial
from batch_invariance.core.numerics import compare_pair

__all__ = [
    "ArmBScopeGate",
    "BScope",
    "RedProof",
    "RepeatDecision",
    "arm_b_scope_gate",
    "b_first_ids",
    "b_scope_after",
    "red_proof",
    "reproduces",
    "restrict",
    "serial_repeat_decision",
]


@dataclass(frozen=True)
class RedProof:
    """Whether one C pass proved RED, and why (or why not)."""

    proven: bool
    pass_index: int
    divergent_ids: tuple[str, ...]
    reason: str


def red_proof(a: Mapping[str, Trial], pass_record: PassRecord, policy: GatePolicy) -> RedProof:
    """Whether ``pass_record`` alone proves the cell RED (see the module text)."""
    report = diff_pair("AC", a, pass_record.trials)
    ids = tuple(sorted({r.test_id for r in report.per_id if r.kind == "invariant"}))
    index = pass_record.index
    if not ids:
        return RedProof(False, index, (), f"pass {index}: no invariant divergence from A")
    transport = sorted(
        i
        for i in ids
        if (a.get(i) is not None and a[i].is_transport_failure)
        or (pass_record.trials.get(i) is not None and pass_record.trials[i].is_transport_failure)
    )
    if transport:
        return RedProof(
            False, index, ids, f"pass {index}: transport failure on divergent id {transport[0]}"
        )
    overlap = g.overlap_gate([pass_record])
    if not overlap.ok:
        return RedProof(False, index, ids, f"pass {index}: {overlap.reason}")
    coverage = g.coverage_gate([pass_record], policy)
    if not coverage.ok:
        return RedProof(False, index, ids, f"pass {index}: {coverage.reason}")
    return RedProof(
        True,
        index,
        ids,
        f"RED proven in pass {index}: {len(ids)} id(s) diverged from A in an invariant field "
        "with the pass's overlap and coverage met and no transport failure on them",
    )


@dataclass(frozen=True)
class RepeatDecision:
    """Whether to run the serial repeat A', and the reason the cert records."""

    run: bool
    reason: str


def serial_repeat_decision(
    a: Mapping[str, Trial],
    b: Mapping[str, Trial],
    items: Iterable[ItemMeta] = (),
    b_ids: Collection[str] | None = None,
) -> RepeatDecision:
    """Run A' only when B differs from A (invariant, token-only or in its logprobs) or
    compares nothing. ``b_ids``: the ids B ran on when a RED cell limited it (A is compared
    on those)."""
    ab = diff_pair("AB", restrict(a, b_ids), b, items)
    if ab.n_compared == 0:
        return RepeatDecision(True, "A' ran: A and B had no id in common to compare")
    drift = compare_pair("AB", a, [(None, b)]).drift_ids
    if reproduces(ab) and drift:
        return RepeatDecision(
            True,
            f"A' ran: B's logprobs drifted from A's on {len(drift)} id(s) with equal tokens; "
            "A' tells slot allocation from run-to-run noise",
        )
    if reproduces(ab):
        return RepeatDecision(
            False,
            f"A' skipped: B (serial, on a second server instance) reproduced A exactly on "
            f"all {ab.n_compared} id(s), so run-to-run is already clean",
        )
    n = len(set(ab.divergent_ids) | set(ab.token_divergence_ids) | set(ab.transport_skipped_ids))
    return RepeatDecision(
        True,
        f"A' ran: B differed from A on {n} id(s); A' tells slot allocation from run-to-run noise",
    )


def reproduces(ab: PairReport) -> bool:
    """B reproduced A exactly where they were compared: no invariant, token-only or
    transport difference."""
    return ab.clean and ab.n_token_only == 0 and not ab.transport_skipped_ids


def restrict(trials: Mapping[str, Trial], ids: Collection[str] | None) -> Mapping[str, Trial]:
    """``trials`` on ``ids`` only (all of them when ``ids`` is ``None``)."""
    if ids is None:
        return trials
    return {i: trials[i] for i in ids if i in trials}


def b_first_ids(a: Mapping[str, Trial], passes: Sequence[PassRecord]) -> tuple[str, ...] | None:
    """The ids arm B runs on first, once the passes are done: those that diverged from A on
    any pass run (row 1 is RED on AC alone, and B decides only their class; after an early
    stop they include the proof's); ``None`` when AC is clean, where a GREEN or an AMBER
    needs B on every id."""
    ac = compare("AC", a, [(p.index, p.trials) for p in passes])
    return tuple(ac.divergent_ids) or None


@dataclass(frozen=True)
class BScope:
    """Arm B's ids once it ran on the divergent ids: ``complete`` when B must still run on
    the rest."""

    b_ids: tuple[str, ...] | None
    complete: bool
    reason: str


def b_scope_after(a: Mapping[str, Trial], b: Mapping[str, Trial], ids: tuple[str, ...]) -> BScope:
    """After B ran on the divergent ``ids``: stop there when B reproduced A on every one of
    them (their class is then co-batching), else run B on the other ids as well."""
    ab = diff_pair("AB", restrict(a, ids), b)
    if ab.n_compared and reproduces(ab):
        return BScope(
            ids,
            False,
            f"B ran only on the {len(ids)} id(s) that diverged from A in the C passes and "
            "reproduced A on each: their divergence comes with co-batching",
        )
    return BScope(
        None,
        True,
        "B differed from A on an id that diverged in the C passes: B ran on every id, so the "
        "divergence class rests on the whole serial control",
    )


@dataclass(frozen=True)
class ArmBScopeGate:
    """Whether arm B ran on every id: a GREEN or an AMBER needs the whole serial control."""

    ok: bool
    #: ``True`` when the evidence names B's ids (B ran on a RED cell's divergent ids).
    scoped: bool
    n_b_ids: int
    n_items: int
    reason: str


def arm_b_scope_gate(evidence: CellEvidence) -> ArmBScopeGate:
    """Unmet when ``evidence.b_ids`` leaves out an id of the work-set."""
    n_items = len(evidence.items)
    if evidence.b_ids is None:
        return ArmBScopeGate(True, False, n_items, n_items, "arm B ran on every id")
    n = len(evidence.b_ids)
    if {m.test_id for m in evidence.items}.issubset(evidence.b_ids):
        return ArmBScopeGate(True, True, n, n_items, f"arm B ran on all {n_items} id(s)")
    if n >= sample_size(n_items) and bitwise_equal_everywhere(evidence.a, evidence.c_passes):
        return ArmBScopeGate(
            True,
            True,
            n,
            n_items,
            f"arm B ran on a sample of {n} of {n_items} id(s): every C pass equals A bitwise "
            f"at every compared position (a sample of at least {sample_size(n_items)} is "
            "enough to show slot allocation; any B difference on it still makes the cell AMBER)",
        )
    return ArmBScopeGate(
        False,
        True,
        n,
        n_items,
        f"arm B ran on {n} of {n_items} id(s) only (the ids that diverged from A in the C "
        "passes); that decides their divergence class and nothing else, so a clean "
        "comparison cannot rest on it",
    )
