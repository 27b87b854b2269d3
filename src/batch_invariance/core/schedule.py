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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from batch_invariance.core import gates as g
from batch_invariance.core.diff import diff_pair
from batch_invariance.core.evidence import GatePolicy, ItemMeta, PassRecord, Trial


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
    a: Mapping[str, Trial], b: Mapping[str, Trial], items: Iterable[ItemMeta] = ()
) -> RepeatDecision:
    """Run A' only when B differs from A (invariant or token-only) or compares nothing."""
    ab = diff_pair("AB", a, b, items)
    if ab.n_compared == 0:
        return RepeatDecision(True, "A' ran: A and B had no id in common to compare")
    if ab.clean and ab.n_token_only == 0 and not ab.transport_skipped_ids:
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
