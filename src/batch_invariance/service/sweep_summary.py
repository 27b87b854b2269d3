"""``sweep.json``: one entry per N (verdict, bound or rate, where divergence starts,
throughput, the cert file and its digest), ``max_safe_parallel`` and
``max_safe_faster_parallel`` (the largest safe N whose concurrent throughput beats serial).

Built only from the written certs as :func:`~batch_invariance.cert.verify.verify` read
them back, so the summary says what the cert files say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batch_invariance.cert.certificate import cert_to_json
from batch_invariance.cert.provenance import ScheduleRecord
from batch_invariance.cert.verify import Verification
from batch_invariance.core.scope import SequenceScope
from batch_invariance.core.sweep import (
    SweepPoint,
    max_safe_faster_parallel,
    max_safe_parallel,
    median_first_divergence,
)
from batch_invariance.service.finish import FinishedCell

SWEEP_VERSION = 1


@dataclass(frozen=True)
class SweepCell:
    """One N of a sweep: its written cert and that cert's verification, or why it did not run."""

    parallel: int
    finished: FinishedCell | None
    verification: Verification | None
    not_run: str | None

    @property
    def promotable_green(self) -> bool:
        v = self.verification
        return v is not None and v.valid and v.verdict == "GREEN" and v.promotable

    @property
    def speedup(self) -> float | None:
        """The written cert's concurrent over serial throughput (``None``: not measured)."""
        block = None if self.finished is None else self.finished.cert.throughput
        return None if block is None else block.speedup


def _rate(sensitivity: Mapping[str, Any]) -> dict[str, Any]:
    if sensitivity.get("observed_rate") is None:
        return {
            "kind": "bound",
            "rate_upper_bound_95": sensitivity.get("rate_upper_bound_95"),
            "n_distinct_prompts": sensitivity.get("n_distinct_prompts"),
            "n_hot_trials": sensitivity.get("n_hot_trials"),
        }
    return {
        "kind": "observed",
        "observed_rate": sensitivity.get("observed_rate"),
        "ci95_low": sensitivity.get("ci95_low"),
        "ci95_high": sensitivity.get("ci95_high"),
        "n_ac_divergent": sensitivity.get("n_ac_divergent"),
        "n_scored_comparisons": sensitivity.get("n_scored_comparisons"),
    }


def _sequences(scope: SequenceScope | None) -> dict[str, Any] | None:
    """Verdict against length, per N: how far the cell measured and where drift began."""
    if scope is None:
        return None
    return {
        "longest": scope.longest,
        "slot_ctx": scope.slot_ctx,
        "required": scope.required,
        "first_drift_position": scope.first_drift_position,
        "bitwise_equal_up_to": scope.bitwise_equal_up_to,
        "drift_rows_by_band": [b.rows_with_drift for b in scope.bands],
        "changed_rows_by_band": [b.rows_with_changed_answer for b in scope.bands],
    }


def _entry(cell: SweepCell) -> dict[str, Any]:
    if cell.finished is None or cell.verification is None:
        return {"parallel": cell.parallel, "ran": False, "not_run": cell.not_run}
    cert = cell.finished.cert
    data = cert_to_json(cert)
    rows = [
        (row.test_id, row.first_divergent_token)
        for row in cert.divergence_report.ac.per_id
        if row.kind == "invariant"
    ]
    schedule = cert.provenance.schedule or ScheduleRecord()
    v = cell.verification
    return {
        "parallel": cell.parallel,
        "ran": True,
        "status": cert.status,
        "verdict": cert.verdict,
        "promotable": v.promotable,
        "verified": v.valid,
        "problems": list(v.problems),
        "divergence_class": cert.divergence_class,
        "rate": _rate(data["sensitivity"]),
        "first_divergent_token_median": median_first_divergence(rows),
        "throughput": None if cert.throughput is None else asdict(cert.throughput),
        "sequences": _sequences(cert.sequence_scope),
        "passes_run": cert.n_passes,
        "stopped_early": bool(schedule.stopped_early),
        "arms_run": None if schedule.arms_run is None else list(schedule.arms_run),
        "cert": cell.finished.path.name,
        "digest": cert.digest,
    }


def sweep_summary(
    model: str, ctx: int, cells: Sequence[SweepCell], *, launches: int
) -> dict[str, Any]:
    """The ``sweep.json`` object."""
    ran = [c for c in cells if c.finished is not None]
    points = [SweepPoint(c.parallel, c.promotable_green, c.speedup) for c in cells]
    return {
        "sweep_version": SWEEP_VERSION,
        "model": model,
        "ctx": ctx,
        "parallel": [c.parallel for c in cells],
        "max_safe_parallel": max_safe_parallel(points),
        "max_safe_faster_parallel": max_safe_faster_parallel(points),
        "server_launches": launches,
        "cells": [_entry(c) for c in cells],
        "not_run": {str(c.parallel): c.not_run for c in cells if c.not_run is not None},
        "certs": [
            {"parallel": c.parallel, "file": c.finished.path.name, "digest": c.finished.cert.digest}
            for c in ran
            if c.finished is not None
        ],
    }
