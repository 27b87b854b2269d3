"""The package's layers import one way, as the import-linter contract in pyproject.toml says.

The contract is run on the tree as it is (it must be kept), and on a copy of the package with
one import turned backwards (it must be broken, naming the two layers): a test that could not
fail would keep nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import batch_invariance

PKG = Path(batch_invariance.__file__).parent
PYPROJECT = PKG.parents[1] / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(
    config: Path, cwd: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_tree_keeps_its_layers() -> None:
    proc = _lint(PYPROJECT, PYPROJECT.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_a_backward_import_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "batch_invariance"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    plan = copy / "core" / "plan.py"
    # The core reaching up into the service layer: the kind of arrow the contract forbids.
    plan.write_text(plan.read_text() + "\nimport batch_invariance.service.live  # noqa\n")
    config = tmp_path / "pyproject.toml"
    shutil.copyfile(PYPROJECT, config)
    proc = _lint(config, tmp_path, pythonpath=tmp_path / "src")
    assert proc.returncode != 0, proc.stdout
    assert "batch_invariance.core is not allowed to import batch_invariance.service" in proc.stdout
    assert "batch_invariance.core.plan -> batch_invariance.service.live" in proc.stdout
