"""No import circle among embnum's modules (``docs/contributing.md``, "Layers").

import-linter's layer contracts (``lint-imports``) forbid imports between packages in the wrong
direction; they do not see a circle inside one package, or between a package and its own
modules. This reads every import statement in ``src/embnum`` with grimp (the graph import-linter
builds), imports inside functions included, and fails on any circle, naming each import in it.
Imports through ``importlib`` are not statements and are not in the graph.
"""

import grimp
import pytest


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each circle of ``graph`` once, as the modules along it (the first repeated at the end):
    an import ``a -> b`` closes one when ``b`` reaches ``a`` back."""
    found, seen = [], set()
    for a in sorted(graph.modules):
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            back = graph.find_shortest_chain(importer=b, imported=a)
            if back is None:
                continue
            loop = [a, *back]
            if frozenset(loop) not in seen:
                seen.add(frozenset(loop))
                found.append(loop)
    return found


def describe(graph: grimp.ImportGraph, loop: list[str]) -> str:
    lines = [" -> ".join(loop)]
    for a, b in zip(loop, loop[1:]):
        for d in graph.get_import_details(importer=a, imported=b):
            lines.append(f"    {a}:{d['line_number']}  {d['line_contents']}")
    return "\n".join(lines)


def test_circles_are_found_and_named():
    graph = grimp.ImportGraph()
    graph.add_import(importer="p.a", imported="p.b", line_number=3, line_contents="from . import b")
    graph.add_import(importer="p.b", imported="p.c", line_number=5, line_contents="from .c import f")
    graph.add_import(importer="p.c", imported="p.a", line_number=9, line_contents="from .a import g")
    graph.add_import(importer="p.c", imported="p.d", line_number=1, line_contents="from . import d")
    found = circles(graph)
    assert [sorted(loop[:-1]) for loop in found] == [["p.a", "p.b", "p.c"]]
    assert "p.c:9  from .a import g" in describe(graph, found[0])
    graph.remove_import(importer="p.c", imported="p.a")
    assert circles(graph) == []


@pytest.fixture(scope="module")
def embnum_graph():
    return grimp.build_graph("embnum", cache_dir=None)


def test_the_package_has_no_import_circle(embnum_graph):
    assert "embnum.containers.keyed_jagged_tensor" in embnum_graph.modules  # the package was read
    found = circles(embnum_graph)
    assert not found, "import circles:\n" + "\n".join(describe(embnum_graph, loop) for loop in found)
