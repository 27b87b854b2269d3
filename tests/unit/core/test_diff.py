"""Pairwise reports: what counts as divergent, token-only, skipped; union over passes."""

from __future__ import annotations

from batch_invariance.core.diff import EXCERPT_CHARS, compare, diff_pair, first_divergent_token
from batch_invariance.core.evidence import INVARIANT_FIELDS, ItemMeta
from tests.support.factories import changed, make_trial, transport_failure


def _maps(n: int = 4) -> dict[str, object]:
    return {f"i{k}": make_trial(f"i{k}") for k in range(n)}


def test_identical_maps_are_clean() -> None:
    x = _maps()
    r = diff_pair("AB", x, dict(x))
    assert r.clean and r.n_compared == 4 and r.n_divergent == 0 and r.per_id == ()
    assert r.divergence_rate == 0.0 and r.n_token_only == 0


def test_each_invariant_field_change_is_a_divergence_naming_the_field() -> None:
    values = {
        "score": 0.0,
        "passed": False,
        "extracted_answer": "other",
        "expected_answer": "other",
        "prompt_tokens_measured": 13,
        "failure_mode": "empty",
    }
    assert set(values) == set(INVARIANT_FIELDS)
    for field, value in values.items():
        x = _maps()
        y = dict(x)
        y["i1"] = changed(x["i1"], **{field: value})
        r = diff_pair("AB", x, y)
        assert r.divergent_ids == ("i1",), field
        (row,) = r.per_id
        assert row.kind == "invariant" and row.field == field and row.fields == (field,)
        assert row.x == getattr(x["i1"], field) and row.y == value


def test_bool_and_int_are_not_the_same_value() -> None:
    x = {"a": make_trial("a", score=1.0, passed=True)}
    y = {"a": changed(x["a"], passed=1)}
    assert diff_pair("AB", x, y).n_divergent == 1


def test_id_in_only_one_map_is_a_divergence() -> None:
    x = _maps(3)
    y = dict(x)
    del y["i0"]
    y["extra"] = make_trial("extra")
    r = diff_pair("AB", x, y)
    assert r.divergent_ids == ("extra", "i0")
    assert r.only_x == ("i0",) and r.only_y == ("extra",)
    assert {row.field for row in r.per_id} == {"presence"}


def test_content_change_with_equal_invariants_is_token_only() -> None:
    x = {"a": make_trial("a", completion="same words", extracted_answer="X")}
    y = {"a": changed(x["a"], completion="other words")}
    r = diff_pair("AB", x, y)
    assert r.clean and r.n_token_only == 1 and r.token_divergence_ids == ("a",)
    (row,) = r.per_id
    assert row.kind == "token_only" and row.field == "content"
    assert row.x_content_sha != row.y_content_sha
    assert row.x_excerpt == "same words" and row.y_excerpt == "other words"


def test_token_rows_name_first_divergent_token_and_margins() -> None:
    x = {
        "a": make_trial(
            "a",
            score=0.0,
            tokens=("1", "2", "3", "4"),
            top_margins=(5.0, 4.0, 0.01, 3.0),
        )
    }
    y = {
        "a": changed(
            x["a"], score=1.0, tokens=("1", "2", "9", "4"), top_margins=(5.0, 4.0, 0.02, 3.0)
        )
    }
    (row,) = diff_pair("AC", x, y).per_id
    assert row.first_divergent_token == 2 and row.token_identical is False
    assert row.x_top_margin == 0.01 and row.y_top_margin == 0.02


def test_first_divergent_token_counts_a_length_difference() -> None:
    assert first_divergent_token(("a", "b"), ("a", "b")) is None
    assert first_divergent_token(("a", "b"), ("a", "b", "c")) == 2
    assert first_divergent_token(("a",), ("b",)) == 0


def test_excerpt_is_short_and_idempotent() -> None:
    long = "x" * (EXCERPT_CHARS * 3)
    x = {"a": make_trial("a", completion=long, extracted_answer="k")}
    y = {"a": changed(x["a"], completion=long + "y")}
    (row,) = diff_pair("AB", x, y).per_id
    assert row.x_excerpt == "x" * EXCERPT_CHARS


def test_transport_failures_are_skipped_not_divergent() -> None:
    x = _maps(3)
    y = dict(x)
    y["i2"] = transport_failure("i2", "http_error")
    r = diff_pair("AC", x, y)
    assert r.clean and r.transport_skipped_ids == ("i2",)
    assert r.n_compared == 2


def test_union_over_passes_any_pass_divergent_marks_the_id() -> None:
    x = _maps(4)
    p0 = dict(x)
    p1 = dict(x)
    p1["i3"] = changed(x["i3"], score=0.0)
    p2 = dict(x)
    p2["i2"] = changed(x["i2"], completion="moved", extracted_answer=x["i2"].extracted_answer)
    r = compare("AC", x, [(0, p0), (1, p1), (2, p2)])
    assert r.divergent_ids == ("i3",)
    assert r.token_divergence_ids == ("i2",)
    assert [(p.index, p.n_divergent, p.n_token_only) for p in r.per_pass] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
    ]
    assert r.per_id[0].pass_index in (1, 2)


def test_an_id_divergent_in_one_pass_and_token_only_in_another_counts_as_divergent() -> None:
    x = _maps(2)
    p0 = {**x, "i0": changed(x["i0"], score=0.0)}
    p1 = {
        **x,
        "i0": changed(x["i0"], completion="moved", extracted_answer=x["i0"].extracted_answer),
    }
    r = compare("AC", x, [(0, p0), (1, p1)])
    assert r.divergent_ids == ("i0",) and r.token_divergence_ids == ()


def test_by_family_and_by_fill_group_compared_ids() -> None:
    x = _maps(4)
    y = {**x, "i1": changed(x["i1"], score=0.0)}
    items = [ItemMeta("i0", "math", 0.25), ItemMeta("i1", "math", 0.25), ItemMeta("i2", "qa")]
    r = diff_pair("AB", x, y, items)
    assert r.by_family["math"].n_compared == 2 and r.by_family["math"].n_divergent == 1
    assert r.by_family["unknown"].n_compared == 1
    assert r.by_fill["0.25"].n_divergent == 1 and r.by_fill["unknown"].n_compared == 2
