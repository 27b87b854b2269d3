"""Shared by every test: one marker per kind of test, decided by the folder a test lives in,
and the fixtures more than one folder uses.

Kinds (registered in pyproject.toml; CONTRIBUTING.md says how long each takes):

- ``tests/unit``, ``tests/meta``, ``tests/browser``: no marker; seconds to minutes, no server.
- ``tests/live`` -> ``live``: a real llama-server (or another engine) on loopback.
- ``tests/docker`` -> ``docker`` and ``tests/act`` -> ``act``: a Docker engine, the action
  image and act. They run only when the ``-m`` expression names their marker (``pytest -m
  docker``), as ``.ci/docker-stage`` and ``.ci/act-stage`` do, so ``python -m pytest`` and
  ``python -m pytest -m "not live"`` never start them.
- ``slow`` (set by a test itself): a test that takes minutes even among its kind.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from batch_invariance.cert.memo import MEMO_ENV
from tests.support.fakes_live import start_decoy
from tests.support.paths import TESTS

# Every test verifies certs in full, as verify-cert does, and leaves nothing in the user's
# cache; tests/unit/cert/test_memo.py turns the memo on in a folder of its own.
os.environ[MEMO_ENV] = "off"

# Property tests draw the same examples on every run (``derandomize``), so CI cannot fail on an
# example no run here has seen; ``BATCH_INVARIANCE_HYPOTHESIS=explore`` draws fresh ones each
# run: what a developer runs to look for new cases before committing the finding as a test.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("BATCH_INVARIANCE_HYPOTHESIS", "fixed"))

#: The folder under tests/ that decides a test's marker.
FOLDER_MARKERS = {"live": "live", "docker": "docker", "act": "act"}
#: Markers whose tests run only when the ``-m`` expression names them.
OPT_IN = ("docker", "act")


def pytest_itemcollected(item: pytest.Item) -> None:
    folder = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
    marker = FOLDER_MARKERS.get(folder)
    if marker is not None:
        item.add_marker(marker)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    named = str(config.getoption("markexpr") or "")
    opt_out = [m for m in OPT_IN if not re.search(rf"\b{m}\b", named)]
    if not opt_out:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if any(item.get_closest_marker(m) for m in opt_out) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture()
def decoy(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process named ``llama-server`` that this test (not the tool) started: it must survive
    every path of the code under test."""
    proc = start_decoy(tmp_path / "decoy", 600)
    yield proc
    proc.kill()
    proc.wait()
