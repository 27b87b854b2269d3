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
* :func:`b_opening`, :func:`b_scope_after` and :func:`arm_b_scope_gate`: B runs after the
  passes. When AC diverged (RED whatever B shows), B runs on the divergent ids alone, since
  it decides only their divergence class; when B reproduces A on all of them the cell ends
  there, else B runs on the rest too. A clean AC gets B on every id, or, where the plan asks
  and every C pass equals A bitwise, on a seeded sample (:func:`b_opening` decides which).
  A cell whose B covers fewer ids than the work-set can be RED and nothing else, unless it is
  such a sample: the B-scope gate is then unmet.

Arm B on a seeded sample (pure): what pays for the prompt-cache arm.

B (serial, on the ``--parallel N`` server) is the slot-allocation control. When every C pass
equals A bitwise at every compared position (scored fields, tokens and pre-sampling logprobs,
every id answered with logprobs), B can only turn a GREEN into an AMBER, and a slot-allocation
effect that changes the numerics shows on nearly every row it touches. B then runs on a
seeded sample of :func:`sample_size` ids instead of all of them; any B difference on the
sample still makes the cell AMBER (row 3), and the cert says B ran on a sample
(``evidence.b_ids``, ``provenance.schedule.b_reason``).

The serial-repeat control (pure): before anything is GREEN, the reference must reproduce
itself when serial, in its tokens, answers and numerics.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from batch_invariance.core import gates as g
from batch_invariance.core.diff import PairReport, compare, diff_pair
from batch_invariance.core.evidence import CellEvidence, GatePolicy, ItemMeta, PassRecord, Trial
from batch_invariance.core.numerics import PairNumerics, compare_pair, has_logprobs

