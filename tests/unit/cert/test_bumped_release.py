"""Certs outlive releases: a copy of this package with the next patch version (and these
rules) verifies, deploys and compares a cert this version wrote, and every shipped example
cert; a copy with other rules refuses it, naming the rules that would re-derive it
(core/rules.py, docs/output-contract.md).

The copies are this working tree's package with the version (and, for the second, the rules)
bumped, installed for real by pip (``pip install --no-deps --target``, build isolation
fetching the build backend pyproject names, as any install does) and run as ``python -m
batch_invariance`` with the target first on ``PYTHONPATH``. About 15 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from batch_invariance import __version__, exitcodes
from batch_invariance.cert.advice import engine_advice
from batch_invariance.cert.build import rederive
from batch_invariance.cert.store import render
from batch_invariance.core.rules import RULES_VERSION
from tests.support.deploy_world import (
    OK_FLAGS,
    _live_cert,
    deploy_files,
    path_line,
    served,
)
from tests.support.factories import comparable_cert, load_cert
from tests.support.paths import EXAMPLES, REPO

PATCH = re.sub(r"(\d+)$", lambda m: str(int(m.group(1)) + 1), __version__)
#: The certs this repository ships (the README's tour verifies one of them).
SHIPPED = sorted((EXAMPLES / "certs").rglob("*.json"))


def _replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path}: expected {old!r} once"
    path.write_text(text.replace(old, new), encoding="utf-8")


def _release(root: Path, version: str, rules: int) -> Path:
    """This tree's package as release ``version`` with rules ``rules``, installed by pip into
    a folder of its own, which is returned."""
    shutil.copytree(
        REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(REPO / name, root / name)
    _replace_once(root / "pyproject.toml", f'version = "{__version__}"', f'version = "{version}"')
    pkg = root / "src" / "batch_invariance"
    _replace_once(
        pkg / "__init__.py", f'__version__ = "{__version__}"', f'__version__ = "{version}"'
    )
    rules_line = f"RULES_VERSION: Final = {RULES_VERSION}\n"
    _replace_once(pkg / "core" / "rules.py", rules_line, f"RULES_VERSION: Final = {rules}\n")
    site = root / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(root)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    return site


def _run(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, *args], cwd=src.parent, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _cli(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(src, "-m", "batch_invariance", *args)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A promotable live cert written by this version, the deploy it covers, and the two
    bumped copies."""
    root = tmp_path_factory.mktemp("releases")
    model, binary = deploy_files(root)
    green = _live_cert(root / "certs", model)
    assert json.loads(green.read_text())["tool_version"] == __version__
    deploy = root / "llama-server.sh"
    # The deploy starts serve (a server started directly is never a pass): the engine command
    # after -- is the cell the gate reads.
    engine = f"llama-server -m {model} {OK_FLAGS}"
    deploy.write_text(path_line(binary) + f"exec {served(engine, root / 'certs')}\n")
    # compare needs what run-live records for it (work-set, request template, scorer)
    comparable = root / "comparable.json"
    comparable.write_text(render(comparable_cert()), encoding="utf-8")
    # A cert as written before the rules were versioned: a shipped one without its
    # rules_version, re-derived by this version (so its digest holds).
    unversioned = root / "unversioned.json"
    stripped = replace(load_cert(SHIPPED[0]), rules_version=None)
    unversioned.write_text(render(rederive(stripped, engine_advice)), encoding="utf-8")
    return {
        "green": green,
        "comparable": comparable,
        "unversioned": unversioned,
        "certs": root / "certs",
        "deploy": deploy,
        "patch": _release(root / "patch", PATCH, RULES_VERSION),
        "rules": _release(root / "rules", PATCH, RULES_VERSION + 1),
    }


