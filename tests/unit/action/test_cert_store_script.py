"""action/cert-store.sh, the gate workflow's store, against a local bare repository standing in
for the repository's `batch-invariance-certs` branch (STORE_URL): an absent branch is an
empty store, push adds each cert once under its sha256 with the files beside it, and two runs
that push at once both land (the second rebases on the first)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "action" / "cert-store.sh"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git")


def _store(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "STORE_URL": f"file://{tmp_path / 'store.git'}",
        "GITHUB_REPOSITORY": "octo/deploy",
        "GITHUB_RUN_ID": "7",
        "STORE_TOKEN": "",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def _fresh(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cert = folder / f"{name}.json"
    cert.write_text(body)
    (folder / f"{name}.json.sigstore.json").write_text("{}")
    return cert


def _listed(tmp_path: Path) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "store.git"), "ls-tree", "-r", "--name-only",
         "batch-invariance-certs"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(out.split())


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "--quiet", "--bare", str(tmp_path / "store.git")], check=True)
    return tmp_path


def test_an_absent_branch_is_an_empty_store(bare: Path) -> None:
    done = _store(bare, "fetch", str(bare / "clone"))
    assert done.returncode == 0, done.stderr
    assert "no branch batch-invariance-certs yet: the store is empty" in done.stdout
    assert (bare / "clone").is_dir() and not any((bare / "clone").iterdir())


def test_push_adds_each_cert_once_under_its_sha256(bare: Path) -> None:
    cert = _fresh(bare / "run1", "m__ctx256__N8", '{"a": 1}\n')
    (bare / "run1" / "m__ctx256__N8.json.intoto.sigstore.json").write_text("{}")
    (bare / "run1" / "plan.json").write_text("{}")  # the run's plan beside it: not a cert
    assert _store(bare, "fetch", str(bare / "c1")).returncode == 0
    pushed = _store(bare, "push", str(bare / "c1"), str(bare / "run1"))
    assert pushed.returncode == 0 and "pushed 1 cert(s)" in pushed.stdout, pushed.stderr
    digest = hashlib.sha256(cert.read_bytes()).hexdigest()
    assert _listed(bare) == [
        f"certs/{digest}/m__ctx256__N8.json",
        f"certs/{digest}/m__ctx256__N8.json.intoto.sigstore.json",
        f"certs/{digest}/m__ctx256__N8.json.sigstore.json",
    ]
    # The same cert measured again (another run's artifact): nothing new.
    assert _store(bare, "fetch", str(bare / "c2")).returncode == 0
    again = _store(bare, "push", str(bare / "c2"), str(bare / "run1"))
    assert again.returncode == 0 and "nothing new to store" in again.stdout


def test_two_runs_pushing_at_once_both_land(bare: Path) -> None:
    _fresh(bare / "seed", "seed__ctx1__N2", '{"seed": 1}\n')
    assert _store(bare, "push", str(bare / "c0"), str(bare / "seed")).returncode == 0
    # Both fetch the same tip, then push one after the other: the second is refused and
    # rebases onto the first.
    assert _store(bare, "fetch", str(bare / "a")).returncode == 0
    assert _store(bare, "fetch", str(bare / "b")).returncode == 0
    _fresh(bare / "run-a", "a__ctx1__N2", '{"a": 1}\n')
    _fresh(bare / "run-b", "b__ctx1__N2", '{"b": 1}\n')
    assert _store(bare, "push", str(bare / "a"), str(bare / "run-a")).returncode == 0
    second = _store(bare, "push", str(bare / "b"), str(bare / "run-b"))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "push refused (attempt 1); rebasing" in second.stdout
    names = [Path(name).name for name in _listed(bare) if not name.endswith(".sigstore.json")]
    assert sorted(names) == ["a__ctx1__N2.json", "b__ctx1__N2.json", "seed__ctx1__N2.json"]
