"""What ``check-deploy`` decided, as data: the decision and its exit code, each cell with its
problems (file, line, rule, message) and each construct of the deploy file outside its grammar.

Pure: built from check-deploy's :class:`~batch_invariance.deploy.deploy_report.DeployReport`
and the readers' :class:`~batch_invariance.gate.server_command.NotUnderstood` constructs. The
command renders it as text, as GitHub annotations and, with ``--json``, as itself (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from batch_invariance import exitcodes
from batch_invariance.deploy.deploy_report import DeployReport
from batch_invariance.deploy.plan_cells import PlanEntry
from batch_invariance.gate.cells import DeployCell
from batch_invariance.gate.check import CellCheck
from batch_invariance.gate.server_command import NotUnderstood, origin_location

#: Names the layout of :meth:`DeployOutcome.to_json`; bumps on any change of keys.
JSON_VERSION = 2

_UNSIGNED = " (UNSIGNED: --allow-unsigned, signatures not checked)"


@dataclass(frozen=True)
class Problem:
    """One reason the deploy does not pass, where it is in the deploy's files."""

    #: The file, as a path: the deploy config as given, or the drop-in, environment or
    #: override file the reader named.
    file: str
    #: 1-based; ``None`` when the reader names no line (a compose service, a models.toml
    #: entry, a whole file).
    line: int | None
    #: 1-based; ``None`` when not known (no reader records a column yet).
    column: int | None
    #: The gate's kind of a cell that is not covered (``missing``, ``unverifiable``,
    #: ``not_promotable``, ``invalid``, ``unknown``, ``unsigned``), or ``not_understood``
    #: for a construct of the deploy file outside its grammar.
    rule: str
    message: str
    #: Where the text output names it (``deploy.sh:3``, ``compose.yml [llm]``).
    origin: str


@dataclass(frozen=True)
class CellItem:
    """One server the deploy starts, as the cell it runs, and what the gate said of it."""

    label: str
    origin: str
    model: str
    ctx: int | None
    parallel: int
    kv_layout: str
    #: ``skip``: parallel 1, no batching, no cert needed.
    result: Literal["pass", "fail", "skip"]
    #: The gate's kind (``ok``, ``missing``, ...), or ``serial`` for a skipped cell.
    kind: str
    reason: str
    notes: tuple[str, ...]
    #: The covering (or refused) cert, when one was found.
    cert: str | None
    #: With no ``-n`` cap: the longest answer the covering cert measured.
    answers_up_to: int | None
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class DeployOutcome:
    config: str
    certs: str
    decision: Literal["pass", "fail"]
    exit_code: int
    #: ``False`` under ``--allow-unsigned``.
    signatures_checked: bool
    #: The last line of the text output (``check-deploy: PASS: ...``).
    summary: str
    cells: tuple[CellItem, ...]
    #: The constructs outside the grammar (any one fails the deploy).
    not_understood: tuple[Problem, ...]
    #: The run that measures each cell no cert covers (``check-deploy --plan``).
    plan: tuple[PlanEntry, ...] = ()

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem, in the order the text output names them."""
        return tuple(p for cell in self.cells for p in cell.problems) + self.not_understood

    def to_json(self) -> dict[str, Any]:
        return {"command": "check-deploy", "json_version": JSON_VERSION, **asdict(self)}


def problem_file(shown: str, config: Path) -> str:
    """The path of a file a reader names by ``shown``: the config itself (named by its file
    name), an absolute path as it is, any other name beside the config."""
    if shown == config.name:
        return str(config)
    if Path(shown).is_absolute():
        return shown
    return str(config.parent / shown)


def _cell(cell: DeployCell, check: CellCheck | None, config: Path) -> CellItem:
    problems: tuple[Problem, ...] = ()
    if check is not None and not check.ok:
        shown, line = origin_location(cell.origin)
        message = f"{cell.label}: {check.reason}"
        file = problem_file(shown, config)
        problems = (Problem(file, line or None, None, check.kind, message, cell.origin),)
    return CellItem(
        label=cell.label,
        origin=cell.origin,
        model=cell.name,
        ctx=cell.ctx,
        parallel=cell.parallel,
        kv_layout=cell.layout_name,
        result="skip" if check is None else "pass" if check.ok else "fail",
        kind="serial" if check is None else check.kind,
        reason="parallel 1: no batching, no cert needed" if check is None else check.reason,
        notes=tuple(cell.notes),
        cert=None if check is None or check.cert is None else str(check.cert),
        answers_up_to=None if check is None else check.answers_up_to,
        problems=problems,
    )


def _construct(construct: NotUnderstood, config: Path) -> Problem:
    file = problem_file(construct.file, config)
    line = construct.line or None
    return Problem(file, line, None, "not_understood", construct.message, construct.where)


def _decision(report: DeployReport) -> tuple[int, str]:
    """The exit code and the summary line."""
    note = _UNSIGNED if report.unsigned_allowed else ""
    if report.unmodelled:
        return exitcodes.NOT_PROMOTABLE, (
            f"check-deploy: FAIL: {len(report.unmodelled)} construct(s) in {report.config} "
            "off the allowlist of its format: not understood (keep to the lines of "
            f"docs/deploy.md and launch with batch-invariance serve){note}"
        )
    if not report.checks:
        return exitcodes.PROMOTABLE, (
            f"check-deploy: PASS: {report.config} runs no batched cell (parallel > 1){note}"
        )
    if report.passed:
        scopes = [c.answers_up_to for c in report.checks if c.answers_up_to is not None]
        scope = (
            f"; covers answers up to {min(scopes)} tokens (no -n cap in {len(scopes)} cell(s): "
            "longer answers were never measured)"
            if scopes
            else ""
        )
        return exitcodes.PROMOTABLE, (
            f"check-deploy: PASS: {len(report.checks)} batched cell(s) certified{scope}{note}"
        )
    failing = report.failing
    summary = (
        f"check-deploy: FAIL: {len(failing)} of {len(report.checks)} batched cell(s) not "
        f"certified: {', '.join(c.cell.label for c in failing)}{note}"
    )
    if any(check.kind == "invalid" for check in failing):
        return exitcodes.CERT_INVALID, summary
    return exitcodes.NOT_PROMOTABLE, summary


def deploy_outcome(
    report: DeployReport, not_understood: Sequence[NotUnderstood], certs: Path
) -> DeployOutcome:
    """The outcome of the gate's ``report``; ``not_understood`` are the constructs behind
    ``report.unmodelled`` (with their files and lines)."""
    config = report.config
    code, summary = _decision(report)
    cells = (
        *(_cell(cell, None, config) for cell in report.serial),
        *(_cell(check.cell, check, config) for check in report.checks),
    )
    return DeployOutcome(
        config=str(config),
        certs=str(certs),
        decision="pass" if code == exitcodes.PROMOTABLE else "fail",
        exit_code=code,
        signatures_checked=not report.unsigned_allowed,
        summary=summary,
        cells=cells,
        not_understood=tuple(_construct(c, config) for c in not_understood),
    )
