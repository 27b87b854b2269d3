"""The error kinds a run can end with.

Each kind stands for one class of outcome; :mod:`batch_invariance.exitcodes` is the only
place that turns a kind into a process exit status. Messages are one line and say what to
do next, because the CLI prints them as they are, without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BatchInvarianceError",
    "CertInvalid",
    "GuardRefused",
    "InfraError",
    "Interrupted",
    "PlanUnreachable",
    "UsageError",
]


class BatchInvarianceError(Exception):
    """Base of every error this package raises on purpose."""


class UsageError(BatchInvarianceError):
    """Missing, malformed or inconsistent input (flags, work-set, scorer spec, config)."""


class GuardRefused(BatchInvarianceError):
    """A safety guard refused to launch (memory cap, reserved port, ...). Nothing ran."""


class PlanUnreachable(GuardRefused):
    """A plan that cannot reach GREEN whatever the server does (``service.reach``), refused
    before any server starts as its ``--dry-run`` refuses it: one line per cause, its fix."""

    def __init__(self, causes: Sequence[str]) -> None:
        self.causes = tuple(causes)
        super().__init__("; ".join(self.lines()))

    def lines(self) -> tuple[str, ...]:
        return tuple(f"this plan cannot reach GREEN: {cause}" for cause in self.causes)


class InfraError(BatchInvarianceError):
    """The infrastructure failed (server would not start, died, timed out) with no verdict."""


class CertInvalid(BatchInvarianceError):
    """A cert is malformed, fails its schema, digest or re-derivation, or its signature."""


class NotCovered(BatchInvarianceError):
    """What would run is not what a promotable cert measured (serve refuses; nothing ran)."""


class Interrupted(BatchInvarianceError):
    """The run was stopped by a signal; ``signum`` says which."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or f"interrupted by signal {signum}")
        self.signum = signum
