"""Test modules stand alone: no ``tests/**/test_*.py`` imports another test module (what two share
lives in a helper module: ``harness``, ``strategies``, ``tables``, ...), so each file runs, skips
and is read by itself."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def _imported(tree: ast.AST):
    """Every module name ``tree`` imports: import statements, ``importlib.import_module`` and
    ``__import__`` with a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                yield "." * node.level + (node.module or "")
            elif node.module:
                yield node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.args[0].value


def test_no_test_module_imports_another():
    found = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        names = [n for n in _imported(ast.parse(path.read_text())) if _is_test_module(n) or n.startswith(".")]
        if names:
            found[str(path.relative_to(TESTS))] = names
    assert not found, f"test modules importing test modules (move what they share to a helper module): {found}"


def test_the_check_sees_each_kind_of_import():
    tree = ast.parse(
        "import test_a\nfrom test_b import x\nfrom tests.test_c import y\n"
        "importlib.import_module('test_d')\n__import__('test_e')\nimport harness\n"
    )
    assert [n for n in _imported(tree) if _is_test_module(n)] == [
        "test_a",
        "test_b",
        "tests.test_c",
        "test_d",
        "test_e",
    ]
