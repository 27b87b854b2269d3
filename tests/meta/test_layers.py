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


def test_a_backward_import_breaks_the_contract(tmp_path: Path) -> None:
    # The core reaching up into the service layer: the kind of arrow the contract forbids.
    proc = _broken_copy(tmp_path, "core/plan.py", "import batch_invariance.service.live")
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    assert "batch_invariance.core is not allowed to import batch_invariance.service" in said
    assert "batch_invariance.core.plan -> batch_invariance.service.live" in said


def test_the_gate_importing_a_reader_breaks_the_layers(tmp_path: Path) -> None:
    # The gate's rules reaching into a deploy file's reader: serve would then depend on
    # check-deploy's reading of files, and the rules would no longer be one set for both.
    proc = _broken_copy(tmp_path, "gate/cells.py", "import batch_invariance.deploy.readers.shell")
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    assert "batch_invariance.gate is not allowed to import batch_invariance.deploy" in said
    assert "batch_invariance.gate.cells -> batch_invariance.deploy.readers.shell" in said


def test_serve_importing_check_deploy_breaks_the_layers(tmp_path: Path) -> None:
    # serve and check-deploy share the gate, never each other's own modules.
    proc = _broken_copy(
        tmp_path, "serve/command_cert.py", "import batch_invariance.deploy.deploy_report"
    )
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    assert "batch_invariance.serve is not allowed to import batch_invariance.deploy" in said
    assert "batch_invariance.serve.command_cert -> batch_invariance.deploy.deploy_report" in said


def test_a_reader_importing_the_report_breaks_the_deploy_rooms(tmp_path: Path) -> None:
    # A reader reaching into check-deploy's report: the deploy files read in terms of certs.
    proc = _broken_copy(
        tmp_path, "deploy/readers/shell.py", "import batch_invariance.deploy.outcome"
    )
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    assert "check-deploy's report reads deploy files through the readers" in said
    assert (
        "batch_invariance.deploy.readers is not allowed to import batch_invariance.deploy.outcome"
        in said
    )
    assert "batch_invariance.deploy.readers.shell -> batch_invariance.deploy.outcome" in said


def test_a_neutral_module_importing_llama_server_breaks_the_engine_seam(tmp_path: Path) -> None:
    # The driver reaching past the Engine into one engine's flag reader.
    proc = _broken_copy(
        tmp_path, "run/arms.py", "import batch_invariance.engines.llama_server.flags"
    )
    assert proc.returncode != 0, proc.stdout
    said = _said(proc)
    assert "the engine seam: the neutral layers import no engine's own package BROKEN" in said
    assert "batch_invariance.run.arms -> batch_invariance.engines.llama_server.flags" in said


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
