"""The serial-repeat control (pure): before anything is GREEN, the reference must reproduce
itself when serial, in its tokens, answers and numerics."""

from __future__ import annotations

from dataclasses import dataclass

from batch_invariance.core.diff import PairReport
from batch_invariance.core.numerics import PairNumerics

__all__ = [
    "SerialRepeatGate",
    "serial_repeat_gate",
]


@dataclass(frozen=True)
class SerialRepeatGate:
    """The A vs A' control: the reference must reproduce itself before anything is GREEN."""

    ran: bool
    ok: bool
    n_divergent: int
    n_token_only: int
    ids: tuple[str, ...]
    reason: str
    #: Ids whose numerics drifted between A and A' (beyond ``logit_eps``) with equal tokens.
    n_numeric_drift: int = 0


def _both_present(report: PairReport) -> int:
    """Ids the report compared with a trial on both sides (a missing id repeats nothing)."""
    return report.n_compared - len(set(report.only_x) | set(report.only_y))


def serial_repeat_gate(
    aa: PairReport | None,
    ab: PairReport,
    aa_numerics: PairNumerics | None = None,
    eps: float = 0.0,
) -> SerialRepeatGate:
    """A GREEN needs a serial repeat that agrees with A: A' (same server) or, when A' was not
    run, arm B (serial, on the other server). Any A vs A' difference (numeric drift beyond
    ``eps`` included) makes GREEN impossible; so does having neither repeat. (A B that
    disagrees with A is row 3, AMBER.)"""
    if aa is None:
        if _both_present(ab) == 0:
            return SerialRepeatGate(
                False, False, 0, 0, (),
                "serial repeat not met: neither A' nor B compared any id with A, so nothing "
                "shows that A reproduces itself when serial",
            )  # fmt: skip
        return SerialRepeatGate(
            False, True, 0, 0, (),
            f"serial repeat A' not run; arm B (serial) is the repeat ({_both_present(ab)} id(s))",
        )  # fmt: skip
    ids = tuple(sorted(set(aa.divergent_ids) | set(aa.token_divergence_ids)))
    if _both_present(aa) == 0:
        return SerialRepeatGate(
            True, False, 0, 0, (), "serial repeat not met: A' compared no id with A"
        )
    drift = aa_numerics.drift_ids_beyond(eps) if aa_numerics is not None else ()
    if not ids and drift:
        return SerialRepeatGate(
            True, False, 0, 0, drift,
            f"serial repeat: A' drifts numerically from A on {len(drift)} id(s) with equal "
            "tokens and no batching at all; run-to-run numeric nondeterminism makes GREEN "
            "impossible",
            len(drift),
        )  # fmt: skip
    if not ids:
        return SerialRepeatGate(
            True, True, 0, 0, (), "serial repeat: A' reproduced A exactly (run-to-run clean)"
        )
    return SerialRepeatGate(
        True,
        False,
        aa.n_divergent,
        aa.n_token_only,
        ids,
        f"serial repeat: A' differs from A on {len(ids)} id(s) "
        f"({aa.n_divergent} invariant, {aa.n_token_only} token-only) with no batching at all; "
        "run-to-run nondeterminism makes GREEN impossible",
    )
