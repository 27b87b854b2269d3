"""The prompt-cache arm through the pure core: every verdict branch it adds, its cert block,
and older certs (no cache arm) saying they did not measure the cache."""

from __future__ import annotations

from dataclasses import replace

from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive
from batch_invariance.cert.schema import canonical_json, cert_from_json, cert_to_json
from batch_invariance.core.cache_arm import REQUIRED_REUSE_SHARE, reuse_of
from batch_invariance.core.evidence import CellEvidence, PassRecord
from batch_invariance.core.verdict import (
    ANOMALY_CACHE,
    CLASS_CACHE,
    CLASS_CACHE_DRIFT,
    CLASS_CO_BATCHING,
    EngineAdvice,
    decide,
)
from tests.support.factories import (
    DEFAULT_POLICY,
    cert_for,
    changed,
    concurrent_pass,
    green_evidence,
    ids,
    replace_trial,
)

N_IDS = 32


def cache_pass(index: int = 0, reused: int = N_IDS, cache_n: float = 40.0) -> PassRecord:
    """A cache-arm pass equal to A in every field, whose first ``reused`` ids report
    ``cache_n`` reused prompt tokens (the rest 0)."""
    base = concurrent_pass(ids(N_IDS), index)
    trials = {
        t: replace(trial, timings={"cache_n": cache_n if k < reused else 0.0})
        for k, (t, trial) in enumerate(base.trials.items())
    }
    return replace(base, trials=trials)


def with_cache(evidence: CellEvidence, *passes: PassRecord) -> CellEvidence:
    return replace(evidence, cache_passes=passes or (cache_pass(),))


def cache_trial_changed(evidence: CellEvidence, test_id: str, **changes: object) -> CellEvidence:
    assert evidence.cache_passes is not None
    first, *rest = evidence.cache_passes
    trials = dict(first.trials)
    trials[test_id] = changed(trials[test_id], **changes)
    return replace(evidence, cache_passes=(replace(first, trials=trials), *rest))


def test_clean_cache_arm_with_proven_reuse_is_green_and_says_so() -> None:
    verdict = decide(with_cache(green_evidence()), DEFAULT_POLICY)
    assert verdict.status == "green"
    assert verdict.prompt_cache is not None and verdict.prompt_cache.status == "clean"
    assert verdict.prompt_cache.reuse.ok and verdict.prompt_cache.reuse.n_reused == N_IDS
    assert verdict.prompt_cache.reuse.tokens_reused == 40 * N_IDS
    assert any("prompt cache on: tokens and logprobs bitwise equal" in r
               for r in verdict.decision_reasons)  # fmt: skip


def test_too_little_reuse_is_unverified() -> None:
    low = int(N_IDS * REQUIRED_REUSE_SHARE) - 1
    verdict = decide(with_cache(green_evidence(), cache_pass(reused=low)), DEFAULT_POLICY)
    assert verdict.status == "green_unverified"
    assert verdict.prompt_cache is not None and verdict.prompt_cache.status == "unverified"
    assert not verdict.gates.cache_arm.ok
    assert any("prompt-cache reuse not proven" in r for r in verdict.decision_reasons)
    # Exactly the required share is enough.
    enough = decide(with_cache(green_evidence(), cache_pass(reused=low + 1)), DEFAULT_POLICY)
    assert enough.status == "green"


def test_unreported_reuse_counts_as_none() -> None:
    silent = cache_pass()
    silent = replace(silent, trials={t: replace(x, timings={}) for t, x in silent.trials.items()})
    reuse = reuse_of((silent,))
    assert not reuse.ok and reuse.n_unreported == N_IDS and reuse.n_reused == 0
    assert decide(with_cache(green_evidence(), silent), DEFAULT_POLICY).status == (
        "green_unverified"
    )


def test_cache_only_numeric_drift_is_amber_in_its_own_class() -> None:
    ev = with_cache(green_evidence())
    trial = ev.a["t005"]
    assert trial.token_logprobs is not None
    drifted = (trial.token_logprobs[0] - 1e-6, *trial.token_logprobs[1:])
    ev = cache_trial_changed(ev, "t005", token_logprobs=drifted)
    verdict = decide(ev, DEFAULT_POLICY, EngineAdvice(cache_off="--cache-off-flags"))
    assert verdict.status == "green_with_caveat"
    assert verdict.divergence_class == CLASS_CACHE_DRIFT
    assert verdict.anomaly == ANOMALY_CACHE
    assert verdict.prompt_cache is not None
    assert verdict.prompt_cache.cache_only_drift_ids == ("t005",)
    # the fix in the serving engine's words, given by the caller; the core names no engine
    fix = "the switch that fixes it is the prompt cache (--cache-off-flags in the deploy)"
    assert any(r.endswith(fix) for r in verdict.decision_reasons)
    plain = decide(ev, DEFAULT_POLICY).decision_reasons
    assert any(r.endswith("prompt cache (turned off in the deploy)") for r in plain)
    # a cert re-derives to the words of the engine it records
    cert, _ = cert_for(ev)
    assert any(
        "(--no-cache-prompt --cache-ram 0 in the deploy)" in r for r in cert.decision_reasons
    )


