"""No two modules of the package import each other, directly or around a longer circle.

Read on the source (AST), not on ``sys.modules``: every ``import`` and ``from ... import`` of a
module of the package counts, at module level or inside a function (a lazy import hides a
circle from the interpreter, not from the reader). ``from pkg import name`` is an edge to the
submodule ``pkg.name`` where that is a module, else to ``pkg``; relative imports are resolved
against the importing module's package. Imports under ``if TYPE_CHECKING:`` are left out of
the runtime graph (they never run; their ``else:`` branch does) and checked on their own by
the stricter graph below, where the only circle the package had (``service.finish`` and
``service.live``, each reading the other's names) was broken. A dynamic import
(``importlib.import_module``, as ``cli`` loads its commands) is not an edge.

A circle is a strongly connected component of more than one module (Tarjan's algorithm).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import batch_invariance

PKG = Path(batch_invariance.__file__).parent

#: Circles the package still has, each a sorted tuple of module names: a known-and-shrinking
#: allowlist (an entry goes when its circle is broken; none is ever added). Empty: the last
#: one, ``service.finish`` <-> ``service.live``, was broken by moving the live cell's
#: provenance block beside the job it reads.
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under the package folder ``root``: its dotted name -> (file, is package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    nodes: Iterable[ast.AST], typing_imports: bool
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in or under ``nodes``, at any depth; the body of an
    ``if TYPE_CHECKING:`` only with ``typing_imports``."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not typing_imports:
            yield from _imports(node.orelse, typing_imports)
        else:
            yield from _imports(ast.iter_child_nodes(node), typing_imports)


def _targets(
    node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, tuple[Path, bool]]
) -> Iterator[str]:
    """The package's modules one import statement reaches."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name  # ``import a.b.c`` -> the longest prefix that is a module
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}"
        elif base in modules:
            yield base


def import_graph(root: Path, typing_imports: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (itself left out)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if is_package else name.rpartition(".")[0]
        graph[name] = {
            target
            for node in _imports([tree], typing_imports)
            for target in _targets(node, package, modules)
        } - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _said(found: list[tuple[str, ...]]) -> str:
    return "\n".join(" <-> ".join(c) for c in found)


def test_no_import_circle_outside_the_shrinking_allowlist() -> None:
    found = cycles(import_graph(PKG))
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert new == [], "import circles (move the shared piece down):\n" + _said(new)
    gone = KNOWN_CYCLES - set(found)
    assert not gone, "broken circles still on KNOWN_CYCLES (drop them):\n" + _said(sorted(gone))


def test_the_allowlist_never_holds_finish_and_live() -> None:
    finish, live = "batch_invariance.service.finish", "batch_invariance.service.live"
    assert not [c for c in KNOWN_CYCLES if finish in c and live in c]


def test_not_even_the_type_checker_sees_a_circle() -> None:
    # Annotations included: finish and live once imported each other this way.
    found = cycles(import_graph(PKG, typing_imports=True))
    assert found == [], "import circles under TYPE_CHECKING:\n" + _said(found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_the_check_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from pkg.high import g\n    return g\n",
        "high.py": "import pkg.low\n\ndef g():\n    return 0\n",
        "alone.py": "import os\nimport pkg.low\n",
    })  # fmt: skip
    assert cycles(import_graph(root)) == [("pkg.high", "pkg.low")]


def test_the_check_resolves_submodules_relative_imports_and_longer_circles(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "VALUE = 1\n",
        "sub/a.py": "from . import b\n",  # the submodule pkg.sub.b
        "sub/b.py": "from pkg import c\n",  # the submodule pkg.c
        "c.py": "from pkg.sub.a import x\n",  # a name in pkg.sub.a
        "d.py": "from pkg.sub import VALUE\n",  # a name in the package pkg.sub
    })  # fmt: skip
    graph = import_graph(root)
    assert graph["pkg.d"] == {"pkg.sub"}
    assert cycles(graph) == [("pkg.c", "pkg.sub.a", "pkg.sub.b")]


def test_a_type_checking_import_is_no_runtime_edge(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "finish.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                     "    from pkg.live import LiveCell\n",
        "live.py": "from pkg.finish import finish_cell\n",
        "other.py": "import typing\n\nif typing.TYPE_CHECKING:\n    pass\n"
                    "else:\n    import pkg.third\n",
        "third.py": "import pkg.other\n",
    })  # fmt: skip
    assert cycles(import_graph(root)) == [("pkg.other", "pkg.third")]
    assert cycles(import_graph(root, typing_imports=True)) == [
        ("pkg.finish", "pkg.live"),
        ("pkg.other", "pkg.third"),
    ]
