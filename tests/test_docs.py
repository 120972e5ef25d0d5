"""The documentation's code runs as written: the README's and the docs pages' python blocks,
and the example in every op's docstring (the API reference shows them). No page or docstring
sends users to a specification folder they do not have."""

import ast
import doctest
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

import embnum

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "generated" not in p.parts and "_build" not in p.parts]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced ```python block of a Markdown file."""
    text = path.read_text()
    return [
        (text[: m.start()].count("\n") + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S)
    ]


def _gpu() -> bool:
    from embnum._backend import gpu_present

    return importlib.util.find_spec("cupy") is not None and gpu_present()


def _needs_gpu(code: str) -> bool:
    return bool(re.search(r"^import cupy|^from cupy|\bcupy as cp\b", code, re.M))


def _needs_torch(code: str) -> bool:
    return bool(re.search(r"^import torch|^from embnum import torch_bridge|embnum.torch_bridge", code, re.M))


WITH_CODE = [p for p in PAGES if python_blocks(p)]


@pytest.mark.parametrize("path", WITH_CODE, ids=[str(p.relative_to(ROOT)) for p in WITH_CODE])
def test_markdown_python_blocks_run_as_written(path, tmp_path, monkeypatch):
    """Every ```python block of the page, in order, in one namespace (as a reader runs them in
    one session), from a scratch directory; CuPy blocks only where CuPy has a GPU."""
    blocks = python_blocks(path)
    if any(_needs_torch(code) for _, code in blocks):
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for line, code in blocks:
        if _needs_gpu(code) and not _gpu():
            continue  # a CuPy example: needs CuPy and a GPU
        exec(compile(code, f"{path.name}:{line}", "exec"), namespace)


def test_the_readme_has_runnable_examples():
    assert len(python_blocks(ROOT / "README.md")) >= 3


OPS = embnum.ops()


@pytest.mark.parametrize("name", [op.name for op in OPS])
def test_op_docstring_has_an_example_that_runs(name):
    op = embnum.get_op(name)
    doc = op.public.__doc__ or ""
    test = doctest.DocTestParser().get_doctest(doc, {"np": np, "embnum": embnum}, f"embnum.{name}", None, 0)
    assert test.examples, f"embnum.{name}'s docstring has no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of embnum.{name} failed (output above)"


def _user_docstrings():
    """Per module of the package: its docstrings and other string literals (messages), joined."""
    for path in sorted((ROOT / "src" / "embnum").rglob("*.py")):
        tree = ast.parse(path.read_text())
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        yield path.relative_to(ROOT), "\n".join(strings)


def test_no_user_text_points_to_the_specification_folder():
    """Users have no ``shared/spec`` folder: README, docs pages, notebooks and the package's
    docstrings and messages must not send them there."""
    pattern = re.compile(r"shared/spec|spec/\w+\.md|\bthe spec\b|\bspec section|\(spec\b", re.I)
    found = []
    texts = [(p.relative_to(ROOT), p.read_text()) for p in PAGES]
    texts += [(p.relative_to(ROOT), p.read_text()) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    texts += list(_user_docstrings())
    for where, text in texts:
        for m in pattern.finditer(text):
            found.append(f"{where}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}")
    assert not found, "\n".join(found)


def test_code_and_tests_cite_no_work_item():
    """Decisions live in docs/: source, tests and benchmark programs name no issue, work item or
    section of a specification the repository does not have."""
    pattern = re.compile(
        r"\bissues? \d|\bissue-\d|\bk1\d[a-z]\b|\bsections? \d|shared/spec/|^# -- \d+\.\d", re.I | re.M
    )
    here = Path(__file__).resolve()
    found = []
    for folder in ("src", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() == here:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_a_docs_build_without_torch_is_told_what_the_reference_leaves_out(monkeypatch):
    """The docs extension warns (an error under Sphinx's -W, as in CI) when torch, which half
    of the API reference documents, cannot be imported, instead of building without it."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "docs" / "_ext"))
    import embnum_docs

    if importlib.util.find_spec("torch") is not None:
        assert embnum_docs.missing_dependencies() == []
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    [warning] = embnum_docs.missing_dependencies()
    assert warning.startswith("torch is not importable") and "embnum.torch_bridge" in warning
