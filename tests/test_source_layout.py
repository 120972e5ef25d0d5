"""The package's source stays readable: no function longer than a reader can hold at once."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "embnum"
MAX_LINES = 80

# (module, function) pairs allowed over the limit, each with its reason; remove an entry once its
# function is split.
ALLOWED: set[tuple[str, str]] = set()


def function_lengths(path):
    """``(name, lines)`` of every function and method in ``path``, nested ones included; a
    function's lines run from its first decorator to its last line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            yield node.name, node.end_lineno - first + 1


def test_function_lengths_are_measured_from_the_first_decorator(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("@a\n@b\ndef f():\n    def g():\n        pass\n    return g\n")
    assert dict(function_lengths(src)) == {"f": 6, "g": 2}


def test_no_function_in_the_package_is_over_80_lines():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for name, lines in function_lengths(path):
            if lines > MAX_LINES and (module, name) not in ALLOWED:
                over.append(f"{module}:{name}:{lines}")
    assert not over, f"functions over {MAX_LINES} lines (split them where a reader gains):\n" + "\n".join(over)
