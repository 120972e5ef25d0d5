"""The torch bridge's argument checks: the one-pass recognition of plain lists
(``PLAIN_LISTS``: ints, strs, tensors, lists of those) gives what the exact rules give, the same
value or the same error, on drawn values that include bools, NumPy scalars, ints at and past the
int64 range, str subclasses, tensor subclasses, tuples and ragged nesting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
_values = pytest.importorskip("embnum.torch_bridge._values")


class _Str(str):
    pass


class _Sub(torch.Tensor):
    pass


_T = torch.zeros(1)
_SUB = _T.as_subclass(_Sub)
item = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([-(2**63), 2**63 - 1, 2**63, -(2**63) - 1, 2**70]),
    st.booleans(),
    st.integers(-3, 3).map(np.int64),
    st.just(np.True_),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=2),
    st.text(max_size=2).map(_Str),
    st.sampled_from([_T, _SUB, None]),
)
flat = st.one_of(st.lists(item, max_size=4), st.lists(item, max_size=4).map(tuple))
value = st.one_of(item, flat, st.lists(st.one_of(flat, item), max_size=3), st.lists(flat, max_size=3).map(tuple))


def outcome(fn):
    try:
        got = fn()
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)
    return "ok", _plain(got)


def _plain(x):
    """A comparable form: lists as lists of (type, value or identity)."""
    if isinstance(x, list):
        return ["list", [_plain(v) for v in x]]
    if isinstance(x, torch.Tensor):
        return ("tensor", id(x))
    return (type(x).__name__, x)


@settings(max_examples=300)  # no kernels: microseconds an example
@given(st.sampled_from(sorted(_values.PLAIN_LISTS)), value)
def test_plain_list_checks_match_the_exact_rules(kind, x):
    got = outcome(lambda: _values.check_value("arg", kind, x))
    want = outcome(lambda: _values.check_exact("arg", kind, x))
    assert got == want


def test_plain_list_checks_return_new_lists():
    ints = (1, 2, 3)
    assert _values.check_value("arg", "int[]", ints) == [1, 2, 3]
    nested = [["a"], ["b", "c"]]
    got = _values.check_value("arg", "str[][]", nested)
    assert got == nested and got is not nested and got[0] is not nested[0]
