"""The public scorer API for user scorers: ``from batch_invariance.scorer_api import Scorer``.

A stable import path over :mod:`batch_invariance.core.scoring` (the contract),
:class:`~batch_invariance.core.plan.WorkItem` (what a scorer judges) and
:mod:`batch_invariance.run.scorer_loader` (``--scorer`` loading); nothing is defined here.
"""

from batch_invariance.core.plan import WorkItem
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
    "WorkItem",
    "evaluate",
    "load_scorer",
]
