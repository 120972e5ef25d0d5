"""The generated test driver: every registered op, on every fast backend, against the oracle.

Each family's test module (``tests/test_<family>.py``) gives its table, ``STRATEGIES``
(op name -> Hypothesis strategy of keyword arguments, host NumPy arrays, or a function
``small -> strategy`` giving smaller inputs for the CUDA simulator) and, where its
ops warn by design, ``EXPECTED_WARNINGS``; this module parametrizes over ``embnum.ops()``
and the backend flavors (``conftest.fast_backend``) and runs :func:`harness.matches_ref`
on each. A family file keeps only what is particular to it (edges, bad inputs, worked
examples, fbgemm comparisons); the families' ``EDGES`` (case -> (op, args)) and ``BAD``
((op, args, exception, words)) tables run here too. Adding an op: its declaration, kernels, bridge line and a
strategy in its family's table; the checks below fail until the strategy is there.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
from hypothesis.strategies import SearchStrategy

import embnum
from embnum._registry import backends
from harness import FLAVORS, check_matches_ref, check_rejects, matches_ref

OPS = embnum.ops()


def table(family: str):
    """The family's test module (its tables), imported as pytest imports it."""
    return importlib.import_module(f"test_{family}")


def test_every_op_has_a_strategy():
    missing = [o.name for o in OPS if o.name not in getattr(table(o.family), "STRATEGIES", {})]
    assert not missing, f"ops without a strategy in tests/test_<family>.py STRATEGIES: {missing}"
    stale = [n for f in {o.family for o in OPS} for n in table(f).STRATEGIES if n not in {o.name for o in OPS}]
    assert not stale, f"strategies for ops that are not registered: {stale}"


def test_driver_covers_every_backend():
    """The flavors reach every fast backend (ref is the oracle each is compared with)."""
    assert {f.backend for f in FLAVORS} | {"ref"} == set(backends())


def _rows(kind: str):
    """Every family's ``EDGES`` (case -> (op, args)) or ``BAD`` ([(op, args, exc, words)]) rows."""
    rows = []
    for family in sorted({o.family for o in OPS}):
        t = table(family)
        if kind == "EDGES" and isinstance(getattr(t, "EDGES", None), dict):
            rows += [pytest.param(*t.EDGES[case], id=f"{family}-{case}") for case in sorted(t.EDGES)]
        bad = getattr(t, "BAD", None)
        if kind == "BAD" and isinstance(bad, list) and all(len(b) == 4 and isinstance(b[0], str) for b in bad):
            rows += [pytest.param(*b, id=f"{b[0]}-{i}") for i, b in enumerate(bad)]
    return rows


@pytest.mark.parametrize("name,args", _rows("EDGES"))
def test_edges(name, args, fast_backend):
    """The spec's edge cases of each family (its ``EDGES`` table), every backend against the oracle."""
    check_matches_ref(name, args, fast_backend)


@pytest.mark.parametrize("name,args,exc,words", _rows("BAD"))
def test_bad_input(name, args, exc, words, fast_backend):
    """Each family's ``BAD`` table: the error type and the words its message must name, every backend."""
    check_rejects(name, args, exc, words, fast_backend)


@pytest.mark.parametrize("name", [o.name for o in OPS])
def test_matches_ref(name, fast_backend):
    op = embnum.get_op(name)
    t = table(op.family)
    with warnings.catch_warnings():
        for category in getattr(t, "EXPECTED_WARNINGS", ()):
            warnings.simplefilter("ignore", category)
        strategy = t.STRATEGIES[name]
        if not isinstance(strategy, SearchStrategy):
            strategy = strategy(small=fast_backend.backend == "cuda")
        matches_ref(name, strategy, fast_backend)
