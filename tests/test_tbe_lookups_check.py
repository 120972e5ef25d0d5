"""The TBE lookups check's compiled verdict (``_validate_numba.tbe_lookups_ok``)
accepts exactly the lookups that ``embnum._tbe_bounds.check`` passes unchanged (the exact rules:
offsets in ``[0, N]``, non-decreasing, the last ``N``; every index inside a bag of feature ``t`` in
``[0, rows[t])``, ``-1`` only when pruned rows are allowed), on drawn lookups valid and broken
(int64 extremes included); and ``check`` gives the same result, error or repair with and without
it. Also: the per-layout caches of the TBE declarations are never stale."""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import _tbe_bounds, _validate

pytest.importorskip("numba")

ENTRY = st.one_of(st.integers(-3, 12), st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**62, 2**63 - 1]))


@st.composite
def lookups(draw):
    T = draw(st.integers(1, 3))
    B = draw(st.integers(0, 3))
    rows = np.array([draw(st.integers(1, 5)) for _ in range(T)], np.int64)
    lengths = [draw(st.integers(0, 3)) for _ in range(T * B)]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    N = int(offsets[-1])
    indices = np.array([draw(st.integers(-1, 4)) for _ in range(N)], np.int64)
    how = draw(st.sampled_from(["valid", "entry", "entry", "swap", "pruned", "edge"]))
    if how == "entry":  # any entry of either array replaced by a drawn value
        a = offsets if draw(st.booleans()) else indices
        if a.size:
            a[draw(st.integers(0, a.size - 1))] = draw(ENTRY)
    elif how == "swap" and T * B > 1:  # two adjacent offsets out of order (both still in [0, N])
        k = draw(st.integers(1, T * B - 1))
        offsets[k], offsets[k + 1] = offsets[k + 1], offsets[k]
    elif how in ("pruned", "edge") and N:  # -1, or the first row past its feature's table
        p = draw(st.integers(0, N - 1))
        t = int(np.searchsorted(offsets[::B], p, side="right")) - 1 if B else 0
        indices[p] = -1 if how == "pruned" else rows[min(t, T - 1)]
    small = all(np.abs(a).max(initial=0) < 2**31 for a in (offsets, indices))
    if small and draw(st.booleans()):
        offsets = offsets.astype(np.int32)
    if small and draw(st.booleans()):
        indices = indices.astype(np.int32)
    return indices, offsets, B, rows


def _outcome(case, mode, pruned_ok):
    indices, offsets, B, rows = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            i, o = _tbe_bounds.check(indices, offsets, B, rows, mode, pruned_ok=pruned_ok)
        except (ValueError, IndexError) as e:
            return type(e).__name__, str(e)
    return i.tolist(), o.tolist(), i.dtype, o.dtype, i is indices and o is offsets


@given(case=lookups(), mode=st.sampled_from(_tbe_bounds.MODES), pruned_ok=st.booleans())
def test_compiled_lookups_verdict_matches_the_exact_rules(case, mode, pruned_ok):
    from embnum import _validate_numba

    indices, offsets, B, rows = case
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_validate, "compiled", lambda: None)
        m.setattr(_validate, "_fast", lambda a: None)
        exact = _outcome(case, mode, pruned_ok)
        unchanged = _outcome(case, "fatal", pruned_ok)
    accepted = isinstance(unchanged, tuple) and len(unchanged) == 5 and unchanged[4]
    assert bool(_validate_numba.tbe_lookups_ok(indices, offsets, B, rows, pruned_ok)) == accepted
    assert _outcome(case, mode, pruned_ok) == exact


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
