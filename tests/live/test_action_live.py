"""The Action's entrypoint in live mode on the embedded default (real llama-server + model).

Runs ``python -m batch_invariance.action`` as the runner would, with no server-bin/model so
the entrypoint provisions the embedded default itself, on a tiny work-set with short
generations and two C passes (well under 90 s on 2 cores). Signing is off here: there is no
OIDC identity outside GitHub Actions.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from batch_invariance import exitcodes
from batch_invariance.cache_dir import cache_root
from batch_invariance.provision.embedded import provision

PROMPTS = [
    "Name the capital of France in one word.",
    "What is 7 plus 5? Answer with a number.",
    "List three primary colors.",
    "Give a synonym for 'quick'.",
]


def _env(tmp_path: Path, **inputs: str) -> dict[str, str]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "out").touch()
    (tmp_path / "summary").touch()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_", "ACTIONS_"))
    }
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_OUTPUT": str(tmp_path / "out"),
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary"),
            # The entrypoint provisions from the same cache the suite already filled.
            "BATCH_INVARIANCE_CACHE": str(cache_root()),
        }
    )
    env.update({f"INPUT_{name.upper()}": value for name, value in inputs.items()})
    return env


def _run(env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batch_invariance.action"],
        env=env,
        cwd=env["GITHUB_WORKSPACE"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _outputs(path: Path) -> dict[str, str]:
    """$GITHUB_OUTPUT in the heredoc form the entrypoint writes (``name<<DELIM``)."""
    values: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        if "<<" in lines[i]:
            name, delimiter = lines[i].split("<<", 1)
            end = lines.index(delimiter, i + 1)
            values[name] = "\n".join(lines[i + 1 : end])
            i = end
        i += 1
    return values


@pytest.fixture(scope="module")
def embedded() -> None:
    provision()  # builds or verifies the cached pair once, before the timed runs


def test_a_plan_on_the_embedded_default_that_cannot_pass_is_refused_before_any_launch(
    embedded: None, tmp_path: Path
) -> None:
    """Four prompts and 8-token answers can never be GREEN: the plan step says why, with
    the fix, and no server starts. (A live cell through the entrypoint runs in the Docker and
    act stages, in the action's container.)"""
    env = _env(
        tmp_path,
        mode="live",
        workset="tiny.json",
        ctx="512",
        parallel="2",
        **{"gate-passes": "2", "reps": "1", "n-predict": "8", "sign": "false"},
    )
    workset = Path(env["GITHUB_WORKSPACE"]) / "tiny.json"
    workset.write_text(json.dumps([{"id": f"q{i}", "prompt": p} for i, p in enumerate(PROMPTS)]))
    before = {p.pid for p in psutil.process_iter()}
    proc = _run(env, timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == exitcodes.USAGE, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "::error title=batch-invariance refused to launch (no verdict)::" in proc.stdout
    assert "too few distinct prompts: 4" in proc.stdout
    assert "answer budget under the length gate: --n-predict 8" in proc.stdout
    # No verdict outputs; the refused plan, with its causes, for the failure's artifact.
    outputs = _outputs(tmp_path / "out")
    assert set(outputs) == {"cell-id", "debug-paths"}
    plan = Path(env["GITHUB_WORKSPACE"]) / outputs["debug-paths"]
    assert "this plan cannot reach GREEN: too few distinct prompts: 4" in plan.read_text()
    assert not list((Path(env["GITHUB_WORKSPACE"]) / "batch-invariance-certs").glob("*.json"))
    started = [p for p in psutil.process_iter(["name"]) if p.pid not in before]
    assert not [p for p in started if "llama-server" in (p.info["name"] or "")]


def test_live_server_that_dies_is_an_infrastructure_failure(embedded: None, tmp_path: Path) -> None:
    got = provision()
    env = _env(tmp_path, sign="false", ctx="512", parallel="2")
    fake = Path(env["GITHUB_WORKSPACE"]) / "llama-server"
    fake.write_text("#!/bin/sh\necho 'fatal: no device' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env["INPUT_SERVER-BIN"] = "llama-server"  # relative: taken under the workspace
    env["INPUT_MODEL"] = str(got.model)
    proc = _run(env, timeout=120)
    assert proc.returncode == exitcodes.INFRA, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "::error title=batch-invariance infrastructure failure (no verdict)::" in proc.stdout
    # No verdict outputs; the plan and the server's own log for the failure's artifact.
    outputs = _outputs(tmp_path / "out")
    assert set(outputs) == {"cell-id", "debug-paths"}
    plan, *logs = outputs["debug-paths"].splitlines()
    workspace = Path(env["GITHUB_WORKSPACE"])
    assert plan.endswith(".plan.txt") and "out-dir: " in (workspace / plan).read_text()
    assert any("fatal: no device" in (workspace / log).read_text() for log in logs), logs
