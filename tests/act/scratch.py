"""The repository act runs: a scratch git copy of this project, and act's HOME beside it.

act reads the repository it runs from git (its commit, its `origin` for github.repository) and
copies the working tree into its workspace. The copy holds the project's files as
``git ls-files`` lists them (tracked plus untracked, not ignored: what a push would hold) in
two commits:

1. ``source``: the project as it is. cell.yml checks out and installs exactly this commit.
2. ``act workflows``: the act stage's workflows under .github/workflows, and cell.yml and
   gate.yml with the two values act does not supply written in: ``job.workflow_repository``
   (the origin's name) and ``job.workflow_sha`` (commit 1, where a GitHub caller's ``uses:``
   would have resolved).

act's HOME holds an empty ``.actrc`` (act asks nothing and writes nothing in the real HOME) and
a ``.gitconfig`` that rewrites the origin's GitHub URL to the copy's own ``.git``, so the real
actions/checkout in cell.yml fetches commit 1 offline.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import REPO, TESTS

WORKFLOWS = TESTS / "act" / "workflows"
#: The repository the examples call (`addiplus/batch-invariance/...@v0`).
ORIGIN = "addiplus/batch-invariance"
ORIGIN_URL = f"https://github.com/{ORIGIN}"
#: The expressions act leaves empty, and what GitHub would put there.
WORKFLOW_REPOSITORY = "${{ job.workflow_repository }}"
WORKFLOW_SHA = "${{ job.workflow_sha }}"


@dataclass(frozen=True)
class Scratch:
    """The copy act runs (``repo``), act's HOME and the commit cell.yml installs."""

    repo: Path
    home: Path
    source_commit: str


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        [
            "git",
            "-c",
            "user.name=act stage",
            "-c",
            "user.email=act-stage@localhost",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def project_files() -> list[str]:
    listed = _git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def _with_workflow_identity(text: str, source_commit: str) -> str:
    """A called workflow with job.workflow_repository and job.workflow_sha written in."""
    if text.count(WORKFLOW_REPOSITORY) < 1 or text.count(WORKFLOW_SHA) < 1:
        raise AssertionError(
            "cell.yml or gate.yml no longer reads job.workflow_repository and job.workflow_sha: "
            "tests/act/scratch.py writes those in for act; update it"
        )
    return text.replace(WORKFLOW_REPOSITORY, ORIGIN).replace(WORKFLOW_SHA, source_commit)


def make_scratch(root: Path) -> Scratch:
    """Build the copy and act's HOME under ``root`` (which must not exist yet)."""
    repo, home = root / "repo", root / "home"
    for name in project_files():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "source")
    source_commit = _git(repo, "rev-parse", "HEAD")
    for name in ("cell.yml", "gate.yml"):  # both check out and install their own source
        called = repo / ".github" / "workflows" / name
        called.write_text(_with_workflow_identity(called.read_text(), source_commit))
    for workflow in sorted(WORKFLOWS.glob("*.yml")):
        shutil.copy2(workflow, repo / ".github" / "workflows" / f"act-{workflow.name}")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "act workflows")
    _git(repo, "remote", "add", "origin", ORIGIN_URL)
    home.mkdir(parents=True)
    (home / ".actrc").write_text("")
    (home / ".gitconfig").write_text(f'[url "file://{repo}/.git"]\n\tinsteadOf = {ORIGIN_URL}\n')
    return Scratch(repo=repo, home=home, source_commit=source_commit)
