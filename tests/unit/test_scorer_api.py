"""The scorer contract: loading by spec, one-line errors, and raising scorers losing nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from batch_invariance.core.evidence import SCORER_ERROR
from batch_invariance.errors import UsageError
from batch_invariance.scorer_api import (
    Completion,
    ExactMatchScorer,
    FunctionScorer,
    Scorer,
    WorkItem,
    evaluate,
    load_scorer,
)
from tests.support.paths import EXAMPLES

EXAMPLE = EXAMPLES / "scorer.py"
ITEM = WorkItem("q", "What is 6 * 7?", None, expected_answer="42")


def test_default_is_exact_match_on_the_whole_stripped_completion() -> None:
    scorer = load_scorer(None)
    assert isinstance(scorer, ExactMatchScorer)
    ok = evaluate(scorer, ITEM, Completion(" 42\n"))
    assert (ok.score, ok.passed, ok.extracted_answer, ok.failure_mode) == (1.0, True, "42", "ok")
    near = evaluate(scorer, ITEM, Completion("42."))
    assert (near.score, near.passed) == (0.0, False)  # any content change is score-bearing
    assert evaluate(scorer, ITEM, Completion("  ")).failure_mode == "empty"


def test_example_scorer_class_via_spec() -> None:
    scorer = load_scorer(f"{EXAMPLE}:ShortAnswerScorer")
    assert isinstance(scorer, Scorer) and scorer.scorer_id == "examples.short_answer/1"
    r = evaluate(scorer, ITEM, Completion("Answer: 42.\nbecause six sevens"))
    assert (r.score, r.passed, r.extracted_answer, r.failure_mode) == (1.0, True, "42", "ok")
    assert evaluate(scorer, ITEM, Completion("41")).passed is False
    assert evaluate(scorer, ITEM, Completion("")).failure_mode == "empty"


def test_example_scorer_function_via_spec() -> None:
    scorer = load_scorer(f"{EXAMPLE}:score_short_answer")
    assert isinstance(scorer, FunctionScorer)
    assert scorer.scorer_id.endswith("scorer.py:score_short_answer")
    r = evaluate(scorer, ITEM, Completion("42"))
    assert (r.score, r.passed, r.failure_mode) == (1.0, True, "ok")
    assert evaluate(scorer, ITEM, Completion("   ")).failure_mode == "empty"
    # The adapter honours the Scorer contract on its own too.
    assert scorer.score("42", ITEM.expected_answer, ITEM).passed is True
    assert scorer.score("41", ITEM.expected_answer, ITEM).passed is False


def test_package_module_spec() -> None:
    assert isinstance(load_scorer("batch_invariance.scorer_api:ExactMatchScorer"), ExactMatchScorer)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my_scorer.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no_colon_here", "expected 'pkg.module:NAME'"),
        (":NAME", "expected"),
        ("pkg.mod:", "expected"),
        ("/nonexistent/scorer.py:X", "no such file"),
        ("batch_invariance_no_such_module:X", "importing"),
        ("batch_invariance.scorer_api:Nope", "has no attribute"),
        ("batch_invariance.core.scoring:SCORER_ERROR", "neither a Scorer nor a function"),
        ("batch_invariance.run.workset:WorkItem", "is not a batch_invariance Scorer"),
        ("os:getcwd", "cannot be called as fn(text, expected, *, item)"),
        ("json:dumps", "cannot be called as fn(text, expected, *, item)"),
    ],
)
def test_bad_specs_are_one_line_usage_errors(spec: str, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        load_scorer(spec)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_import_failure_and_constructor_failure_are_usage_errors(tmp_path: Path) -> None:
    broken = _write(tmp_path, "raise RuntimeError('bad import\\nsecond line')\n")
    with pytest.raises(UsageError, match=r"importing .* failed: RuntimeError") as info:
        load_scorer(f"{broken}:X")
    assert "\n" not in str(info.value)  # a multi-line exception still gives one line
    ctor = tmp_path / "ctor.py"
    ctor.write_text(
        "from batch_invariance.scorer_api import ExactMatchScorer\n"
        "class S(ExactMatchScorer):\n"
        "    def __init__(self):\n"
        "        raise ValueError('needs config')\n"
    )
    with pytest.raises(UsageError, match=r"S\(\) failed: ValueError"):
        load_scorer(f"{ctor}:S")


class Exploding(Scorer):
    scorer_id = "explodes"

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        return text

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        return "ok"

    def score(self, extracted: str | None, expected: str | None, item: WorkItem):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("oops")


def test_a_scorer_that_raises_gives_scorer_error() -> None:
    r = evaluate(Exploding(), ITEM, Completion("42"))
    assert r.failure_mode == SCORER_ERROR and r.score is None
    assert r.error is not None and "ZeroDivisionError" in r.error


def test_a_function_with_a_wrong_return_shape_gives_scorer_error() -> None:
    scorer = FunctionScorer(lambda text, expected, *, item: 1.0, "f")  # type: ignore[arg-type,return-value]
    assert evaluate(scorer, ITEM, Completion("42")).failure_mode == SCORER_ERROR


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_is_a_scorer_error_never_a_value(value: float) -> None:
    from batch_invariance.core.scoring import Completion, ExactMatchScorer, Score, evaluate

    class Odd(ExactMatchScorer):
        def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
            return Score(value=value, passed=True)

    item = WorkItem("x", "p", None, "a")
    result = evaluate(Odd(), item, Completion(text="a"))
    assert result.failure_mode == "scorer_error" and result.score is None
    assert result.error is not None and "non-finite score" in result.error
