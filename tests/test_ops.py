"""The test driver: every registered op, on every fast backend, from each family's tables.

Each family's tables are in ``tests/tables/<family>.py`` (no torch; what each table holds: its
package docstring); this module parametrizes over them, ``embnum.ops()`` and the backend flavors
(``conftest.fast_backend``): ``STRATEGIES`` drawn inputs, ``EDGES``, ``WORKED`` examples and ``BAD``
input, every backend against the oracle (:func:`harness.matches_ref`, :func:`harness.check_rejects`).
``tests/test_ops_fbgemm.py`` runs the ``FBGEMM`` rows (torch and fbgemm_gpu).

The checks below fail until a new op has a strategy, a bad-input row, a worked example (or a
reason) and an fbgemm peer (or a reason). Nothing here imports torch: without it, every NumPy,
cpu and simulated-cuda row still runs (``tests/test_ops_without_torch.py`` counts them).
"""

from __future__ import annotations

import pytest

import embnum
from embnum._registry import backends
from harness import FLAVORS, check_matches_ref, check_rejects, check_worked, matches_ref
from tables import families, peers, strategy
from tables import of as table

OPS = embnum.ops()


def test_every_op_has_a_strategy():
    missing = [o.name for o in OPS if o.name not in getattr(table(o.family), "STRATEGIES", {})]
    assert not missing, f"ops without a strategy in tests/tables/<family>.py STRATEGIES: {missing}"
    stale = [n for f in {o.family for o in OPS} for n in table(f).STRATEGIES if n not in {o.name for o in OPS}]
    assert not stale, f"strategies for ops that are not registered: {stale}"


def test_driver_covers_every_backend():
    """The flavors reach every fast backend (ref is the oracle each is compared with)."""
    assert {f.backend for f in FLAVORS} | {"ref"} == set(backends())


def _rows(kind: str):
    """Every family's ``EDGES`` (case -> (op, args)) or ``BAD`` ([(op, args, exc, words)]) rows."""
    rows = []
    for family in families():
        t = table(family)
        if kind == "EDGES" and isinstance(getattr(t, "EDGES", None), dict):
            rows += [pytest.param(*t.EDGES[case], id=f"{family}-{case}") for case in sorted(t.EDGES)]
        if kind == "BAD":
            rows += [pytest.param(*b, id=f"{b[0]}-{i}") for i, b in enumerate(getattr(t, "BAD", ()))]
    return rows


@pytest.mark.parametrize("name,args", _rows("EDGES"))
def test_edges(name, args, fast_backend):
    """The spec's edge cases of each family (its ``EDGES`` table), every backend against the oracle."""
    check_matches_ref(name, args, fast_backend)


def _worked():
    """Every family's ``WORKED`` rows: (op, args, want) or (op, args, want, tolerance); a family's
    ``WORKED_TOL`` is the default tolerance of its float results (exact without it)."""
    rows = []
    for family in families():
        t = table(family)
        for i, row in enumerate(getattr(t, "WORKED", ())):
            name, args, want = row[:3]
            tol = row[3] if len(row) > 3 else getattr(t, "WORKED_TOL", None)
            rows.append(pytest.param(name, args, want, tol, id=f"{name}-{i}"))
    return rows


@pytest.mark.parametrize("name,args,want,tol", _worked())
def test_worked_examples(name, args, want, tol, fast_backend):
    """The spec's worked examples (each family's ``WORKED`` table): the oracle gives the
    example's numbers and every backend the oracle's."""
    check_worked(check_matches_ref(name, args, fast_backend), want, tol, name)


def test_every_family_has_worked_examples():
    """Every family gives worked examples, and every op of a family with a table is reached by
    one, or is named in the family's ``NOT_WORKED`` (op -> why)."""
    for family in families():
        t = table(family)
        assert getattr(t, "WORKED", None), f"tests/tables/{family}.py has no WORKED table"
        reached = {row[0] for row in t.WORKED} | set(getattr(t, "NOT_WORKED", {}))
        missing = [o.name for o in OPS if o.family == family and o.name not in reached]
        assert not missing, f"ops of {family} without a worked example (nor a NOT_WORKED reason): {missing}"


def test_every_op_has_bad_input_rows():
    """Every op is in its family's ``BAD`` table (so every backend's rejections are checked)."""
    rows = {r.values[0] for r in _rows("BAD")}
    missing = [o.name for o in OPS if o.name not in rows]
    assert not missing, f"ops without a row in their family's BAD table: {missing}"


@pytest.mark.parametrize("name,args,exc,words", _rows("BAD"))
def test_bad_input(name, args, exc, words, fast_backend):
    """Each family's ``BAD`` table: the error type and the words its message must name, every backend."""
    check_rejects(name, args, exc, words, fast_backend)


@pytest.mark.parametrize("name", [o.name for o in OPS])
def test_matches_ref(name, fast_backend):
    matches_ref(name, strategy(name, small=fast_backend.backend == "cuda"), fast_backend)


def test_fbgemm_table_names_every_op():
    """Each op has an fbgemm peer in its family's ``FBGEMM`` table or is listed in its
    ``NO_FBGEMM_PEER`` (op -> why), never both."""
    compared = {p.op for p in peers()}
    without = {n: why for f in families() for n, why in getattr(table(f), "NO_FBGEMM_PEER", {}).items()}
    assert not compared & set(without), f"ops both compared and listed as without a peer: {compared & set(without)}"
    missing = [o.name for o in OPS if o.name not in compared and o.name not in without]
    assert not missing, f"ops neither in a FBGEMM table nor in NO_FBGEMM_PEER: {missing}"
    stale = [n for n in compared | set(without) if n not in {o.name for o in OPS}]
    assert not stale, f"fbgemm rows for ops that are not registered: {stale}"
