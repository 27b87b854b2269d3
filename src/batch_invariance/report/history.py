"""A cell's history over builds: one row per cert of the same (model, ctx, N), oldest first,
each compared with the build before it (pure).

A report given certs of several builds (release artifacts, one folder per build) shows, per
cell measured more than once: the date, the build (engine and server binary sha256 prefix),
the verdict, and against the previous row the answers that changed (a scored field), the
prompts whose tokens changed with equal answers, and those whose logprobs drifted with equal
tokens, by the same comparison as ``batch-invariance compare``
(:func:`batch_invariance.core.compare.compare_cells`). Two certs that are not comparable
(another model file, work-set, sampling, answer budget) say so and count nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from batch_invariance.core.compare import CellSide, compare_cells

__all__ = ["CellHistory", "HistoryRow", "build_label", "histories"]


@dataclass(frozen=True)
class HistoryRow:
    """One build of a cell, and what changed since the build before it."""

    ts_utc: str
    build: str
    verdict: str
    origin: str
    #: Prompts compared with the previous build (``None``: first row, or not comparable).
    compared: int | None
    answers_changed: int | None
    tokens_changed: int | None
    drift: int | None
    #: ``first build``, ``not comparable: ...``, a count of prompts not compared, or empty.
    note: str


@dataclass(frozen=True)
class CellHistory:
    model: str
    ctx: int
    n: int
    rows: tuple[HistoryRow, ...]


def build_label(side: CellSide) -> str:
    """The build in a few characters: engine and the binary's sha256 prefix."""
    return f"{side.engine}@{side.build[:12]}" if side.build else f"{side.engine}@(not recorded)"


def _row(side: CellSide, previous: CellSide | None) -> HistoryRow:
    label = build_label(side)
    if previous is None:
        return HistoryRow(side.ts_utc, label, side.verdict, side.origin, None, None, None, None,
                          "first build")  # fmt: skip
    result = compare_cells(previous, side)
    if not result.comparable:
        why = "not comparable: " + "; ".join(result.not_comparable)
        return HistoryRow(side.ts_utc, label, side.verdict, side.origin, None, None, None, None,
                          why)  # fmt: skip
    k = result.counts
    notes = []
    if k.uncompared:
        notes.append(f"{k.uncompared} prompt(s) not compared (transport failure)")
    if k.unchecked:
        notes.append(f"{k.unchecked} prompt(s) without logprobs: drift not checked")
    return HistoryRow(
        ts_utc=side.ts_utc,
        build=label,
        verdict=side.verdict,
        origin=side.origin,
        compared=k.total - k.uncompared,
        answers_changed=k.scored,
        tokens_changed=k.tokens,
        drift=k.drift,
        note="; ".join(notes),
    )


def histories(sides: Sequence[CellSide]) -> tuple[CellHistory, ...]:
    """Every (model, ctx, N) with two or more certs, each as rows oldest first."""
    by_cell: dict[tuple[str, int, int], list[CellSide]] = {}
    for side in sides:
        by_cell.setdefault((side.model, side.ctx, side.dispatch_n), []).append(side)
    out: list[CellHistory] = []
    for (model, ctx, n), group in sorted(by_cell.items()):
        if len(group) < 2:
            continue
        ordered = sorted(group, key=lambda s: (s.ts_utc, s.origin))
        rows = [_row(s, ordered[i - 1] if i else None) for i, s in enumerate(ordered)]
        out.append(CellHistory(model, ctx, n, tuple(rows)))
    return tuple(out)
