"""The sequence-scope rule through the core: a GREEN covers only the lengths it measured."""

from __future__ import annotations

from dataclasses import replace

from batch_invariance.core.evidence import CellEvidence, GatePolicy, Trial, policy_problems
from batch_invariance.core.scope import (
    NOT_RECORDED,
    band_edges,
    required_length,
    scope_words,
    smallest_filled_slot,
)
from batch_invariance.core.verdict import decide
from tests.support.factories import (
    DEFAULT_POLICY,
    changed,
    concurrent_pass,
    green_evidence,
    ids,
    replace_trial,
    serial_map,
)


def test_the_required_length_is_three_quarters_of_the_slot_rounded_up() -> None:
    assert required_length(1024) == 768
    assert required_length(1023) == 768  # 767.25: a token short is short
    assert required_length(256) == 192
    assert required_length(1000, 0.5) == 500
    assert smallest_filled_slot(192) == 256
    assert band_edges(1024) == ((1, 256), (257, 512), (513, 768), (769, 1024))
    assert band_edges(10) == ((1, 3), (4, 5), (6, 8), (9, 10))


def test_a_short_green_becomes_unverified_naming_both_lengths() -> None:
    short = replace(green_evidence(), slot_ctx=1024)  # 12-token prompts + 80-token answers
    verdict = decide(short, DEFAULT_POLICY)
    assert verdict.status == "green_unverified"
    reason = next(r for r in verdict.decision_reasons if r.startswith("sequence length"))
    assert "longest co-batched sequence measured is 92 of the slot's 1024 tokens" in reason
    assert "need >= 768, 3/4 of the slot" in reason
    assert "--ctx 122 or less" in reason
    assert verdict.scope is not None and verdict.scope.longest == 92
    assert not verdict.gates.scope.ok and verdict.gates.scope.recorded


def test_a_cell_that_fills_its_slot_stays_green_and_says_how_far() -> None:
    full = green_evidence(slot_ctx=1024)
    verdict = decide(full, DEFAULT_POLICY)
    assert verdict.status == "green", verdict.decision_reasons
    scope = verdict.scope
    assert scope is not None and scope.longest is not None
    assert scope.longest >= 768 and scope.covered
    assert "over sequences up to 922 of the slot's 1024 tokens" in verdict.numerics.statement
    assert (
        f"sequences up to {scope.longest} >= 768 of the slot's 1024 tokens"
        in (verdict.decision_reasons[0])
    )
    # Every band was reached, none drifted.
    assert sum(b.rows_compared for b in scope.bands) == 64
    assert all(b.rows_compared for b in scope.bands)
    assert all(b.rows_with_drift == 0 for b in scope.bands)


def test_a_red_in_the_top_band_stays_red_and_the_band_names_it() -> None:
    full = green_evidence(slot_ctx=1024)
    top = sorted(full.a)[-1]
    red = replace_trial(full, "C", top, changed(full.c_passes[0].trials[top], passed=False))
    verdict = decide(red, DEFAULT_POLICY)
    assert verdict.status == "failed"
    assert verdict.scope is not None
    assert [b.rows_with_changed_answer for b in verdict.scope.bands] == [0, 0, 0, 1]


def test_a_short_red_stays_red() -> None:
    short = replace(green_evidence(), slot_ctx=4096)
    first = sorted(short.a)[0]
    red = replace_trial(short, "C", first, changed(short.c_passes[0].trials[first], score=0.0))
    assert decide(red, DEFAULT_POLICY).status == "failed"


def test_a_cell_that_records_no_slot_is_judged_as_before() -> None:
    verdict = decide(green_evidence(), DEFAULT_POLICY)
    assert verdict.status == "green"
    assert verdict.scope is None and not verdict.gates.scope.recorded
    assert "sequences up to" not in " ".join(verdict.decision_reasons)
    assert scope_words(None) == NOT_RECORDED


