"""The Engine is the only door to llama-server: outside its own package, ``deploy/``, ``gate/``
and ``serve/`` (which read llama-server's deploy files and command lines by design: check-deploy
statically, serve at start) only the registry and the look-alike import it,
and no code in ``core/`` carries a llama-server word (its docstrings may explain one)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "batch_invariance"
ENGINE = "batch_invariance.engines.llama_server"
#: The modules allowed to open the door: the registry names the engine, the look-alike imitates it.
DOORS = {"engines/registry.py", "mock/launcher.py"}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def engine_importers(package: Path) -> set[str]:
    found = set()
    for path in package.rglob("*.py"):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(("engines/llama_server/", "deploy/", "gate/", "serve/")):
            continue
        names = _imports(ast.parse(path.read_text(encoding="utf-8")))
        if any(n == ENGINE or n.startswith(ENGINE + ".") for n in names):
            found.add(rel)
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def engine_words(source: str) -> list[str]:
    """String constants and names (not docstrings, not comments) that name llama-server."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        else:
            continue
        if "llama" in text.lower():
            words.append(text)
    return words


def test_only_the_registry_and_the_look_alike_import_llama_server() -> None:
    assert engine_importers(PACKAGE) <= DOORS


def test_the_core_names_no_engine_in_its_code() -> None:
    found = {
        path.name: words
        for path in sorted((PACKAGE / "core").glob("*.py"))
        if (words := engine_words(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "arms.py").write_text(
        "from batch_invariance.engines.llama_server.probes import server_chat_template\n"
    )
    assert engine_importers(tmp_path) == {"run/arms.py"}
    advice = '"""Why llama-server matters."""\nADVICE = "--no-cache-prompt (llama-server)"\n'
    assert engine_words(advice) == ["--no-cache-prompt (llama-server)"]
