"""Fixtures for the action-image tests: a real Docker engine, the image, a runner-like job.

These tests build the image from the Dockerfile and run it through ``action/run-container.sh``
(the composite action's container step) exactly as on a runner. They carry the ``docker``
marker (tests/conftest.py) and run only when selected by it, as the Docker stage does
(``.ci/docker-stage``: it starts an engine, builds the base image and runs ``pytest -m docker
tests/docker``). Without a Docker engine they skip, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.runner_job import RUNNER_UID, SCRIPT, Job, base_env, new_job


def _own(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, RUNNER_UID, RUNNER_UID)


@pytest.fixture(scope="session")
def action_image() -> str:
    """Build the image once (through the script's own build path) and report the time."""
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode
    ):
        pytest.skip("no Docker engine answers `docker info`: .ci/docker-stage starts one")
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**base_env(), "BI_BUILD_ONLY": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\naction image built or reused in {time.monotonic() - started:.1f} s")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture
def job(tmp_path: Path, action_image: str) -> Iterator[Job]:
    root = tmp_path / "runner"
    made = new_job(root, _own)
    yield made
    # Leave nothing behind: the tests' containers run with --rm; the image stays cached.
    shutil.rmtree(root, ignore_errors=True)
