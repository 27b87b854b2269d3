"""The project's size caps, kept by a test that breaks: no module over 400 lines, no function
over 80, and no function in ``core/`` over 60 (a function's size is its AST node's ``lineno``
to ``end_lineno``, decorators left out, nested functions counted on their own too)."""

from __future__ import annotations

import ast
from pathlib import Path

import batch_invariance

PKG = Path(batch_invariance.__file__).parent

MODULE_CAP = 400
FUNCTION_CAP = 80
#: The tighter cap for the pure core, where a long function hides a rule.
CORE_FUNCTION_CAP = 60
CORE = "core"


def _function_cap(relative: Path) -> int:
    return CORE_FUNCTION_CAP if relative.parts[0] == CORE else FUNCTION_CAP


def oversized(root: Path) -> list[str]:
    """Every module under ``root`` over :data:`MODULE_CAP` lines and every function over its
    cap, one line each (``path: N lines > cap`` or ``path:name: N lines > cap``)."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MODULE_CAP:
            found.append(f"{relative.as_posix()}: {lines} lines > {MODULE_CAP}")
        cap = _function_cap(relative)
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            size = node.end_lineno - node.lineno + 1
            if size > cap:
                found.append(f"{relative.as_posix()}:{node.name}: {size} lines > {cap}")
    return found


def test_no_module_or_function_is_over_its_cap() -> None:
    found = oversized(PKG)
    assert found == [], "over the size caps (split by job):\n" + "\n".join(found)


def _function(name: str, body_lines: int) -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines - 2))
    return f"def {name}() -> int:\n{body}    return 0\n"


def test_the_check_names_each_oversized_module_and_function(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "ok.py").write_text(_function("fits", FUNCTION_CAP), encoding="utf-8")
    (tmp_path / "long_function.py").write_text(
        _function("too_long", FUNCTION_CAP + 1), encoding="utf-8"
    )
    # 61 lines is fine outside core/ and too long inside it.
    (tmp_path / "core" / "rule.py").write_text(
        _function("core_rule", CORE_FUNCTION_CAP + 1), encoding="utf-8"
    )
    (tmp_path / "core" / "fits.py").write_text(
        _function("core_fits", CORE_FUNCTION_CAP), encoding="utf-8"
    )
    (tmp_path / "big.py").write_text("x = 0\n" * (MODULE_CAP + 1), encoding="utf-8")
    (tmp_path / "at_cap.py").write_text("x = 0\n" * MODULE_CAP, encoding="utf-8")
    assert oversized(tmp_path) == [
        f"big.py: {MODULE_CAP + 1} lines > {MODULE_CAP}",
        f"core/rule.py:core_rule: {CORE_FUNCTION_CAP + 1} lines > {CORE_FUNCTION_CAP}",
        f"long_function.py:too_long: {FUNCTION_CAP + 1} lines > {FUNCTION_CAP}",
    ]


def test_a_method_is_measured_too(tmp_path: Path) -> None:
    method = "".join(f"    {line}\n" for line in _function("method", FUNCTION_CAP + 1).splitlines())
    (tmp_path / "cls.py").write_text(f"class C:\n{method}", encoding="utf-8")
    assert oversized(tmp_path) == [f"cls.py:method: {FUNCTION_CAP + 1} lines > {FUNCTION_CAP}"]
