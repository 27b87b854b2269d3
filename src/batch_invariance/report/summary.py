"""The report as JSON for machines (``report --format json``). Pure.

``report_version`` names this layout. One entry per cert; ``invalid`` names every input that
was not a valid cert; ``all_valid`` and ``all_promotable`` summarise; ``histories`` holds each
cell measured by more than one build, oldest first, each build against the one before.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from batch_invariance.report.model import Cell, Report

__all__ = ["REPORT_VERSION", "render_json"]

REPORT_VERSION = 1


def _cell(cell: Cell) -> dict[str, Any]:
    return {
        "cert": cell.origin,
        "model": cell.model,
        "ctx": cell.ctx,
        "dispatch_n": cell.n,
        "status": cell.status,
        "verdict": cell.verdict,
        "source": cell.source,
        "promotable": cell.promotable,
        "duplicate": cell.duplicate,
        "rate": None if cell.rate is None else asdict(cell.rate),
        "throughput": None if cell.throughput is None else asdict(cell.throughput),
        "answer_tokens": None if cell.answer_length is None else asdict(cell.answer_length),
        "signature": asdict(cell.signature),
        "unmet_gates": [g.name for g in cell.gates if g.ok is False],
        "divergent_ids": [
            {
                "test_id": d.test_id,
                "kind": d.kind,
                "field": d.field,
                "passes": list(d.passes),
                "first_divergent_token": d.first_token,
                "flip": d.flip,
            }
            for d in cell.divergent
        ],
    }


def render_json(report: Report) -> str:
    cells = report.cells
    data = {
        "report_version": REPORT_VERSION,
        "n_certs": len(cells),
        "all_valid": not report.invalid and not report.signature_problems,
        "all_promotable": bool(cells) and not report.invalid and all(c.promotable for c in cells),
        "cells": [_cell(c) for c in cells],
        "invalid": [{"cert": bad.origin, "problem": bad.problem} for bad in report.invalid],
        "histories": [
            {
                "model": h.model,
                "ctx": h.ctx,
                "dispatch_n": h.n,
                "builds": [asdict(r) for r in h.rows],
            }
            for h in report.histories
        ],
    }
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
