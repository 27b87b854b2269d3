"""Example scorers for ``--scorer``: a Scorer subclass and a plain function.

Use them as ``--scorer examples/scorer.py:ShortAnswerScorer`` or
``--scorer examples/scorer.py:score_short_answer`` (or ``pkg.module:NAME`` once installed).

Both must be deterministic and free of side effects: the same completion must always get the
same score, or the gate would see divergence that batching did not cause.
"""

from __future__ import annotations

import re

from batch_invariance.scorer_api import Completion, Score, Scorer, WorkItem

_ANSWER_PREFIX = re.compile(r"^\s*(?:the\s+)?answer\s*(?:is)?\s*[:=]?\s*", re.IGNORECASE)


def _first_line_answer(text: str) -> str | None:
    """The first non-empty line, without an "Answer:" prefix or trailing punctuation."""
    for line in text.splitlines():
        line = _ANSWER_PREFIX.sub("", line).strip().rstrip(".!").strip()
        if line:
            return line
    return None


class ShortAnswerScorer(Scorer):
    """Scores short answers: the first line, case-insensitive, numbers compared as numbers."""

    scorer_id = "examples.short_answer/1"

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        return _first_line_answer(text)

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        if not completion.text.strip():
            return "empty"
        if extracted is None:
            # Text came back but no answer line in it: cut off by the budget, or unparseable.
            return "premature_eos" if completion.finish_reason == "length" else "parse_fail"
        return "ok"

    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        if expected is None:
            return Score(value=None, passed=None)
        if extracted is None:
            return Score(value=0.0, passed=False)
        hit = _same_answer(extracted, expected)
        return Score(value=1.0 if hit else 0.0, passed=hit)


def _same_answer(got: str, expected: str) -> bool:
    try:
        return float(got) == float(expected)
    except ValueError:
        return got.casefold() == expected.strip().casefold()


def score_short_answer(
    text: str, expected: str | None, *, item: WorkItem
) -> tuple[float | None, bool | None, str]:
    """The same judgement as a plain function: ``(score, passed, failure_mode)``."""
    answer = _first_line_answer(text)
    if answer is None:
        return None, None, "empty"
    if expected is None:
        return None, None, "ok"
    hit = _same_answer(answer, expected)
    return (1.0 if hit else 0.0), hit, "ok"
