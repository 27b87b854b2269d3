"""The tests mirror the source (CONTRIBUTING.md): every folder under tests/unit names a package
or module of batch_invariance, no test module sits loose in tests/, and no test edits
``sys.path`` (helpers are imported as ``tests.support.*``)."""

from __future__ import annotations

import re
from pathlib import Path

import batch_invariance
from tests.support.paths import TESTS

PKG = Path(batch_invariance.__file__).parent
UNIT = TESTS / "unit"


def _folders(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")


def test_every_unit_folder_mirrors_a_package_or_module() -> None:
    stray = [
        str(folder.relative_to(TESTS))
        for folder in _folders(UNIT)
        if not (PKG / folder.relative_to(UNIT)).is_dir()
        and not (PKG / folder.relative_to(UNIT)).with_suffix(".py").is_file()
    ]
    assert stray == [], f"test folders with no source beside them: {stray}"


def test_no_test_module_sits_loose_in_tests() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"move {loose} under tests/unit/<package>/ (CONTRIBUTING.md)"


def test_every_test_folder_is_a_package() -> None:
    folders = [TESTS, *(f for f in _folders(TESTS) if any(f.glob("*.py")))]
    missing = [
        str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").is_file()
    ]
    assert missing == [], f"no __init__.py in {missing}: tests import as tests.<folder>.<module>"


def test_no_test_edits_sys_path() -> None:
    edit = re.compile(r"sys\.path\.(insert|append)|sys\.path\s*=")
    found = [
        str(p.relative_to(TESTS.parent))
        for p in TESTS.rglob("*.py")
        if p != Path(__file__) and edit.search(p.read_text(encoding="utf-8"))
    ]
    assert found == [], f"sys.path edited in {found}: import helpers as tests.support.*"