def test_an_unknown_length_covers_nothing() -> None:
    full = green_evidence(slot_ctx=1024)
    unknown = replace(
        full,
        a={t: replace(x, prompt_tokens_measured=None) for t, x in full.a.items()},
        b={t: replace(x, prompt_tokens_measured=None) for t, x in full.b.items()},
        a_repeat=None,
        c_passes=tuple(
            replace(
                p, trials={t: replace(x, prompt_tokens_measured=None) for t, x in p.trials.items()}
            )
            for p in full.c_passes
        ),
    )
    verdict = decide(unknown, DEFAULT_POLICY)
    assert verdict.status == "green_unverified"
    assert verdict.scope is not None and verdict.scope.longest is None
    assert any("no hot comparison reported its prompt" in r for r in verdict.decision_reasons)


def test_a_looser_slot_fill_can_be_green_but_is_never_promotable() -> None:
    short = replace(green_evidence(), slot_ctx=1024)
    loose = GatePolicy(min_slot_fill=0.05)
    verdict = decide(short, loose)
    assert verdict.status == "green"
    assert policy_problems(loose) == (
        "policy min_slot_fill 0.05 is looser than the default 0.75 (lower is looser)",
    )
    assert policy_problems(GatePolicy(min_slot_fill=0.9)) == ()


def _drifting(c: Trial, prompt: int, from_position: int) -> Trial:
    """``c`` with its logprobs moved from sequence position ``from_position`` on: from the
    token the model gave after reading that many tokens."""
    assert c.token_logprobs is not None
    start = max(0, from_position - prompt)
    values = tuple(v - 0.001 if i >= start else v for i, v in enumerate(c.token_logprobs))
    return replace(c, token_logprobs=values)


def _with_prompts(test_ids: list[str], prompts: dict[str, int]) -> CellEvidence:
    """Green evidence of a 512-token slot whose prompts have the given lengths (two passes,
    B as the serial repeat)."""
    return replace(
        green_evidence(),
        a=serial_map(test_ids, prompts),
        b=serial_map(test_ids, prompts),
        a_repeat=None,
        c_passes=tuple(concurrent_pass(test_ids, i, prompts=prompts) for i in range(2)),
        slot_ctx=512,
    )


def test_drift_that_starts_at_a_fixed_position_is_found_and_the_next_cell_named() -> None:
    test_ids = ids(32)
    # Half the prompts end just before position 257, half are short (their sequences end
    # before it); the factory's answers are 11 tokens with logprobs.
    prompts = {t: (250 + k % 6 if k < 16 else 40 + k) for k, t in enumerate(test_ids)}
    evidence = _with_prompts(test_ids, prompts)
    moved = tuple(
        replace(
            p,
            trials={
                t: _drifting(x, prompts[t], 257) if prompts[t] >= 246 else x
                for t, x in p.trials.items()
            },
        )
        for p in evidence.c_passes
    )
    verdict = decide(replace(evidence, c_passes=moved), DEFAULT_POLICY)
    scope = verdict.scope
    assert scope is not None
    assert scope.first_drift_position == 257
    assert scope.rows_drifting_at_first == 32  # 16 ids x 2 passes, each exactly at 257
    assert scope.bitwise_equal_up_to == 256
    assert "drift starts at a fixed position" in scope.statement
    assert "a slot of 256 tokens is the cell to measure next" in scope.statement
    low, high = scope.bands[1], scope.bands[2]  # 129-256 and 257-384
    assert (low.rows_with_drift, high.rows_with_drift) == (0, 32)
    assert high.first_drift_position == 257


def test_one_prompt_drifting_in_every_pass_is_no_fixed_position() -> None:
    test_ids = ids(32)
    prompts = {t: (250 if k == 0 else 40 + k) for k, t in enumerate(test_ids)}
    evidence = _with_prompts(test_ids, prompts)
    moved = tuple(
        replace(p, trials={**p.trials, "t000": _drifting(p.trials["t000"], 250, 257)})
        for p in evidence.c_passes
    )
    scope = decide(replace(evidence, c_passes=moved), DEFAULT_POLICY).scope
    assert scope is not None and scope.first_drift_position == 257
    assert scope.rows_drifting_at_first == 2 and scope.bitwise_equal_up_to is None
    assert "fixed position" not in scope.statement
