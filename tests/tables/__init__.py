"""Each family's test tables, one module per family (``tests/tables/<family>.py``), importing no torch.

``tests/test_ops.py`` (the driver) runs them on every backend against the oracle, and
``tests/test_ops_fbgemm.py`` runs their ``FBGEMM`` rows against fbgemm_gpu (torch). A family module
holds, with the strategies and constants they are built from:

- ``STRATEGIES``: op name -> Hypothesis strategy of keyword arguments (host NumPy arrays), or a
  function ``small -> strategy`` (smaller inputs for the CUDA simulator; the TBE bounds check's
  repair warning is compared with the oracle's, :func:`harness.check_matches_ref`);
- ``EDGES``: case -> (op, args), the spec's edge cases;
- ``BAD``: [(op, args, exception, words)], the error and the words its message names;
- ``WORKED``: [(op, args, want) or (op, args, want, tolerance)], the family page's worked examples
  (``WORKED_TOL`` the family's float tolerance; ``NOT_WORKED`` op -> why none);
- ``FBGEMM``: [:class:`harness.Peer`], fbgemm_gpu's peer of each op (a peer's ``call`` imports torch
  when it runs, never at import); ``NO_FBGEMM_PEER`` op -> why none.

Tests particular to a family live in ``tests/test_<family>.py`` (no torch) and
``tests/test_<family>_torch.py`` (the bridge, the modules, fbgemm's gradients).
"""

from __future__ import annotations

import importlib

from hypothesis.strategies import SearchStrategy

import embnum


def of(family: str):
    """The family's tables: the module ``tests/tables/<family>.py``."""
    return importlib.import_module(f"tables.{family}")


def families() -> list[str]:
    """Every registered op's family, sorted."""
    return sorted({o.family for o in embnum.ops()})


def strategy(name: str, small: bool = False) -> SearchStrategy:
    """The op's ``STRATEGIES`` entry (``small``: the CUDA simulator's smaller inputs, where the entry
    takes it)."""
    entry = of(embnum.get_op(name).family).STRATEGIES[name]
    return entry if isinstance(entry, SearchStrategy) else entry(small=small)


def peers() -> list:
    """Every family's ``FBGEMM`` rows (``harness.Peer``)."""
    return [p for f in families() for p in getattr(of(f), "FBGEMM", ())]
