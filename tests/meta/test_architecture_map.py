"""docs/architecture.md is the map: its tree names every module of the package, in the folder
it lives in, and it says where a newcomer starts. A module added without a line there fails
here, naming it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "batch_invariance"
DOC = ROOT / "docs" / "architecture.md"
_NAME = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*\.py\b")


def _tree(text: str) -> list[str]:
    """The lines of the fenced block that draws ``batch_invariance/``."""
    blocks = re.findall(r"```\n(batch_invariance/\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/architecture.md draws the package tree in one fenced block"
    return blocks[0].splitlines()[1:]


def named_modules(text: str) -> set[str]:
    """``folder/module.py`` for every ``*.py`` the tree names, by the folder it is drawn under
    (a line ending a word in ``/`` opens a folder for the lines indented deeper)."""
    names: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, folder path)
    for line in _tree(text):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        first = line.split()[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        where = folders[-1][1] if folders else ""
        if first.endswith("/"):
            folders.append((indent, f"{where}{first}"))
            where = f"{where}{first}"
            line = line.replace(first, "", 1)
        for name in _NAME.findall(line):
            names.add(name if "/" in name else f"{where}{name}")
    return names


def package_modules() -> set[str]:
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if not path.name.startswith("__")
    }


def test_the_map_names_every_module() -> None:
    missing = sorted(package_modules() - named_modules(DOC.read_text(encoding="utf-8")))
    assert missing == [], f"docs/architecture.md does not name: {', '.join(missing)}"


def test_the_map_names_no_module_that_is_gone() -> None:
    stale = sorted(named_modules(DOC.read_text(encoding="utf-8")) - package_modules())
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_map_says_where_a_newcomer_starts() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "## Where to start reading" in text


def test_a_module_the_map_does_not_name_is_caught() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "core/verdict.py" in named_modules(text)
    without = text.replace("verdict.py", "verdict_gone.py")
    assert "core/verdict.py" not in named_modules(without)
