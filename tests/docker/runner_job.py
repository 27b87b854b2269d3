"""A simulated runner job for the action-image tests (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO

SCRIPT = REPO / "action" / "run-container.sh"
#: The non-root owner of the simulated runner's work folders (the runner user).
RUNNER_UID = 1001


@dataclass
class Job:
    """One simulated runner job: work folders owned by the runner user, and its variables."""

    root: Path
    workspace: Path
    file_commands: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def output(self) -> Path:
        return self.file_commands / "set_output_1"

    @property
    def summary(self) -> Path:
        return self.file_commands / "step_summary_1"

    def run(self, timeout: float, **inputs: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        env.update({f"INPUT_{k.upper().replace('-', '_')}": v for k, v in inputs.items()})
        return subprocess.run(
            ["bash", str(SCRIPT)],
            env=env,
            cwd=self.workspace,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def not_owned_by_runner(self) -> list[str]:
        """Paths under the workspace and home that the runner user does not own."""
        owner = self.workspace.stat().st_uid
        wrong: list[str] = []
        for top in (self.workspace, self.root / "temp" / "_github_home"):
            for folder, dirs, files in os.walk(top):
                for name in [*dirs, *files]:
                    path = Path(folder) / name
                    if path.lstat().st_uid != owner:
                        wrong.append(str(path.relative_to(self.root)))
        return wrong


def base_env() -> dict[str, str]:
    """The host variables the container script needs (the engine, the base image, the build
    network), with the action's path and no workspace of a job."""
    keep = ("PATH", "DOCKER_HOST", "BI_BASE_IMAGE", "BI_BUILD_NETWORK", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["BI_ACTION_PATH"] = str(REPO)
    env.setdefault("GITHUB_WORKSPACE", str(REPO))
    env.setdefault("GITHUB_OUTPUT", os.devnull)
    return env


def new_job(root: Path, own: Callable[[Path], None] = lambda _: None) -> Job:
    """A runner job's folders under ``root`` (each given to ``own``) and its variables."""
    workspace = root / "work" / "repo" / "repo"
    temp = root / "temp"
    file_commands = temp / "_runner_file_commands"
    for folder in (workspace, file_commands, temp / "_github_home"):
        folder.mkdir(parents=True)
    made = Job(root=root, workspace=workspace, file_commands=file_commands)
    made.output.touch()
    made.summary.touch()
    for path in [root, *root.rglob("*")]:
        own(path)
    made.env = {
        **base_env(),
        "GITHUB_WORKSPACE": str(workspace),
        "RUNNER_TEMP": str(temp),
        "GITHUB_OUTPUT": str(made.output),
        "GITHUB_STEP_SUMMARY": str(made.summary),
        "GITHUB_REPOSITORY": "octo/repo",
        "GITHUB_RUN_ID": "1",
        "GITHUB_RUN_ATTEMPT": "1",
        "BI_IMAGE": "",
    }
    return made
