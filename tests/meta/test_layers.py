"""The package's layers import one way, as the import-linter contracts in pyproject.toml say.

The contracts are run on the tree as it is (each must be kept), and on a copy of the package
with one import turned backwards (it must be broken, naming the two layers): a test that could
not fail would keep nothing. The gate's rules (``gate/``) import neither check-deploy
(``deploy/``) nor ``serve/``, which share the gate and never import each other; inside
``deploy/``, check-deploy's report reads deploy files through the readers, never the reverse.
The engine seam: no neutral module imports llama-server's own package (the registry and the
mock's look-alike are the doors).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import batch_invariance
from batch_invariance.cert.signing_policy import load_toml

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


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    """Its stdout with every run of blanks one space (lint-imports wraps long lines)."""
    return " ".join(proc.stdout.split())


def _broken_copy(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the package with ``line`` appended to ``module``."""
    copy = tmp_path / "src" / "batch_invariance"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    config = tmp_path / "pyproject.toml"
    shutil.copyfile(PYPROJECT, config)
    return _lint(config, tmp_path, pythonpath=tmp_path / "src")


def test_the_tree_keeps_its_layers() -> None:
    proc = _lint(PYPROJECT, PYPROJECT.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every contract's name, as pyproject.toml gives it (the first key named ``name`` after
    # each ``[[tool.importlinter.contracts]]``).
    sections = PYPROJECT.read_text().split("[[tool.importlinter.contracts]]")[1:]
    names = [re.search(r'^name = "(.+)"$', s, re.M) for s in sections]
    said = _said(proc)
    assert names and all(names), sections
    assert f"{len(names)} kept, 0 broken" in said
    for name in names:
        assert name is not None and f"{name.group(1)} KEPT" in said


#: Each arrow a contract forbids, turned backwards on a copy: (module, the import appended,
#: what lint-imports must then say).
BACKWARD = [
    pytest.param(  # the core reaching up into the service layer
        "core/plan.py", "batch_invariance.service.live",
        ("batch_invariance.core is not allowed to import batch_invariance.service",
         "batch_invariance.core.plan -> batch_invariance.service.live"),
        id="core-imports-service",
    ),
    pytest.param(  # the gate's rules reaching into a reader: serve would depend on the reading
        "gate/cells.py", "batch_invariance.deploy.readers.shell",
        ("batch_invariance.gate is not allowed to import batch_invariance.deploy",
         "batch_invariance.gate.cells -> batch_invariance.deploy.readers.shell"),
        id="gate-imports-reader",
    ),
    pytest.param(  # serve and check-deploy share the gate, never each other's own modules
        "serve/command_cert.py", "batch_invariance.deploy.deploy_report",
        ("batch_invariance.serve is not allowed to import batch_invariance.deploy",
         "batch_invariance.serve.command_cert -> batch_invariance.deploy.deploy_report"),
        id="serve-imports-check-deploy",
    ),
    pytest.param(  # a reader reaching into check-deploy's report
        "deploy/readers/shell.py", "batch_invariance.deploy.outcome",
        ("check-deploy's report reads deploy files through the readers",
         "batch_invariance.deploy.readers is not allowed to import batch_invariance.deploy.outcome",
         "batch_invariance.deploy.readers.shell -> batch_invariance.deploy.outcome"),
        id="reader-imports-report",
    ),
    pytest.param(  # the driver reaching past the Engine into one engine's flag reader
        "run/arms.py", "batch_invariance.engines.llama_server.flags",
        ("the engine seam: the neutral layers import no engine's own package BROKEN",
         "batch_invariance.run.arms -> batch_invariance.engines.llama_server.flags"),
        id="neutral-imports-llama-server",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("module", "imported", "phrases"), BACKWARD)
def test_a_backward_import_breaks_its_contract(
    tmp_path: Path, module: str, imported: str, phrases: tuple[str, ...]
) -> None:
    proc = _broken_copy(tmp_path, module, f"import {imported}")
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    for phrase in phrases:
        assert phrase in said, said


def test_the_engine_seam_covers_every_module_but_the_doors_and_the_deploy_contract() -> None:
    config = load_toml(PYPROJECT.read_text(encoding="utf-8"), str(PYPROJECT))
    contracts = config["tool"]["importlinter"]["contracts"]
    seam = next(c for c in contracts if c["id"] == "engine-seam")
    top = {p.stem for p in PKG.glob("*.py")} | {
        p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()
    }
    engines = {p.stem for p in (PKG / "engines").glob("*.py")}
    # deploy/, gate/ and serve/ read llama-server's own deploy files and command lines.
    doors = {"__init__", "__main__", "deploy", "engines", "gate", "serve"}
    expected = {f"batch_invariance.{n}" for n in top - doors}
    expected |= {f"batch_invariance.engines.{n}" for n in engines - {"__init__", "registry"}}
    assert set(seam["source_modules"]) == expected