__all__ = [
    "SAMPLE_MIN",
    "SAMPLE_SHARE",
    "ArmBScopeGate",
    "BOpening",
    "BScope",
    "RedProof",
    "RepeatDecision",
    "SerialRepeatGate",
    "arm_b_scope_gate",
    "b_first_ids",
    "b_opening",
    "b_scope_after",
    "bitwise_equal_everywhere",
    "red_proof",
    "reproduces",
    "restrict",
    "sample_ids",
    "sample_size",
    "serial_repeat_decision",
    "serial_repeat_gate",
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


#: B's sample: at least this many ids, and at least this share of the work-set.
SAMPLE_MIN = 8
SAMPLE_SHARE = Fraction(1, 4)


def sample_size(n_items: int) -> int:
    """``min(n, max(SAMPLE_MIN, ceil(n / 4)))``."""
    return min(n_items, max(SAMPLE_MIN, math.ceil(SAMPLE_SHARE * n_items)))


@dataclass(frozen=True)
class BOpening:
    """Where arm B starts once the C passes are done: on the ids that diverged from A
    (``first_ids``), on a seeded ``sample`` (every C pass equals A bitwise), or on every id
    (both ``None``)."""

    first_ids: tuple[str, ...] | None
    sample: BScope | None


def b_opening(
    a: Mapping[str, Trial],
    passes: Sequence[PassRecord],
    ids: Sequence[str],
    *,
    sample: bool,
    seed: int,
) -> BOpening:
    """The one decision of where B starts: the divergent ids when AC diverged
    (:func:`b_first_ids`); else, when ``sample`` is asked for and every C pass equals A
    bitwise (:func:`bitwise_equal_everywhere`), the seeded sample of ``ids`` unless it is all
    of them; else every id."""
    first_ids = b_first_ids(a, passes)
    if first_ids is not None:
        return BOpening(first_ids, None)
    if not sample or not bitwise_equal_everywhere(a, passes):
        return BOpening(None, None)
    chosen = sample_ids(ids, seed)
    if len(chosen) == len(ids):
        return BOpening(None, None)
    reason = (
        f"B ran on a seeded sample of {len(chosen)} of {len(ids)} id(s): every C pass "
        "equals A bitwise at every compared position"
    )
    return BOpening(None, BScope(chosen, False, reason))


def sample_ids(ids: Sequence[str], seed: int) -> tuple[str, ...]:
    """The seeded sample of ``ids`` (in their own order): the ids with the smallest
    ``sha256(f"{seed}:b-sample:{id}")``, the same on every run and machine."""
    k = sample_size(len(ids))
    rank = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:b-sample:{i}".encode()).digest())
    chosen = set(rank[:k])
    return tuple(i for i in ids if i in chosen)


def bitwise_equal_everywhere(a: Mapping[str, Trial], passes: Sequence[PassRecord]) -> bool:
    """Every C pass holds every id of A, answered, with logprobs at every token, and equal to
    A in every scored field, in its tokens and in its logprobs, bitwise."""
    if not passes or not a:
        return False
    for p in passes:
        if p.trials.keys() != a.keys():
            return False
        trials = [*a.values(), *p.trials.values()]
        if any(t.is_transport_failure or not has_logprobs(t) for t in trials):
            return False
    maps = [(p.index, p.trials) for p in passes]
    ac = compare("AC", a, maps)
    if not ac.clean or ac.n_token_only:
        return False
    return not compare_pair("AC", a, maps).drift_ids


@dataclass(frozen=True)
class SerialRepeatGate:
    """The A vs A' control: the reference must reproduce itself before anything is GREEN."""

    ran: bool
    ok: bool
    n_divergent: int
    n_token_only: int
    ids: tuple[str, ...]
    reason: str
    #: Ids whose numerics drifted between A and A' (beyond ``logit_eps``) with equal tokens.
    n_numeric_drift: int = 0


def _both_present(report: PairReport) -> int:
    """Ids the report compared with a trial on both sides (a missing id repeats nothing)."""
    return report.n_compared - len(set(report.only_x) | set(report.only_y))


def serial_repeat_gate(
    aa: PairReport | None,
    ab: PairReport,
    aa_numerics: PairNumerics | None = None,
    eps: float = 0.0,
) -> SerialRepeatGate:
    """A GREEN needs a serial repeat that agrees with A: A' (same server) or, when A' was not
    run, arm B (serial, on the other server). Any A vs A' difference (numeric drift beyond
    ``eps`` included) makes GREEN impossible; so does having neither repeat. (A B that
    disagrees with A is row 3, AMBER.)"""
    if aa is None:
        if _both_present(ab) == 0:
            return SerialRepeatGate(
                False, False, 0, 0, (),
                "serial repeat not met: neither A' nor B compared any id with A, so nothing "
                "shows that A reproduces itself when serial",
            )  # fmt: skip
        return SerialRepeatGate(
            False, True, 0, 0, (),
            f"serial repeat A' not run; arm B (serial) is the repeat ({_both_present(ab)} id(s))",
        )  # fmt: skip
    ids = tuple(sorted(set(aa.divergent_ids) | set(aa.token_divergence_ids)))
    if _both_present(aa) == 0:
        return SerialRepeatGate(
            True, False, 0, 0, (), "serial repeat not met: A' compared no id with A"
        )
    drift = aa_numerics.drift_ids_beyond(eps) if aa_numerics is not None else ()
    if not ids and drift:
        return SerialRepeatGate(
            True, False, 0, 0, drift,
            f"serial repeat: A' drifts numerically from A on {len(drift)} id(s) with equal "
            "tokens and no batching at all; run-to-run numeric nondeterminism makes GREEN "
            "impossible",
            len(drift),
        )  # fmt: skip
    if not ids:
        return SerialRepeatGate(
            True, True, 0, 0, (), "serial repeat: A' reproduced A exactly (run-to-run clean)"
        )
    return SerialRepeatGate(
        True,
        False,
        aa.n_divergent,
        aa.n_token_only,
        ids,
        f"serial repeat: A' differs from A on {len(ids)} id(s) "
        f"({aa.n_divergent} invariant, {aa.n_token_only} token-only) with no batching at all; "
        "run-to-run nondeterminism makes GREEN impossible",
    )
