"""The one promotability rule for a recorded gate policy: never looser than the defaults."""

from __future__ import annotations

import math

import pytest

from batch_invariance.cert.certificate import is_promotable
from batch_invariance.cert.store import render
from batch_invariance.cert.verify import verify
from batch_invariance.core.evidence import (
    DEFAULT_MAX_BOUND,
    DEFAULT_MIN_ANSWER_TOKENS,
    DEFAULT_MIN_HOT_TRIALS,
    GatePolicy,
    policy_problems,
)
from tests.support.factories import cert_for, green_evidence


def test_defaults_are_the_documented_numbers_and_acceptable() -> None:
    assert (DEFAULT_MIN_HOT_TRIALS, DEFAULT_MIN_ANSWER_TOKENS, DEFAULT_MAX_BOUND) == (30, 64, 0.10)
    assert policy_problems(GatePolicy()) == ()


@pytest.mark.parametrize(
    "stricter",
    [
        GatePolicy(min_hot_trials=31),
        GatePolicy(min_answer_tokens=200),
        GatePolicy(max_bound=0.05),
        GatePolicy(completion_floor=0.9, coverage_fraction=0.95, overlap_margin_s=0.01),
    ],
)
def test_stricter_is_always_acceptable(stricter: GatePolicy) -> None:
    assert policy_problems(stricter) == ()


@pytest.mark.parametrize(
    ("looser", "needle"),
    [
        (GatePolicy(min_hot_trials=1), "min_hot_trials 1 is looser than the default 30"),
        (GatePolicy(min_answer_tokens=3), "min_answer_tokens 3 is looser than the default 64"),
        (GatePolicy(max_bound=0.2), "max_bound 0.2 is looser than the default 0.1"),
        (GatePolicy(completion_floor=0.5), "completion_floor 0.5 is looser"),
        (GatePolicy(coverage_fraction=0.1), "coverage_fraction 0.1 is looser"),
        (GatePolicy(overlap_margin_s=0.0), "overlap_margin_s 0.0 is looser"),
        (GatePolicy(max_bound=math.nan), "max_bound is not a number"),
        (GatePolicy(logit_eps=0.01), "logit_eps 0.01 is looser than the default 0.0"),
    ],
)
def test_looser_names_what_is_looser(looser: GatePolicy, needle: str) -> None:
    problems = policy_problems(looser)
    assert len(problems) == 1 and needle in problems[0], problems


def test_a_green_live_cert_under_a_looser_policy_is_never_promotable() -> None:
    cert, verdict = cert_for()
    assert verdict.status == "green" and is_promotable(cert)
    for looser in (GatePolicy(min_hot_trials=1), GatePolicy(min_answer_tokens=8)):
        cert, verdict = cert_for(green_evidence(), policy=looser)
        assert verdict.status == "green"  # the verdict is shown ...
        assert cert.evidence.policy == looser  # ... the policy recorded ...
        assert not is_promotable(cert)  # ... and never promoted
        assert not cert.gates["F5"].ok and "looser than the default" in cert.gates["F5"].reason
        reasons = verify(render(cert)).promotable_reasons
        assert any("looser than the default" in r for r in reasons)
    cert, verdict = cert_for(green_evidence(), policy=GatePolicy(max_bound=0.5))
    assert verdict.status == "green" and not is_promotable(cert)