def test_cache_only_scored_change_is_red_prompt_cache() -> None:
    ev = cache_trial_changed(
        with_cache(green_evidence()), "t007", completion="other", extracted_answer="other",
        passed=False, score=0.0,
    )  # fmt: skip
    verdict = decide(ev, DEFAULT_POLICY)
    assert verdict.status == "failed"
    assert verdict.divergence_class == CLASS_CACHE
    assert verdict.prompt_cache is not None
    assert verdict.prompt_cache.status == "changed"
    assert verdict.prompt_cache.cache_only_divergent_ids == ("t007",)
    assert verdict.reports.ac.clean  # co-batching with the cache off changed nothing


def test_scored_change_still_red_when_reuse_is_low() -> None:
    ev = cache_trial_changed(
        with_cache(green_evidence(), cache_pass(reused=0)), "t007", extracted_answer="other"
    )
    assert decide(ev, DEFAULT_POLICY).status == "failed"


def test_cache_difference_where_co_batching_already_differs_is_not_the_caches() -> None:
    ev = with_cache(green_evidence())
    other = changed(ev.c_passes[0].trials["t003"], extracted_answer="other")
    ev = replace_trial(ev, "C", "t003", other, pass_index=0)
    ev = cache_trial_changed(ev, "t003", extracted_answer="other")
    verdict = decide(ev, DEFAULT_POLICY)
    assert verdict.status == "failed"
    assert verdict.divergence_class == CLASS_CO_BATCHING
    assert verdict.prompt_cache is not None
    assert verdict.prompt_cache.status == "with_co_batching"
    assert verdict.prompt_cache.with_co_batching_ids == ("t003",)


def test_transport_failure_in_the_cache_arm_is_unverified() -> None:
    ev = with_cache(green_evidence())
    assert ev.cache_passes is not None
    first = ev.cache_passes[0]
    trials = dict(first.trials)
    trials["t001"] = changed(trials["t001"], failure_mode="timeout", score=None, passed=None)
    ev = replace(ev, cache_passes=(replace(first, trials=trials),))
    verdict = decide(ev, DEFAULT_POLICY)
    assert verdict.status == "green_unverified"
    assert any("transport failure(s) in the cache arm" in r for r in verdict.decision_reasons)


def test_cert_carries_the_block_and_rederives() -> None:
    ev = with_cache(green_evidence())
    cert, _ = cert_for(ev)
    data = cert_to_json(cert)
    assert data["prompt_cache"]["status"] == "clean"
    assert data["prompt_cache"]["reuse"]["n_reused"] == N_IDS
    assert len(data["evidence"]["cache_passes"]) == 1
    assert data["gates"]["prompt_cache_arm"]["ok"] is True
    again = cert_from_json(canonical_json(data))
    assert cert_to_json(rederive(again, engine_advice)) == data


def test_cert_without_the_cache_arm_has_no_block() -> None:
    cert, verdict = cert_for(green_evidence())
    data = cert_to_json(cert)
    assert verdict.prompt_cache is None
    assert "prompt_cache" not in data and "cache_passes" not in data["evidence"]
    assert "prompt_cache_arm" not in data["gates"]


def test_b_sample_gate_needs_c_bitwise_equal_to_a_and_a_large_enough_sample() -> None:
    from batch_invariance.core.schedule import sample_ids

    ev = green_evidence()
    sample = sample_ids(ids(N_IDS), 0)
    sampled = replace(ev, b={t: ev.b[t] for t in sample}, b_ids=sample)
    assert len(sample) == 8
    assert decide(sampled, DEFAULT_POLICY).status == "green"
    # Too small a sample is the old rule: only RED can rest on it.
    small = replace(sampled, b={t: ev.b[t] for t in sample[:7]}, b_ids=sample[:7])
    assert decide(small, DEFAULT_POLICY).status == "green_unverified"
    # C drifting from A (logprobs only) makes the sample insufficient.
    trial = ev.c_passes[0].trials["t001"]
    assert trial.token_logprobs is not None
    moved = changed(
        trial, token_logprobs=(trial.token_logprobs[0] + 1e-7, *trial.token_logprobs[1:])
    )
    drifting = replace_trial(sampled, "C", "t001", moved)
    verdict = decide(drifting, DEFAULT_POLICY)
    assert not verdict.gates.b_scope.ok and verdict.status == "green_unverified"
    # A B difference on the sample still makes the cell AMBER.
    b_trial = changed(ev.b[sample[0]], extracted_answer="other")
    amber = replace(sampled, b={**sampled.b, sample[0]: b_trial})
    assert decide(amber, DEFAULT_POLICY).status == "green_with_caveat"
