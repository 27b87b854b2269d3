"""Which arms a cell runs: the early stop once RED is proven, and A' only where it decides."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from batch_invariance.cert.verify import verify
from batch_invariance.core.evidence import GatePolicy, PassRecord
from batch_invariance.core.schedule import red_proof, serial_repeat_decision
from batch_invariance.core.verdict import decide
from batch_invariance.service.mock_cell import MOCK_MEASUREMENT, MockRequest, run_mock_cell
from tests.support.factories import green_evidence, serial_map

#: Loose on answer length and distinct prompts: the mock answers in a few tokens, 16 prompts.
POLICY = GatePolicy(min_answer_tokens=1, max_bound=1.0)


def _diverge(record: PassRecord, test_id: str, **change: object) -> PassRecord:
    trials = dict(record.trials)
    trials[test_id] = replace(trials[test_id], **change)  # type: ignore[arg-type]
    return replace(record, trials=trials)


def test_a_divergent_pass_with_its_gates_met_proves_red() -> None:
    ev = green_evidence(n_ids=20, n_passes=2)
    first = _diverge(ev.c_passes[0], ev.items[0].test_id, extracted_answer="changed")
    proof = red_proof(ev.a, first, POLICY)
    assert proof.proven and proof.pass_index == first.index
    assert proof.divergent_ids == (ev.items[0].test_id,)
    # The verdict on the cut-short evidence is RED as well: the stop never changes it.
    assert decide(replace(ev, c_passes=(first,)), POLICY).status == "failed"


def test_a_clean_pass_proves_nothing() -> None:
    ev = green_evidence(n_ids=20, n_passes=1)
    assert not red_proof(ev.a, ev.c_passes[0], POLICY).proven


def test_a_divergence_without_overlap_proves_nothing() -> None:
    ev = green_evidence(n_ids=20, n_passes=1)
    first = _diverge(ev.c_passes[0], ev.items[0].test_id, extracted_answer="changed")
    proof = red_proof(ev.a, replace(first, server_busy_max=1), POLICY)
    assert not proof.proven and "overlap" in proof.reason


def test_a_divergence_without_coverage_proves_nothing() -> None:
    ev = green_evidence(n_ids=20, n_passes=1)
    first = _diverge(ev.c_passes[0], ev.items[0].test_id, extracted_answer="changed")
    # Intervals gone: co-batching can no longer be attributed (F3 fails).
    bare = {k: replace(t, dispatch_ts=None, complete_ts=None) for k, t in first.trials.items()}
    proof = red_proof(ev.a, replace(first, trials=bare, server_busy_max=4), POLICY)
    assert not proof.proven


def test_a_transport_failure_is_not_a_proof() -> None:
    ev = green_evidence(n_ids=20, n_passes=1)
    first = _diverge(ev.c_passes[0], ev.items[0].test_id, failure_mode="timeout", score=None)
    assert not red_proof(ev.a, first, POLICY).proven


def test_a_repeat_is_skipped_only_when_b_reproduces_a_exactly() -> None:
    ev = green_evidence(n_ids=10, n_passes=1)
    skip = serial_repeat_decision(ev.a, ev.b)
    assert not skip.run and skip.reason.startswith("A' skipped")
    tid = ev.items[0].test_id
    invariant = dict(ev.b)
    invariant[tid] = replace(invariant[tid], extracted_answer="other")
    assert serial_repeat_decision(ev.a, invariant).run
    token_only = dict(ev.b)
    token_only[tid] = replace(token_only[tid], completion="other text", content_sha256=None)
    assert serial_repeat_decision(ev.a, token_only).run
    transport = dict(ev.b)
    transport[tid] = replace(transport[tid], failure_mode="timeout")
    assert serial_repeat_decision(ev.a, transport).run
    assert serial_repeat_decision(serial_map([]), serial_map([])).run


def test_stop_on_red_ends_a_divergent_mock_after_one_pass(tmp_path: Path) -> None:
    finished = run_mock_cell(
        MockRequest(
            out_dir=tmp_path,
            batch_divergence=True,
            measurement=replace(MOCK_MEASUREMENT, stop_on_red=True, gate_passes=4),
        )
    )
    cert = finished.cert
    assert cert.verdict == "RED" and cert.n_passes == 1
    schedule = cert.provenance.schedule
    assert schedule is not None and schedule.passes_planned == 4 and schedule.passes_run == 1
    assert schedule.stopped_early is True and "RED proven in pass 0" in str(schedule.stop_reason)
    # The rate is over the pass actually run, and the cert re-derives on its own.
    assert cert.sensitivity.n_scored_comparisons == len(cert.evidence.a)
    assert verify(finished.path).problems == ()


def test_stop_on_red_runs_every_pass_of_a_green_mock(tmp_path: Path) -> None:
    finished = run_mock_cell(
        MockRequest(
            out_dir=tmp_path,
            policy=POLICY,
            measurement=replace(MOCK_MEASUREMENT, stop_on_red=True, gate_passes=4),
        )
    )
    assert finished.cert.verdict == "GREEN" and finished.cert.n_passes == 4
    schedule = finished.cert.provenance.schedule
    assert schedule is not None and schedule.stopped_early is False


def test_without_stop_on_red_a_divergent_mock_runs_every_pass(tmp_path: Path) -> None:
    finished = run_mock_cell(
        MockRequest(
            out_dir=tmp_path,
            batch_divergence=True,
            measurement=replace(MOCK_MEASUREMENT, gate_passes=3),
        )
    )
    assert finished.cert.verdict == "RED" and finished.cert.n_passes == 3
    schedule = finished.cert.provenance.schedule
    assert schedule is not None and schedule.stopped_early is False
