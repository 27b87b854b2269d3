"""The public scorer API for user scorers: ``from batch_invariance.scorer_api import Scorer``.

A stable import path over :mod:`batch_invariance.core.scoring` (the contract) and
:mod:`batch_invariance.run.scorer_loader` (``--scorer`` loading); nothing is defined here.
"""

from batch_invariance.core.scoring import (
    Completion,
    ExactMatchScorer,
    FunctionScorer,
    Score,
    Scorer,
    ScoreResult,
    evaluate,
)
from batch_invariance.run.scorer_loader import load_scorer

__all__ = [
    "Completion",
    "ExactMatchScorer",
    "FunctionScorer",
    "Score",
    "ScoreResult",
    "Scorer",
    "evaluate",
    "load_scorer",
]
