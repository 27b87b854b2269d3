"""``check-deploy``'s human output: the text lines, and in a GitHub job one workflow-command
annotation per problem, placed on the deploy file's line in the pull request's diff.

Pure: each function returns a string and prints nothing. Golden tests pin both views
(``tests/golden/check_deploy.txt``, ``tests/golden/check_deploy_annotations.txt``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import PurePath

from batch_invariance.deploy.outcome import DeployOutcome, Problem
from batch_invariance.report.render import escape_data, escape_property

#: The title of every annotation.
TITLE = "batch-invariance check-deploy"


def deploy_text(outcome: DeployOutcome) -> str:
    """One line per cell (``skip``, ``pass``, ``FAIL``) and per construct outside the
    grammar, then the summary."""
    lines: list[str] = []
    for cell in outcome.cells:
        mark = {"skip": "skip", "pass": "pass", "fail": "FAIL"}[cell.result]
        notes = "" if cell.result == "skip" else "".join(f"; {note}" for note in cell.notes)
        lines.append(f"{mark}  {cell.label}  [{cell.origin}]  {cell.reason}{notes}")
    lines += [f"FAIL  not covered: {p.origin}: {p.message}" for p in outcome.not_understood]
    lines.append(outcome.summary)
    return "\n".join(lines) + "\n"


def in_github_job(env: Mapping[str, str]) -> bool:
    """GitHub sets ``GITHUB_ACTIONS=true`` in every step of a workflow job."""
    return env.get("GITHUB_ACTIONS") == "true"


def workspace_path(file: str, workspace: str | None, cwd: str) -> str:
    """``file`` relative to the job's workspace when it is under it (what GitHub needs to
    place an annotation on the diff), else as given; a relative ``file`` is read from ``cwd``."""
    if not workspace:
        return file
    absolute = os.path.normpath(os.path.join(cwd, file))
    root = os.path.normpath(workspace)
    if absolute == root or not absolute.startswith(root.rstrip("/") + "/"):
        return file
    return PurePath(os.path.relpath(absolute, root)).as_posix()


def error_annotation(
    message: str, file: str, line: int | None = None, column: int | None = None
) -> str:
    """``::error file=F,line=L,col=C,title=T::MESSAGE``, escaped as GitHub reads it (``line``
    and ``col`` only when known)."""
    properties = [f"file={escape_property(file)}"]
    if line is not None:
        properties.append(f"line={line}")
        if column is not None:
            properties.append(f"col={column}")
    properties.append(f"title={escape_property(TITLE)}")
    return f"::error {','.join(properties)}::{escape_data(message)}"


def problem_annotation(problem: Problem, workspace: str | None, cwd: str) -> str:
    path = workspace_path(problem.file, workspace, cwd)
    return error_annotation(problem.message, path, problem.line, problem.column)


def deploy_annotations(outcome: DeployOutcome, workspace: str | None, cwd: str) -> str:
    """One ``::error`` line per problem (nothing when the deploy passes)."""
    return "".join(problem_annotation(p, workspace, cwd) + "\n" for p in outcome.problems)
