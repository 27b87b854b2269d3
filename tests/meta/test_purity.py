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
#: Every module of the ``core`` package, found on disk so a new one cannot slip past.
CORE = tuple(sorted(str(p.relative_to(PKG)) for p in (PKG / "core").rglob("*.py")))
#: Pure modules outside ``core``: the cert model, its builder and derived views, its parser
#: the identity and structure checks are pure too.
PURE_OUTSIDE_CORE = (
    "cert/schema.py",
    "cert/provenance.py",
    "cert/build.py",
    "cert/derived.py",
    "cert/parse.py",
    "cert/identity.py",
    "cert/structure.py",
)
#: What a pure module may import from this package: the core, the pure cert modules, the
#: error kinds and the package root (only ``__version__``).
ALLOWED_PACKAGE_PREFIXES = (
    "core",
    "cert.schema",
    "cert.provenance",
    "cert.build",
    "cert.derived",
    "cert.parse",
    "cert.identity",
    "cert.structure",
    "errors",
)
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


def test_the_core_package_is_found() -> None:
    assert "core/__init__.py" in CORE and "core/verdict.py" in CORE and len(CORE) >= 8


def _allowed(sub: str) -> bool:
    return sub == "" or any(sub == p or sub.startswith(p + ".") for p in ALLOWED_PACKAGE_PREFIXES)


@pytest.mark.parametrize("name", CORE + PURE_OUTSIDE_CORE)
def test_core_module_imports_no_io(name: str) -> None:
    text = (PKG / name).read_text(encoding="utf-8")
    tree = ast.parse(text)
    for mod in _imports(tree):
        top = mod.split(".")[0]
        assert top not in FORBIDDEN_MODULES, f"{name} imports {mod}"
        if top == "batch_invariance":
            sub = mod.split(".", 1)[1] if "." in mod else ""
            assert _allowed(sub), f"{name} imports {mod}"
    bad = sorted(set(_calls(tree)) & FORBIDDEN_CALLS)
    assert not bad, f"{name} calls {bad}"
    assert "environ" not in text


def test_the_checker_catches_a_forbidden_import() -> None:
    tree = ast.parse("def f():\n    import time\n    from os import path\n    return time.time()")
    assert {"time", "os"} <= set(_imports(tree))
    assert "time" in _calls(tree)


def test_package_root_is_pure() -> None:
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    assert _imports(tree) == []
