"""A verified cert as one side of a comparison, and the comparison as JSON (pure).

:func:`side_from_cert` reads what :mod:`batch_invariance.core.compare` needs from a cert:
the cell, the model sha256, the work-set sha256 and each prompt's request key, the request
template, the scorer and arm A. :func:`comparison_json` is the versioned JSON layout of a
whole comparison (docs/compare.md; ``compare_version`` bumps on any change of keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batch_invariance.cert.build import trial_from_record
from batch_invariance.cert.schema import Cert
from batch_invariance.core.compare import (
    COMPARE_VERSION,
    PROMPT_CLASSES,
    CellComparison,
    CellSide,
    FailOn,
    fails_policy,
)

__all__ = ["CertRef", "Comparison", "build_id", "comparison_json", "side_from_cert"]


def build_id(cert: Cert) -> str:
    """The server build in a few characters: engine and the binary's sha256 prefix."""
    p = cert.provenance
    sha = None if p.server_binary is None else p.server_binary.sha256
    return f"{p.engine_name}@{sha[:12]}" if sha else f"{p.engine_name}@(binary not recorded)"


def side_from_cert(cert: Cert, origin: str) -> CellSide:
    """One side of a comparison from a cert that has already been verified."""
    p = cert.provenance
    workset = p.workset or {}
    sha = workset.get("sha256")
    return CellSide(
        origin=origin,
        model=cert.model,
        ctx=cert.ctx,
        dispatch_n=cert.dispatch_n,
        status=cert.status,
        verdict=cert.verdict,
        engine=p.engine_name,
        build=None if p.server_binary is None else p.server_binary.sha256,
        ts_utc=cert.ts_utc,
        model_sha256=None if p.model_file is None else p.model_file.sha256,
        workset_sha256=sha if isinstance(sha, str) and sha else None,
        request_keys={m.test_id: m.request_key for m in cert.evidence.items},
        template=p.request_template,
        scorer_id=p.scorer_id,
        a={k: trial_from_record(k, v) for k, v in cert.evidence.a.items()},
    )


@dataclass(frozen=True)
class CertRef:
    """Which cert a side was read from, as the output names it."""

    path: str
    digest: str
    model: str
    ctx: int
    dispatch_n: int
    verdict: str
    engine: str
    build: str
    ts_utc: str
    tool_version: str
    #: The rules it was judged under (``None``: written before the rules were versioned).
    rules_version: int | None
    #: ``None``: verified in full under this tool's rules; else why its verdict was not
    #: re-derived and what was compared (:mod:`~batch_invariance.cert.baseline`).
    rules_note: str | None

    @classmethod
    def of(cls, cert: Cert, path: str, rules_note: str | None = None) -> CertRef:
        return cls(
            path=path,
            digest=cert.digest,
            model=cert.model,
            ctx=cert.ctx,
            dispatch_n=cert.dispatch_n,
            verdict=cert.verdict,
            engine=cert.provenance.engine_name,
            build=build_id(cert),
            ts_utc=cert.ts_utc,
            tool_version=cert.tool_version,
            rules_version=cert.rules_version,
            rules_note=rules_note,
        )


@dataclass(frozen=True)
class Comparison:
    """A whole comparison: the cells paired across the two inputs, and what was not paired."""

    baseline: str
    new: str
    #: How the signatures were checked, in words (or that they were not).
    signatures: str
    #: Per paired cell: the two certs and their comparison.
    cells: tuple[tuple[CertRef, CertRef, CellComparison], ...]
    baseline_only: tuple[CertRef, ...]
    new_only: tuple[CertRef, ...]

    @property
    def comparisons(self) -> tuple[CellComparison, ...]:
        return tuple(c for _, _, c in self.cells)

    @property
    def comparable(self) -> bool:
        return bool(self.cells) and all(c.comparable for c in self.comparisons)

    def counts(self) -> dict[str, int]:
        return {k: sum(getattr(c.counts, k) for c in self.comparisons) for k in PROMPT_CLASSES}

    def worst(self) -> str | None:
        """The worst class over every comparable cell (``None``: nothing compared)."""
        from batch_invariance.core.compare import ClassCounts, worst_class

        return worst_class(ClassCounts(**self.counts()))

    def policy_failures(self, fail_on: FailOn) -> tuple[str, ...]:
        return fails_policy(self.comparisons, fail_on)


def _cell_json(old: CertRef, new: CertRef, cell: CellComparison) -> dict[str, Any]:
    return {
        "model": cell.model,
        "ctx": cell.ctx,
        "dispatch_n": cell.dispatch_n,
        "baseline": asdict(old),
        "new": asdict(new),
        "verdict": {"baseline": cell.old_verdict, "new": cell.new_verdict},
        "comparable": cell.comparable,
        "not_comparable": list(cell.not_comparable),
        "counts": asdict(cell.counts),
        "worst": cell.worst,
        "changes": [asdict(c) for c in cell.changes],
    }


def comparison_json(comparison: Comparison, fail_on: FailOn | None = None) -> dict[str, Any]:
    """The comparison as the versioned JSON layout of docs/compare.md."""
    out: dict[str, Any] = {
        "compare_version": COMPARE_VERSION,
        "baseline": comparison.baseline,
        "new": comparison.new,
        "signatures": comparison.signatures,
        "comparable": comparison.comparable,
        "worst": comparison.worst(),
        "counts": comparison.counts(),
        "cells": [_cell_json(o, n, c) for o, n, c in comparison.cells],
        "baseline_only": [asdict(r) for r in comparison.baseline_only],
        "new_only": [asdict(r) for r in comparison.new_only],
    }
    if fail_on is not None:
        failures: Sequence[str] = comparison.policy_failures(fail_on)
        out["policy"] = {"fail_on": fail_on, "failed": bool(failures), "reasons": list(failures)}
    return out
