"""The output check's one-loop common case, in ``out_spec`` and through a public call, gives what
its exact rule (``_out_shape``) gives: the same normalised shape and dtype, or the same ValueError,
on drawn shapes of Python ints, NumPy ints, bools, zeros, negatives and sizes around the limit;
and the public function keeps its signature, docstring and identity across calls."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import _backend, _registry
from embnum._registry import out_spec

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
        got_shape, got_dtype = out_spec(shape, dtype)
        assert all(type(d) is int for d in got_shape) and type(got_shape) is tuple
        return got_shape, got_dtype

    assert outcome(fast) == outcome(exact)


@given(st.lists(dims, max_size=4), dtypes, st.booleans())
def test_public_call_checks_outputs_as_exact_rule(shape, dtype, as_list):
    """A public call of an op whose declaration returns the drawn output spec allocates
    exactly when the exact rule accepts, with the exact rule's shape and dtype, and raises
    its ValueError otherwise."""
    shape = list(shape) if as_list else tuple(shape)
    want_dtype = np.dtype(dtype)
    fn = _spec_probe()
    fn.op.spec = (shape, dtype)

    def exact():
        return _registry._out_shape(shape, want_dtype), want_dtype

    def fast():
        try:
            got = fn(np.zeros(1, np.int8))
        except MemoryError:  # within the limit but more than this machine holds: accepted
            return exact()
        return got.shape, got.dtype

    assert outcome(fast) == outcome(exact)


def _spec_probe():
    """A throwaway op (not registered) whose declaration returns ``op.spec`` and whose cpu
    kernel writes nothing: the public call's allocation, through ``out_spec``."""
    global _PROBE
    if _PROBE is None:

        def spec_probe(x):
            return {"x": x}, op.spec

        op = _registry.Op(spec_probe, "jagged", differentiable=(), returns="array", same_as=None)

        def kernel(x, out):
            return None

        embnum.complete_cumsum(np.zeros(1, np.int32))  # loads the cpu backend
        op._kernels[_backend.BACKENDS["cpu"]] = (kernel, np.empty)
        _PROBE = op
    return _PROBE


_PROBE = None


def test_out_spec_rejects_before_allocation():
    with pytest.raises(ValueError, match=r"negative or above the size limit 2\*\*48"):
        out_spec((LIMIT // 4 + 1,), np.int32)
    with pytest.raises(ValueError, match=r"negative or above the size limit 2\*\*48"):
        out_spec((0, LIMIT + 1), np.uint8)  # a zero dimension does not hide a size above the limit
    assert out_spec((LIMIT // 4,), np.int32)[0] == (LIMIT // 4,)


def test_public_function_keeps_signature():
    x = np.arange(4, dtype=np.int32)
    fn = embnum.complete_cumsum
    before = (inspect.signature(fn), fn.__doc__, fn.__name__)
    fn(x)  # loads the cpu kernel
    assert embnum.complete_cumsum is fn
    assert (inspect.signature(fn), fn.__doc__, fn.__name__) == before
    np.testing.assert_array_equal(fn(x), [0, 0, 1, 3, 6])
