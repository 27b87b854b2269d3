"""The functional core imports nothing that does I/O and reads no clocks, files or environment.

Checked on the source (AST), so a forbidden import cannot hide behind a lazy import inside a
function, and transitively: a core module may only import other core modules from this
package. A file read (``open``, ``Path.read_text``, ``importlib.resources``) is I/O too, at
import time or later: package data a pure module needs is a generated module it imports.
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
    # llama-server's knowledge: its option table, flag reader, environment rules, fallback
    # template, and the Prometheus text parser every engine's gauges are read with.
    "engines/llama_server/option_table.py",
    "engines/llama_server/options.py",
    "engines/llama_server/flags.py",
    "engines/llama_server/option_values.py",
    "engines/llama_server/env.py",
    "engines/llama_server/chat_template.py",
    "engines/prometheus.py",
    # What every engine's rules are written in: its variables, a recorded argv's reading.
    "engines/variables.py",
    "engines/recorded.py",
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
    "engines.llama_server.option_table",
    "engines.llama_server.options",
    "engines.llama_server.flags",
    "engines.llama_server.option_values",
    "engines.llama_server.env",
    "engines.llama_server.chat_template",
    "engines.prometheus",
    "engines.variables",
    "engines.recorded",
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
    "importlib",
    "pkgutil",
    "builtins",
}
#: Calls that read a clock, the terminal, the environment or a file (``read_text`` and
#: ``read_bytes`` of a path or an ``importlib.resources`` traversable, ``files``).
FORBIDDEN_CALLS = {
    "open",
    "print",
    "input",
    "now",
    "utcnow",
    "today",
    "getenv",
    "read_text",
    "read_bytes",
    "open_text",
    "open_binary",
    "files",
    "__import__",
}


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


def impurities(text: str) -> list[str]:
    """What makes a module's source impure (empty: pure)."""
    tree = ast.parse(text)
    found: list[str] = []
    for mod in _imports(tree):
        top = mod.split(".")[0]
        if top in FORBIDDEN_MODULES:
            found.append(f"imports {mod}")
        if top == "batch_invariance":
            sub = mod.split(".", 1)[1] if "." in mod else ""
            if not _allowed(sub):
                found.append(f"imports {mod}")
    found.extend(f"calls {c}" for c in sorted(set(_calls(tree)) & FORBIDDEN_CALLS))
    if "environ" in text:
        found.append("reads environ")
    return found


@pytest.mark.parametrize("name", CORE + PURE_OUTSIDE_CORE)
def test_core_module_imports_no_io(name: str) -> None:
    assert impurities((PKG / name).read_text(encoding="utf-8")) == [], name


def test_the_checker_catches_a_forbidden_import() -> None:
    tree = ast.parse("def f():\n    import time\n    from os import path\n    return time.time()")
    assert {"time", "os"} <= set(_imports(tree))
    assert "time" in _calls(tree)


def test_package_root_is_pure() -> None:
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    assert _imports(tree) == []


def test_a_file_read_at_import_is_caught_on_a_copy(tmp_path: Path) -> None:
    # The option table as it was read before (package data through importlib.resources, at
    # import), written into a copy of the real pure module: the checker names the read.
    real = (PKG / "engines/llama_server/options.py").read_text(encoding="utf-8")
    assert impurities(real) == []
    violating = real + (
        "\nfrom importlib import resources\n"
        'TEXT = resources.files("batch_invariance.data").joinpath("t.json").read_text("utf-8")\n'
    )
    copy = tmp_path / "options.py"
    copy.write_text(violating, encoding="utf-8")
    found = impurities(copy.read_text(encoding="utf-8"))
    assert "imports importlib" in found and "calls read_text" in found and "calls files" in found
    path_read = real + '\nfrom pathlib import Path\nROWS = Path("t.txt").read_text()\n'
    assert impurities(path_read) == ["imports pathlib", "calls read_text"]
    assert impurities(real + "\nwith open('t') as f:\n    ROWS = f.read()\n") == ["calls open"]
