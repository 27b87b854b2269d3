"""The comparison of two cells' arms A (core.compare): each class, and every refusal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batch_invariance.cert.compare_view import side_from_cert
from batch_invariance.core.compare import (
    CellSide,
    ClassCounts,
    compare_cells,
    fails_policy,
    not_comparable,
    worst_class,
)
from tests.support.factories import (
    REQUEST_TEMPLATE,
    changed,
    comparable_cert,
    green_evidence,
    make_trial,
    replace_trial,
    transport_failure,
)


def _side(evidence=None, **provenance) -> CellSide:  # type: ignore[no-untyped-def]
    return side_from_cert(comparable_cert(evidence, **provenance), "x.json")


def _new_a(test_id: str, trial):  # type: ignore[no-untyped-def]
    return _side(replace_trial(green_evidence(), "A", test_id, trial))


def test_identical_cells_are_identical_on_every_prompt() -> None:
    result = compare_cells(_side(), _side(binary_sha="22" * 32))
    assert result.comparable
    assert result.counts == ClassCounts(identical=32)
    assert result.changes == ()
    assert result.worst == "identical"


def test_logprob_drift_with_equal_tokens_names_first_drift_and_max_delta() -> None:
    base = make_trial("t005")
    lps = list(base.token_logprobs or ())
    lps[3] += 0.25
    lps[6] += 0.5
    result = compare_cells(_side(), _new_a("t005", replace(base, token_logprobs=tuple(lps))))
    assert result.counts == ClassCounts(identical=31, drift=1)
    (change,) = result.changes
    assert (change.test_id, change.prompt_class) == ("t005", "drift")
    assert change.first_drift == 3
    assert change.max_abs_delta == pytest.approx(0.5)
    assert result.worst == "drift"


def test_margin_drift_alone_is_drift() -> None:
    base = make_trial("t001")
    margins = list(base.top_margins or ())
    margins[0] = (margins[0] or 0.0) + 1e-7
    result = compare_cells(_side(), _new_a("t001", replace(base, top_margins=tuple(margins))))
    assert [c.prompt_class for c in result.changes] == ["drift"]
    assert result.changes[0].first_drift == 0


def test_changed_tokens_with_equal_scored_fields_is_tokens() -> None:
    base = make_trial("t007")
    text = "answer-t0X7"
    new = changed(base, completion=text, tokens=tuple(text), extracted_answer=base.extracted_answer)
    result = compare_cells(_side(), _new_a("t007", new))
    (change,) = result.changes
    assert change.prompt_class == "tokens"
    assert change.first_divergent_token == 9
    assert change.old_margin == base.top_margins[9]  # type: ignore[index]
    assert change.field is None
    assert result.worst == "tokens"


def test_changed_scored_field_names_field_old_new_token_and_margins() -> None:
    base = make_trial("t002")
    text = "answer-t9"
    new = changed(base, completion=text, tokens=tuple(text), extracted_answer=text, passed=False)
    result = compare_cells(_side(), _new_a("t002", new))
    (change,) = result.changes
    assert change.prompt_class == "scored"
    assert change.field == "passed"
    assert change.fields == ("passed", "extracted_answer")
    assert (change.old, change.new) == (True, False)
    assert change.first_divergent_token == 8
    assert change.old_margin is not None and change.new_margin is not None
    assert result.counts.scored == 1
    assert result.worst == "scored"


def test_missing_logprobs_is_unchecked_never_identical() -> None:
    base = make_trial("t004")
    new = replace(base, token_logprobs=None, top_margins=None)
    result = compare_cells(_side(), _new_a("t004", new))
    (change,) = result.changes
    assert change.prompt_class == "unchecked"
    assert "no logprobs" in (change.reason or "")
    assert result.worst == "unchecked"


def test_transport_failure_is_uncompared_and_fails_every_policy_but_never() -> None:
    result = compare_cells(_side(), _new_a("t009", transport_failure("t009")))
    (change,) = result.changes
    assert change.prompt_class == "uncompared"
    assert "new cert's arm A" in (change.reason or "")
    assert result.counts.identical == 31
    for fail_on in ("scored", "tokens", "drift"):
        assert fails_policy([result], fail_on)  # type: ignore[arg-type]
    assert fails_policy([result], "never") == ()


def test_policy_thresholds() -> None:
    base = make_trial("t002")
    text = "answer-t0x2"
    tokens_only = compare_cells(
        _side(),
        _new_a("t002", changed(base, completion=text, tokens=tuple(text),
                               extracted_answer=base.extracted_answer)),
    )  # fmt: skip
    assert fails_policy([tokens_only], "scored") == ()
    assert fails_policy([tokens_only], "tokens") == ("tiny-model ctx 2048 N 4: 1 prompt(s) tokens",)
    assert fails_policy([tokens_only], "drift")
    identical = compare_cells(_side(), _side())
    assert all(fails_policy([identical], p) == () for p in ("scored", "tokens", "drift"))  # type: ignore[arg-type]
    assert fails_policy([], "scored")  # nothing paired is never a pass


@pytest.mark.parametrize(
    ("provenance", "words"),
    [
        ({"model_file": {"path": "/m/x.gguf", "name": "x.gguf", "sha256": "ef" * 32}},
         "another model file"),
        ({"workset": {"sha256": "99" * 32}}, "another work-set"),
        ({"request_template": {**REQUEST_TEMPLATE, "max_tokens": 64}},
         "another answer budget (max_tokens 96 vs 64)"),
        ({"request_template": {**REQUEST_TEMPLATE, "temperature": 0.7}},
         "other sampling settings (temperature 0 vs 0.7)"),
        ({"request_template": {**REQUEST_TEMPLATE, "endpoint": "chat"}},
         "other sampling settings (endpoint 'completions' vs 'chat')"),
        ({"scorer_id": "contains"}, "another scorer (exact_match vs contains)"),
        ({"workset": {"n_items": 32}}, "work-set: a cert records no work-set sha256"),
        ({"request_template": None}, "sampling: a cert records no request template"),
    ],
)  # fmt: skip
def test_not_comparable_is_refused_with_the_reason(provenance, words) -> None:  # type: ignore[no-untyped-def]
    old = _side()
    new = _side(**provenance)
    if "model_file" in provenance:
        # the servers must have been started on that file for the cert to be valid
        new = replace(new, model_sha256=provenance["model_file"]["sha256"])
    result = compare_cells(old, new)
    assert not result.comparable
    assert any(words in why for why in result.not_comparable), result.not_comparable
    assert result.changes == () and result.counts.total == 0 and result.worst is None
    assert fails_policy([result], "scored")


def test_other_prompts_or_requests_are_not_comparable() -> None:
    old = _side()
    fewer = _side(green_evidence(n_ids=31))
    assert "other prompt ids (1 only in the baseline" in not_comparable(old, fewer)[0]
    keys = dict(old.request_keys)
    keys["t003"] = "sha256:" + "0" * 64
    assert (
        "the requests differ on 1 prompt(s) (first: t003)"
        in not_comparable(old, replace(old, request_keys=keys))[0]
    )
    unknown = {k: None for k in keys}
    assert "request keys not recorded" in not_comparable(old, replace(old, request_keys=unknown))[0]


def test_ctx_and_missing_model_sha_are_not_comparable() -> None:
    old = _side()
    assert "another context size" in not_comparable(old, replace(old, ctx=4096))[0]
    assert "model bytes are unknown" in not_comparable(old, replace(old, model_sha256=None))[0]


def test_ignored_template_keys_do_not_refuse() -> None:
    new = _side(request_template={**REQUEST_TEMPLATE, "timeout_s": 900.0})
    assert compare_cells(_side(), new).comparable


def test_worst_class_ranks() -> None:
    assert worst_class(ClassCounts(identical=3)) == "identical"
    assert worst_class(ClassCounts(identical=1, drift=2, tokens=1)) == "tokens"
    assert worst_class(ClassCounts(scored=1, drift=5)) == "scored"
    assert worst_class(ClassCounts(uncompared=2)) == "uncompared"
    assert worst_class(ClassCounts()) is None


def test_an_uncompared_prompt_is_never_reported_identical() -> None:
    assert worst_class(ClassCounts(identical=31, uncompared=1)) == "uncompared"
    assert worst_class(ClassCounts(tokens=3, uncompared=1)) == "uncompared"
    assert worst_class(ClassCounts(scored=1, uncompared=1)) == "scored"