def test_the_copies_are_the_releases_they_claim(world: dict[str, Path]) -> None:
    probe = (
        "import batch_invariance as b, batch_invariance.core.rules as r; "
        "print(b.__file__, b.__version__, r.RULES_VERSION)"
    )
    for name, rules in (("patch", RULES_VERSION), ("rules", RULES_VERSION + 1)):
        found = _run(world[name], "-c", probe)
        file, version, seen = found.stdout.split()
        assert Path(file).is_relative_to(world[name]) and (version, int(seen)) == (PATCH, rules)
    assert __version__ != PATCH


def test_the_next_patch_release_verifies_deploys_and_compares_this_versions_cert(
    world: dict[str, Path],
) -> None:
    src, green = world["patch"], str(world["green"])
    verified = _cli(src, "verify-cert", green)
    assert verified.returncode == exitcodes.PROMOTABLE, verified.stderr
    assert "promotable: yes" in verified.stdout
    deploy = _cli(src, "check-deploy", str(world["deploy"]), "--certs", str(world["certs"]),
                  "--allow-unsigned")  # fmt: skip
    assert deploy.returncode == exitcodes.PROMOTABLE, deploy.stdout + deploy.stderr
    assert "check-deploy: PASS: 1 batched cell(s) certified" in deploy.stdout
    cert = str(world["comparable"])
    compared = _cli(src, "compare", cert, cert, "--allow-unsigned", "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    data = json.loads(compared.stdout)
    assert data["worst"] == "identical" and data["comparable"] is True
    assert data["counts"]["identical"] == 32
    (cell,) = data["cells"]
    assert cell["baseline"]["rules_note"] is None  # verified in full: these are its rules
    assert cell["baseline"]["tool_version"] == __version__


def test_a_cert_without_rules_version_stays_with_its_own_release(world: dict[str, Path]) -> None:
    """Fail closed: written before the rules were versioned, so it holds the rules of exactly
    the release that wrote it; the next one refuses it and names that release."""
    data = json.loads(world["unversioned"].read_text(encoding="utf-8"))
    wrote = data["tool_version"]
    assert "rules_version" not in data and wrote != PATCH
    found = _cli(world["patch"], "verify-cert", str(world["unversioned"]))
    assert found.returncode == exitcodes.CERT_INVALID
    assert f"unversioned rules of {wrote}" in found.stderr
    assert f"re-derived only by the build of batch-invariance {wrote} that wrote it" in (
        found.stderr
    )
    assert "pip install" not in found.stderr


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_the_next_patch_release_verifies_every_shipped_example_cert(
    world: dict[str, Path], shipped: Path
) -> None:
    """The showcase outlives the release: the README's tour and examples/certs/README.md run
    verify-cert on these; each records its rules and exits with its own verdict's code."""
    status = json.loads(shipped.read_text(encoding="utf-8"))["status"]
    expected = {"green": exitcodes.PROMOTABLE, "failed": exitcodes.RED}[status]
    found = _cli(world["patch"], "verify-cert", str(shipped))
    assert found.returncode == expected, found.stdout + found.stderr
    assert "verdict re-derived from evidence matches" in found.stdout


def test_a_release_with_other_rules_refuses_the_cert_naming_the_version_to_install(
    world: dict[str, Path],
) -> None:
    src, green = world["rules"], str(world["green"])
    found = _cli(src, "verify-cert", green)
    assert found.returncode == exitcodes.CERT_INVALID
    assert found.stderr.count("\n") == 1
    assert (
        f"written by batch-invariance {__version__} (cert_version 3, rules {RULES_VERSION}); "
        f"its rules are not re-derivable here (this is batch-invariance {PATCH}, cert_version "
        f"3, rules {RULES_VERSION + 1})" in found.stderr
    )
    assert f"verify it with a release that reads rules {RULES_VERSION}" in found.stderr
    assert "pip install" not in found.stderr
    deploy = _cli(src, "check-deploy", str(world["deploy"]), "--certs", str(world["certs"]),
                  "--allow-unsigned")  # fmt: skip
    assert deploy.returncode != exitcodes.PROMOTABLE
    assert f"a release that reads rules {RULES_VERSION}" in deploy.stdout + deploy.stderr
