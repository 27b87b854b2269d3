"""Arm B after the passes: on a RED cell only on the ids that diverged (it decides their
class and nothing else), and a cert whose B covers a subset can be RED and nothing else."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from batch_invariance.cert.certificate import cert_to_json
from batch_invariance.cert.verify import verify
from batch_invariance.core.evidence import CellEvidence, GatePolicy
from batch_invariance.core.schedule import (
    BOpening,
    arm_b_scope_gate,
    b_first_ids,
    b_opening,
    b_scope_after,
    red_proof,
    sample_ids,
    serial_repeat_decision,
)
from batch_invariance.core.verdict import CLASS_CO_BATCHING, CLASS_SLOT, decide
from batch_invariance.mock import MockKnobs
from tests.support.factories import cert_for, green_evidence
from tests.unit.service.test_sweep import _sweep

#: Loose on answer length and distinct prompts: the mock answers in a few tokens.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0, min_slot_fill=0.0)


def _scoped(ev: CellEvidence, ids: tuple[str, ...]) -> CellEvidence:
    return replace(ev, b={i: ev.b[i] for i in ids}, b_ids=ids)


def _red_evidence(n_ids: int = 40) -> tuple[CellEvidence, str]:
    """One pass whose first id diverged from A: RED with every gate of the pass met."""
    ev = green_evidence(n_ids=n_ids, n_passes=1)
    tid = ev.items[0].test_id
    first = ev.c_passes[0]
    trials = dict(first.trials)
    trials[tid] = replace(trials[tid], extracted_answer="changed")
    return replace(ev, c_passes=(replace(first, trials=trials),)), tid


def test_a_red_on_b_scoped_to_the_divergent_id_is_co_batching() -> None:
    ev, tid = _red_evidence()
    v = decide(_scoped(ev, (tid,)), GatePolicy())
    assert v.status == "failed" and v.divergence_class == CLASS_CO_BATCHING
    assert "AB clean on the 1 divergent id(s) B ran on" in v.decision_reasons[1]
    # AB and BC compare the scoped id only: the ids B did not run on are not "missing".
    assert v.reports.ab.n_compared == 1 and v.reports.ab.clean
    assert v.reports.bc.n_compared == 1 and not v.reports.bc.clean
    assert not v.gates.b_scope.ok and v.gates.b_scope.scoped


def test_a_red_whose_scoped_b_differs_from_a_is_slot_allocation() -> None:
    ev, tid = _red_evidence()
    scoped = _scoped(ev, (tid,))
    b = {tid: replace(scoped.b[tid], extracted_answer="other")}
    v = decide(replace(scoped, b=b), GatePolicy())
    assert v.status == "failed" and v.divergence_class == CLASS_SLOT


def test_a_clean_cell_with_b_on_a_subset_is_unverified_never_green() -> None:
    ev = green_evidence(n_ids=40, n_passes=2)
    assert decide(ev, GatePolicy()).status == "green"
    scoped = _scoped(ev, (ev.items[0].test_id,))
    v = decide(scoped, GatePolicy())
    assert v.status == "green_unverified"
    assert any("arm B ran on 1 of 40 id(s) only" in r for r in v.decision_reasons)
    # A B on a subset hides the AB difference that makes a full run AMBER: still UNVERIFIED.
    tid = ev.items[5].test_id
    amber = replace(ev, b={**ev.b, tid: replace(ev.b[tid], extracted_answer="x")})
    assert decide(amber, GatePolicy()).status == "green_with_caveat"
    assert decide(_scoped(amber, (ev.items[0].test_id,)), GatePolicy()).status == (
        "green_unverified"
    )


def test_b_ids_naming_every_id_is_the_whole_serial_control() -> None:
    ev = green_evidence(n_ids=40, n_passes=2)
    every = replace(ev, b_ids=tuple(m.test_id for m in ev.items))
    assert arm_b_scope_gate(every).ok
    assert decide(every, GatePolicy()).status == "green"


def test_b_runs_first_on_the_ids_that_diverged_in_any_pass_else_on_all() -> None:
    ev, tid = _red_evidence()
    assert red_proof(ev.a, ev.c_passes[0], GatePolicy()).divergent_ids == (tid,)
    assert b_first_ids(ev.a, ev.c_passes) == (tid,)
    # Gates met or not, and over every pass run: an earlier pass's divergence counts too.
    bare = replace(ev.c_passes[0], server_busy_max=1)
    other = ev.items[1].test_id
    later = dict(ev.c_passes[0].trials)
    later[other] = replace(later[other], extracted_answer="changed")
    second = replace(ev.c_passes[0], index=1, trials=later)
    assert b_first_ids(ev.a, [bare, second]) == tuple(sorted((tid, other)))
    clean = green_evidence(n_ids=10, n_passes=2)
    assert b_first_ids(clean.a, clean.c_passes) is None


def test_b_scope_stops_only_when_b_reproduces_a_on_every_divergent_id() -> None:
    ev, tid = _red_evidence()
    clean = b_scope_after(ev.a, {tid: ev.b[tid]}, (tid,))
    assert clean.b_ids == (tid,) and not clean.complete
    differs = b_scope_after(ev.a, {tid: replace(ev.b[tid], score=0.0)}, (tid,))
    assert differs.b_ids is None and differs.complete
    failed = b_scope_after(ev.a, {tid: replace(ev.b[tid], failure_mode="timeout")}, (tid,))
    assert failed.complete
    token_only = replace(ev.b[tid], completion="other text", content_sha256=None)
    assert b_scope_after(ev.a, {tid: token_only}, (tid,)).complete


def test_a_repeat_decision_compares_a_on_the_ids_b_ran_on() -> None:
    ev, tid = _red_evidence()
    scoped = {tid: ev.b[tid]}
    # Without the scope, every id B did not run on reads as missing: A' would run for nothing.
    assert serial_repeat_decision(ev.a, scoped).run
    assert not serial_repeat_decision(ev.a, scoped, b_ids=(tid,)).run


def test_a_scoped_cert_verifies_and_dropping_its_b_ids_is_caught(tmp_path: Path) -> None:
    ev, tid = _red_evidence()
    cert, _ = cert_for(_scoped(ev, (tid,)))
    data = cert_to_json(cert)
    assert data["evidence"]["b_ids"] == [tid]
    assert data["gates"]["arm_b_scope"]["ok"] is False
    assert verify(json.dumps(data)).problems == ()
    del data["evidence"]["b_ids"]
    assert verify(json.dumps(data)).problems != ()


def test_a_cert_with_b_on_every_id_has_no_b_scope_keys() -> None:
    data = cert_to_json(cert_for(green_evidence(n_ids=10, n_passes=1))[0])
    assert "b_ids" not in data["evidence"] and "arm_b_scope" not in data["gates"]


#: Co-batching changes the arithmetic prompts only: C diverges from A on those, B does not.
ARITH_ONLY = MockKnobs(
    cobatch_divergence=True, cobatch_divergence_if_contains=(" + ", " * ", " - ")
)


def _arith_ids(cert_ids: tuple[str, ...]) -> bool:
    return all(i.startswith("arith-") for i in cert_ids)


def test_stop_on_red_runs_b_on_the_divergent_ids_only(tmp_path: Path) -> None:
    _, cells = _sweep(tmp_path, ARITH_ONLY, (2,), stop_on_red=True)
    (cell,) = cells
    assert cell.finished is not None and cell.verification is not None
    cert = cell.finished.cert
    schedule = cert.provenance.schedule
    proof_ids = tuple(cert.divergence_report.ac.divergent_ids)
    assert cert.verdict == "RED" and cert.divergence_class == CLASS_CO_BATCHING
    assert cert.n_passes == 1 and proof_ids and _arith_ids(proof_ids)
    assert cert.evidence.b_ids == proof_ids == tuple(sorted(cert.evidence.b))
    assert schedule is not None and schedule.b_ids == proof_ids
    assert "and reproduced A on each" in str(schedule.b_reason)
    b_arm = next(arm for arm in cert.provenance.arms or () if arm["arm"] == "B")
    assert b_arm["n_requests"] == len(proof_ids) < len(cert.evidence.a)
    assert cert.gates["arm_b_scope"].ok is False
    assert cell.verification.problems == ()


def test_b_runs_on_every_id_when_it_differs_from_a_on_a_divergent_one(tmp_path: Path) -> None:
    # 17 + 25 changes on any server with several slots: B differs from A there, as C does.
    knobs = replace(ARITH_ONLY, slot_divergence_if_contains=("17 + 25",))
    _, cells = _sweep(tmp_path, knobs, (2,), stop_on_red=True)
    (cell,) = cells
    assert cell.finished is not None and cell.verification is not None
    cert = cell.finished.cert
    assert cert.verdict == "RED" and cert.n_passes == 1
    assert "arith-add-1" in cert.divergence_report.ac.divergent_ids
    assert cert.evidence.b_ids is None and len(cert.evidence.b) == len(cert.evidence.a)
    assert cert.divergence_report.ab.divergent_ids == ("arith-add-1",)
    assert cert.divergence_class is not None and CLASS_SLOT in cert.divergence_class
    schedule = cert.provenance.schedule
    assert schedule is not None and "B ran on every id" in str(schedule.b_reason)
    b_arm = next(arm for arm in cert.provenance.arms or () if arm["arm"] == "B")
    assert b_arm["n_requests"] == len(cert.evidence.a)
    assert "arm_b_scope" not in cert.gates
    assert cell.verification.problems == ()


def test_a_full_red_run_runs_b_on_the_ids_that_diverged_in_any_pass(tmp_path: Path) -> None:
    _, cells = _sweep(tmp_path, ARITH_ONLY, (2,))
    (cell,) = cells
    assert cell.finished is not None and cell.verification is not None
    cert = cell.finished.cert
    divergent = tuple(cert.divergence_report.ac.divergent_ids)
    assert cert.verdict == "RED" and cert.n_passes == 3 and _arith_ids(divergent)
    assert cert.evidence.b_ids == divergent and cert.divergence_class == CLASS_CO_BATCHING
    schedule = cert.provenance.schedule
    assert schedule is not None and schedule.stopped_early is False
    assert cell.verification.problems == ()


def test_a_clean_run_runs_b_on_every_id(tmp_path: Path) -> None:
    _, cells = _sweep(tmp_path, MockKnobs(), (2,), stop_on_red=True)
    (cell,) = cells
    assert cell.finished is not None
    cert = cell.finished.cert
    assert cert.verdict == "GREEN" and cert.evidence.b_ids is None
    assert len(cert.evidence.b) == len(cert.evidence.a)
    schedule = cert.provenance.schedule
    assert schedule is not None and schedule.b_reason == "B ran on every id: AC was clean"


def test_b_opening_is_the_divergent_ids_a_seeded_sample_or_every_id() -> None:
    red, tid = _red_evidence()
    ids = [i.test_id for i in red.items]
    opening = b_opening(red.a, red.c_passes, ids, sample=True, seed=0)
    assert opening == BOpening((tid,), None)  # AC diverged: B starts there, sample or not

    clean = green_evidence(n_ids=40, n_passes=2)
    ids = [i.test_id for i in clean.items]
    sampled = b_opening(clean.a, clean.c_passes, ids, sample=True, seed=0)
    assert sampled.first_ids is None and sampled.sample is not None
    assert sampled.sample.b_ids == sample_ids(ids, 0) and len(sampled.sample.b_ids) < len(ids)
    assert "seeded sample of 10 of 40 id(s)" in sampled.sample.reason
    assert sampled == b_opening(clean.a, clean.c_passes, ids, sample=True, seed=0)

    assert b_opening(clean.a, clean.c_passes, ids, sample=False, seed=0) == BOpening(None, None)
    # A sample as large as the work-set is no sample: B runs on every id.
    few = ids[:4]
    a_few = {i: clean.a[i] for i in few}
    passes = [replace(p, trials={i: p.trials[i] for i in few}) for p in clean.c_passes]
    assert b_opening(a_few, passes, few, sample=True, seed=0) == BOpening(None, None)
