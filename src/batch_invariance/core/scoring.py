"""The scorer contract: how a completion becomes an invariant trial record.

Subclass :class:`Scorer` and implement :meth:`~Scorer.extract_answer`,
:meth:`~Scorer.classify_failure_mode` and :meth:`~Scorer.score`; or pass a plain function
``fn(text, expected, *, item) -> (score, passed, failure_mode)``. ``--scorer pkg.mod:NAME``
(or ``path/to/file.py:NAME``) loads either with :func:`load_scorer`.

A scorer that raises on one trial never loses the id: :func:`evaluate` records
``failure_mode = "scorer_error"`` for that trial and the run goes on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batch_invariance.core.evidence import OK, SCORER_ERROR
from batch_invariance.core.plan import WorkItem

__all__ = [
    "Completion",
    "ExactMatchScorer",
    "FunctionScorer",
    "Score",
    "ScoreResult",
    "Scorer",
    "ScorerFunction",
    "evaluate",
    "one_line",
]


@dataclass(frozen=True)
class Completion:
    """What the server returned for one request, as the scorer sees it."""

    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None
    n_predict: int | None = None


@dataclass(frozen=True)
class Score:
    """A score and whether it counts as a pass."""

    value: float | None
    passed: bool | None


@dataclass(frozen=True)
class ScoreResult:
    """The scorer's part of a trial's invariant record."""

    score: float | None
    passed: bool | None
    extracted_answer: str | None
    failure_mode: str
    error: str | None = None


class Scorer(ABC):
    """Judges completions. Implementations must be deterministic and side-effect free."""

    #: Recorded in the cert's provenance; override with something stable.
    scorer_id: str = "custom"

    @abstractmethod
    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        """The answer found in ``text``, or ``None`` when there is none."""

    @abstractmethod
    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        """``"ok"`` for a genuinely scored completion, else a failure mode name."""

    @abstractmethod
    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        """Score an extracted answer against the expected one."""


class ExactMatchScorer(Scorer):
    """The default: the whole stripped completion is the answer, so any change is scored."""

    scorer_id = "exact_match"

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        return text.strip()

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        return "empty" if not completion.text.strip() else OK

    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        if expected is None:
            return Score(value=None, passed=None)
        hit = extracted is not None and extracted == expected.strip()
        return Score(value=1.0 if hit else 0.0, passed=hit)


ScorerFunction = Callable[..., tuple[Any, Any, Any]]


class FunctionScorer(Scorer):
    """Adapts ``fn(text, expected, *, item) -> (score, passed, failure_mode)``."""

    def __init__(self, fn: ScorerFunction, scorer_id: str) -> None:
        self._fn = fn
        self.scorer_id = scorer_id

    def _call(self, text: str, item: WorkItem) -> tuple[Any, Any, Any]:
        result = self._fn(text, item.expected_answer, item=item)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise TypeError("scorer function must return (score, passed, failure_mode)")
        return result

    def extract_answer(self, text: str, item: WorkItem) -> str | None:
        return text.strip()

    def classify_failure_mode(
        self, completion: Completion, item: WorkItem, extracted: str | None
    ) -> str:
        return str(self._call(completion.text, item)[2])

    def score(self, extracted: str | None, expected: str | None, item: WorkItem) -> Score:
        # evaluate() calls the function once per trial through evaluate_text(); this keeps
        # the Scorer contract usable on its own.
        value, passed, _ = self._fn(extracted or "", expected, item=item)
        return Score(
            value=None if value is None else float(value),
            passed=None if passed is None else bool(passed),
        )

    def evaluate_text(self, completion: Completion, item: WorkItem) -> ScoreResult:
        value, passed, mode = self._call(completion.text, item)
        return ScoreResult(
            score=None if value is None else float(value),
            passed=None if passed is None else bool(passed),
            extracted_answer=completion.text.strip(),
            failure_mode=str(mode),
        )


def _finite(result: ScoreResult) -> ScoreResult:
    """A score must be a finite number: NaN or infinity cannot be compared or recorded."""
    if result.score is not None and not math.isfinite(result.score):
        raise ValueError(f"scorer returned a non-finite score ({result.score!r})")
    return result


def evaluate(scorer: Scorer, item: WorkItem, completion: Completion) -> ScoreResult:
    """Run the scorer on one completion; an exception, or a score that is NaN or infinite,
    becomes ``scorer_error``, never a crash and never a value the cert cannot hold."""
    try:
        if isinstance(scorer, FunctionScorer):
            return _finite(scorer.evaluate_text(completion, item))
        extracted = scorer.extract_answer(completion.text, item)
        mode = scorer.classify_failure_mode(completion, item, extracted)
        result = scorer.score(extracted, item.expected_answer, item)
        return _finite(
            ScoreResult(
                score=None if result.value is None else float(result.value),
                passed=result.passed,
                extracted_answer=extracted,
                failure_mode=str(mode),
            )
        )
    except Exception as exc:  # a user scorer may raise anything; the id must not be lost
        return ScoreResult(
            score=None,
            passed=None,
            extracted_answer=None,
            failure_mode=SCORER_ERROR,
            error=one_line(exc),
        )


def one_line(exc: BaseException) -> str:
    """``Kind: message`` with the message's whitespace (newlines included) collapsed."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())
