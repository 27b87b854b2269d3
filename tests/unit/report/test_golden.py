"""Golden outputs of ``report --format md`` and ``--format json`` (human- and machine-facing).

Regenerate after an intended change with
``BATCH_INVARIANCE_REGEN_GOLDEN=1 python -m pytest tests/unit/report/test_golden.py``
and review the diff.
"""

from __future__ import annotations

import json

import pytest

from batch_invariance.report.markdown import render_markdown
from batch_invariance.report.model import build_report
from batch_invariance.report.summary import render_json
from tests.support.golden import check_golden
from tests.support.report_fixtures import sweep_inputs


@pytest.mark.parametrize(
    ("name", "render"), [("report.md", render_markdown), ("report.json", render_json)]
)
def test_golden(name: str, render: object) -> None:
    assert callable(render)
    check_golden(name, render(build_report(sweep_inputs())))


def test_json_summary_flags() -> None:
    data = json.loads(render_json(build_report(sweep_inputs())))
    assert data["all_valid"] is False and data["all_promotable"] is False
    assert data["invalid"][0]["cert"] == "broken__ctx2048__N4.json"
    valid_only = [c for c in sweep_inputs() if c.data is not None and c.promotable]
    clean = json.loads(render_json(build_report(valid_only)))
    assert clean["all_valid"] is True and clean["all_promotable"] is True
    assert json.loads(render_json(build_report([])))["all_promotable"] is False
