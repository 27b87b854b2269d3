"""The functional core imports nothing that does I/O and reads no clocks or environment.

Checked on the source (AST), so a forbidden import cannot hide behind a lazy import inside a
function, and transitively: a core module may only import other core modules from this
package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import batch_invariance

PKG = Path(batch_invariance.__file__).parent
CORE = ("evidence", "diff", "gates", "verdict", "stats", "certificate")
#: The package root (only ``__version__``) may be imported too.
ALLOWED_PACKAGE_MODULES = {*CORE, ""}
FORBIDDEN_MODULES = {
    "socket",
    "subprocess",
    "requests",
    "threading",
    "time",
    "os",
    "pathlib",
    "http",
    "urllib",
    "psutil",
    "random",
    "multiprocessing",
    "asyncio",
    "shutil",
    "tempfile",
    "signal",
    "sys",
    "io",
    "glob",
    "sigstore",
    "datetime",
}
FORBIDDEN_CALLS = {"open", "print", "input", "now", "utcnow", "today", "getenv"}


def _imports(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.append("batch_invariance." + (node.module or ""))
            else:
                names.append(node.module or "")
    return names


def _calls(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.append(f.id)
            elif isinstance(f, ast.Attribute):
                out.append(f.attr)
    return out


@pytest.mark.parametrize("name", CORE)
def test_core_module_imports_no_io(name: str) -> None:
    tree = ast.parse((PKG / f"{name}.py").read_text(encoding="utf-8"))
    for mod in _imports(tree):
        top = mod.split(".")[0]
        assert top not in FORBIDDEN_MODULES, f"{name}.py imports {mod}"
        if top == "batch_invariance":
            sub = mod.split(".", 1)[1] if "." in mod else ""
            assert sub.split(".")[0] in ALLOWED_PACKAGE_MODULES, f"{name}.py imports {mod}"
    bad = sorted(set(_calls(tree)) & FORBIDDEN_CALLS)
    assert not bad, f"{name}.py calls {bad}"
    assert "environ" not in (PKG / f"{name}.py").read_text(encoding="utf-8")


def test_the_checker_catches_a_forbidden_import() -> None:
    tree = ast.parse("def f():\n    import time\n    from os import path\n    return time.time()")
    assert {"time", "os"} <= set(_imports(tree))
    assert "time" in _calls(tree)


def test_package_root_is_pure() -> None:
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    assert _imports(tree) == []
