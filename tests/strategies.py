"""Hypothesis building blocks shared by the family tests (host NumPy arrays)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

INDEX_DTYPES = (np.int32, np.int64)
FLOAT_DTYPES = (np.float16, np.float32, np.float64)
VALUE_DTYPES = FLOAT_DTYPES + INDEX_DTYPES

index_dtypes = st.sampled_from(INDEX_DTYPES)
value_dtypes = st.sampled_from(VALUE_DTYPES)
float_dtypes = st.sampled_from(FLOAT_DTYPES)


def elements(dtype, *, special=True, bound=100):
    """Values of ``dtype``: floats up to ``bound`` (with inf/NaN/-0.0 when
    ``special``), integers over the whole range."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        finite = st.floats(-bound, bound, width=8 * dtype.itemsize, allow_subnormal=dtype.itemsize > 2)
        if special:
            return st.one_of(finite, st.sampled_from([np.inf, -np.inf, np.nan, -0.0]))
        return finite
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max))


def value_arrays(dtype, shape, **kw):
    return hnp.arrays(np.dtype(dtype), shape, elements=elements(dtype, **kw))


@st.composite
def maybe_strided(draw, a: np.ndarray):
    """``a`` itself, or an equal non-contiguous view (every other row of a larger buffer)."""
    if a.ndim == 0 or not draw(st.booleans()):
        return a
    big = np.zeros((2 * a.shape[0],) + a.shape[1:], dtype=a.dtype)
    big[::2] = a
    view = big[::2]
    assert not view.flags.c_contiguous or a.shape[0] <= 1 or a.size == 0
    return view


@st.composite
def lengths(draw, n, *, max_len=4):
    """``n`` non-negative lengths; sometimes all zero."""
    if draw(st.integers(0, 5)) == 0:
        return np.zeros(n, dtype=np.int64)
    return np.array(draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n)), dtype=np.int64)


@st.composite
def jagged_offsets(draw, J, *, B=None, max_len=4, max_B=5):
    """A chain of ``J`` offsets arrays (each int32 or int64, first entry possibly > 0).

    Returns ``(offsets, rows_needed)`` where ``rows_needed = offsets[-1][-1]``.
    """
    n = draw(st.integers(0, max_B)) if B is None else B
    offsets = []
    for _ in range(J):
        lead = draw(st.sampled_from([0, 0, 0, 1, 2]))
        offs = lead + np.concatenate([[0], np.cumsum(draw(lengths(n, max_len=max_len)))])
        offsets.append(offs.astype(draw(index_dtypes)))
        n = int(offs[-1])
    return offsets, n
