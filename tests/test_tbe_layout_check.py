"""The TBE layout check's compiled pass (``_validate_numba.tbe_layout_rows``) gives the
same verdict as the exact Python rules of ``embnum.ops.tbe.layout`` on drawn layouts, valid and
broken (shifted offsets, shared tables, overlaps, huge entries near int64's ends): the same
result arrays when valid, the same error message when not."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import _validate
from embnum.ops import tbe as ops_tbe

pytest.importorskip("numba")

BIG = 2**63 - 1
ENTRY = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([-(2**63), -1, 2**31 - 1, 2**31, 2**62, BIG - 1, BIG]),
)


@st.composite
def layouts(draw):
    """A valid layout from ``tbe_layout`` (1-4 tables, adjacent features may share one), then
    maybe broken: one entry of one array replaced by a drawn value, weights shortened or
    lengthened, in int32 or int64."""
    n = draw(st.integers(1, 4))
    rows = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    dims = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    ftm = sorted(draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=3)) + list(range(n)))
    lay = embnum.tbe_layout(rows, dims, ftm)
    arrays = [a.copy() for a in lay.arrays()]
    W = lay.num_weights + draw(st.integers(-3, 3))
    if draw(st.booleans()):
        k = draw(st.integers(0, 2))
        i = draw(st.integers(0, arrays[k].shape[0] - 1))
        arrays[k][i] = draw(ENTRY)
    if draw(st.booleans()) and all(np.abs(a).max() < 2**31 for a in arrays):
        arrays = [a.astype(np.int32) for a in arrays]
    return np.zeros(max(W, 0), np.float32), arrays


def _outcome(weights, arrays):
    try:
        return [a.tolist() for a in ops_tbe.layout(weights, *arrays)]
    except ValueError as e:
        return str(e)


@given(layouts())
def test_compiled_layout_check_matches_the_exact_rules(case):
    weights, arrays = case
    fast = _outcome(weights, arrays)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_validate, "compiled", lambda: None)
        exact = _outcome(weights, arrays)
    assert fast == exact


@pytest.mark.parametrize(
    "change",
    [
        (lambda a: a.view(a.dtype.newbyteorder()), TypeError),  # same bytes, '>i8': not an index dtype
        (lambda a: a.view(np.uint64), TypeError),  # same bytes, unsigned
        (lambda a: a.reshape(-1, 1), ValueError),  # same bytes, 2-D
    ],
)
@pytest.mark.parametrize("k", [0, 1, 2])
def test_cached_layout_never_skips_the_array_checks(change, k):
    """A validated layout is cached by the three arrays' dtypes, shapes and bytes: arrays with the
    same bytes but another byte order, signedness or shape still fail the array checks with their
    usual errors (a cache hit skips those checks, so the key must tell them apart)."""
    alter, error = change
    lay = embnum.tbe_layout([3, 2], [2, 3])
    weights = np.zeros(lay.num_weights, np.float32)
    arrays = [np.asarray(a, np.int64).copy() for a in lay.arrays()]
    ops_tbe.layout(weights, *arrays)  # validated and cached
    bad = alter(arrays[k])
    assert bad.tobytes() == arrays[k].tobytes()
    arrays[k] = bad
    with pytest.raises(error, match=("weights_offsets", "D_offsets", "hash_size_cumsum")[k]):
        ops_tbe.layout(weights, *arrays)
