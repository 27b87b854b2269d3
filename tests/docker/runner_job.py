"""A simulated runner job for the action-image tests (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
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
