"""``Out``'s one-loop common case (issue 12 item 1) gives what its exact rule (``_out_shape``)
gives: the same normalised shape and dtype, or the same ValueError, on drawn shapes of Python
ints, NumPy ints, bools, zeros, negatives and sizes around the limit; and the rewritten public
function keeps its signature, defaults and identity."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import _registry
from embnum._registry import Out

LIMIT = embnum.MAX_SIZE
dims = st.one_of(
    st.integers(0, 5),
    st.integers(-3, -1),
    st.sampled_from([LIMIT, LIMIT // 4, LIMIT // 4 + 1, 2**24, 2**40]),
    st.integers(0, 5).map(np.int64),
    st.booleans(),
)
dtypes = st.sampled_from([np.dtype(np.int32), np.dtype(np.float16), np.dtype(np.uint8), np.float64, "int64"])


def outcome(fn):
    try:
        return fn()
    except ValueError as e:
        return ("ValueError", str(e))


@given(st.lists(dims, max_size=4), dtypes, st.booleans())
def test_out_equals_exact_rule(shape, dtype, as_list):
    shape = list(shape) if as_list else tuple(shape)
    want_dtype = np.dtype(dtype)

    def exact():
        return _registry._out_shape(shape, want_dtype), want_dtype

    def fast():
        o = Out(shape, dtype)
        assert all(type(d) is int for d in o.shape) and type(o.shape) is tuple
        return o.shape, o.dtype

    assert outcome(fast) == outcome(exact)


def test_out_rejects_before_allocation():
    with pytest.raises(ValueError, match=r"negative or above the size limit 2\*\*48"):
        Out((LIMIT // 4 + 1,), np.int32)
    with pytest.raises(ValueError, match=r"negative or above the size limit 2\*\*48"):
        Out((0, LIMIT + 1), np.uint8)  # a zero dimension does not hide a size above the limit
    assert Out((LIMIT // 4,), np.int32).shape == (LIMIT // 4,)


def test_rewritten_public_function_keeps_signature():
    x = np.arange(4, dtype=np.int32)
    fn = embnum.complete_cumsum
    before = (inspect.signature(fn), fn.__defaults__, fn.__kwdefaults__, fn.__doc__)
    fn(x)  # loads the cpu kernel: the function's code is rewritten once
    assert embnum.complete_cumsum is fn
    assert (inspect.signature(fn), fn.__defaults__, fn.__kwdefaults__, fn.__doc__) == before
    np.testing.assert_array_equal(fn(x), [0, 0, 1, 3, 6])
