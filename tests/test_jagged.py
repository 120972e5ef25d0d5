"""The jagged family beyond its tables (tests/tables/jagged.py, run by tests/test_ops.py): the compiled
``min_max`` against NumPy, ``out=`` checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from strategies import (
    index_dtypes,
    maybe_strided,
)
from tables.jagged import offsets_array


@settings(max_examples=30)
@given(data=st.data(), dtype=index_dtypes, shape=st.sampled_from([(1,), (7,), (40,), (3, 5), (2, 1, 6)]))
def test_compiled_min_max_is_numpys(data, dtype, shape):
    """The one-pass compiled ``min_max`` (the int32 cumsum overflow proof and kjt's index checks
    rest on it) agrees with NumPy at the dtype's extremes, on n-d and strided arrays."""
    info = np.iinfo(dtype)
    elem = st.integers(int(info.min), int(info.max))
    a = np.array(data.draw(st.lists(elem, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))), dtype)
    a = data.draw(maybe_strided(a.reshape(shape)))
    assert embnum._validate.min_max(a) == (int(a.min()), int(a.max()))


def test_bad_out():
    x = np.arange(1, 7.0)
    args = dict(batch_size=2, csr_seg=offsets_array(0, 1, 1, 3), values=x)
    with pytest.raises(ValueError, match="out must have shape"):
        embnum.segment_sum_csr(**args, out=np.empty(4))
    with pytest.raises(TypeError, match="out must have dtype float64"):
        embnum.segment_sum_csr(**args, out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="shares memory with the input 'values'"):
        embnum.segment_sum_csr(**args, out=x[:3])
    with pytest.raises(ValueError, match="C-contiguous"):
        embnum.segment_sum_csr(**args, out=np.empty(6)[::2])
