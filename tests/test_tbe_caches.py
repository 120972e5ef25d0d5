"""The TBE declarations' per-layout caches: a validated layout is cached by its arrays' dtypes,
shapes and bytes, so a hit must never skip an array check (same bytes, another dtype or shape)
and a layout changed in place after validation is checked again (training and quantized)."""

import numpy as np
import pytest

import embnum
from embnum.ops import tbe as ops_tbe


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
    """Arrays with the same bytes as a cached layout's but another byte order, signedness or shape
    still fail the array checks with their usual errors."""
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


def test_layout_cache_is_not_stale():
    """A layout validated once and then changed in place is checked again."""
    lay = embnum.tbe_layout([3, 2], [2, 3])
    woff, doff, hcs = (a.copy() for a in lay.arrays())
    w = np.zeros(lay.num_weights, np.float32)
    idx, offs = np.array([0, 1]), np.array([0, 1, 2])
    embnum.tbe_forward(w, woff, doff, hcs, idx, offs)
    woff[1] = lay.num_weights  # the second table no longer fits
    with pytest.raises(ValueError, match="does not fit"):
        embnum.tbe_forward(w, woff, doff, hcs, idx, offs)
    woff[:] = lay.arrays()[0]
    out = embnum.tbe_forward(w, woff, doff, hcs, idx, offs)
    assert out.shape == (1, 5)


def test_quantized_layout_cache_is_not_stale_nor_fooled_by_equal_values():
    table = np.arange(8, dtype=np.float32).reshape(2, 4)
    weights, woff = embnum.tbe_pack_quantized([table], ["fp16"])
    doff, rows = np.array([0, 4]), np.array([2])
    idx, offs = np.array([0, 1]), np.array([0, 2])
    embnum.tbe_forward_quantized(weights, woff, ["fp16"], doff, rows, idx, offs)
    embnum.tbe_forward_quantized(weights, woff, [1], doff, rows, idx, offs)  # fp16's code
    with pytest.raises(TypeError, match=r"weights_tys\[0\]"):
        embnum.tbe_forward_quantized(weights, woff, [1.0], doff, rows, idx, offs)
    with pytest.raises(TypeError, match=r"weights_tys\[0\]"):
        embnum.tbe_forward_quantized(weights, woff, [True], doff, rows, idx, offs)
    with pytest.raises(TypeError, match="row_alignment"):
        embnum.tbe_forward_quantized(weights, woff, ["fp16"], doff, rows, idx, offs, row_alignment=1.0)
    rows[0] = 3  # the table no longer fits the weights
    with pytest.raises(ValueError, match="does not fit"):
        embnum.tbe_forward_quantized(weights, woff, ["fp16"], doff, rows, idx, offs)
