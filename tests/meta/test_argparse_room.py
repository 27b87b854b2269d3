"""argparse only in ``commands/`` (and ``cli.py``): lower layers own their options as data
(:mod:`batch_invariance.cert.option_table`) and never build a parser."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "batch_invariance"


def argparse_importers(package: Path) -> set[str]:
    """Every module outside ``commands/`` and ``cli.py`` that imports argparse."""
    found = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("commands/") or rel == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "argparse" or n.startswith("argparse.") for n in names):
                found.add(rel)
    return found


def test_argparse_is_imported_only_in_commands() -> None:
    assert argparse_importers(PACKAGE) == set()


def test_the_check_catches_a_parser_below_commands(tmp_path: Path) -> None:
    (tmp_path / "commands").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "cli.py").write_text("import argparse\n")
    (tmp_path / "commands" / "serve.py").write_text("import argparse\n")
    (tmp_path / "deploy" / "reader.py").write_text("from argparse import ArgumentParser\n")
    (tmp_path / "deploy" / "fine.py").write_text('"""import argparse"""\n')
    assert argparse_importers(tmp_path) == {"deploy/reader.py"}
