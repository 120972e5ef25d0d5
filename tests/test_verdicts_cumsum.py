"""The compiled int32 prefix-sum verdict of the cumsum declarations (
``_validate_numba.int32_prefix_fits``) agrees with the exact rule on drawn inputs, valid and
overflowing, 1-D and 2-D, contiguous or not, and the ops' errors stay the same."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import _validate_numba

I32 = np.iinfo(np.int32)


def exact(a: np.ndarray, drop_last: bool) -> bool:
    """The rule: every running sum of a row (its last entry left out when ``drop_last``) in int32."""
    prefix = np.cumsum(np.atleast_2d(a).astype(object), axis=-1)  # Python ints: exact
    if drop_last:
        prefix = prefix[:, :-1]
    return prefix.size == 0 or (prefix.max() <= I32.max and prefix.min() >= I32.min)


# entries near the limits (sums that cross int32 after a few steps) and small ones (bound passes)
entries = st.one_of(
    st.integers(-4, 4),
    st.integers(I32.max // 3, I32.max),
    st.integers(I32.min, I32.min // 3),
    st.sampled_from([I32.max, I32.min, 0, 1, -1]),
)


@st.composite
def int32_rows(draw):
    rows = draw(st.integers(0, 4))
    n = draw(st.integers(0, 9))
    values = draw(st.lists(entries, min_size=rows * n, max_size=rows * n))
    a = np.array(values, dtype=np.int32).reshape(rows, n)
    if draw(st.booleans()):
        a = a[0] if rows else a.reshape(-1)  # 1-D
    if draw(st.booleans()) and a.ndim == 1:
        a = np.repeat(a, 2)[::2]  # not contiguous
    return a


@given(int32_rows(), st.booleans())
def test_verdict_equals_exact_rule(a, drop_last):
    assert _validate_numba.int32_prefix_fits(a, drop_last) == exact(a, drop_last)


@given(int32_rows())
def test_cumsum_errors_follow_the_rule(a):
    for fn, drop_last, ndims in (
        (embnum.complete_cumsum, False, (1, 2)),
        (embnum.exclusive_cumsum, True, (1,)),
        (embnum.inclusive_cumsum, False, (1,)),
    ):
        if a.ndim not in ndims:
            continue
        if exact(a, drop_last):
            fn(a)
        else:
            with pytest.raises(ValueError, match="prefix sum of lengths overflows int32; use int64 lengths"):
                fn(a)


def test_verdict_overflow_cases():
    """Sums that would wrap an int64 product of the bound (max * n) or cross int32 by one."""
    assert not _validate_numba.int32_prefix_fits(np.array([I32.max, 1], np.int32), False)
    assert _validate_numba.int32_prefix_fits(np.array([I32.max, 1], np.int32), True)
    assert _validate_numba.int32_prefix_fits(np.array([I32.max, -5, 5], np.int32), False)
    assert not _validate_numba.int32_prefix_fits(np.array([I32.min, -1], np.int32), False)
    assert _validate_numba.int32_prefix_fits(np.array([[I32.min], [I32.min]], np.int32), False)
    assert _validate_numba.int32_prefix_fits(np.zeros((3, 0), np.int32), False)
