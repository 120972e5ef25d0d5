"""The oracle comparisons' byte-equal fast path against the element-by-element rule."""

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from embnum._compare import element_verdict, same_bits, within

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_]


def _bits(a):
    return a.view(f"u{a.itemsize}")


@st.composite
def pairs(draw):
    """``(got, want)`` of one dtype and shape: ``want`` drawn, ``got`` a copy with some elements
    changed to NaNs of other payloads, the other zero, a neighbour ulp, an infinity or anything."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5))
    want = draw(hnp.arrays(dtype, shape))
    got = want.copy()
    n = got.size
    for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n)) if n else []:
        flat = got.reshape(-1)
        if dtype.kind == "f":
            kind = draw(st.sampled_from(["nan", "zero", "ulp", "inf", "any"]))
            bits = _bits(flat)
            if kind == "nan":
                exp_mask = {2: 0x7C00, 4: 0x7F800000, 8: 0x7FF0000000000000}[dtype.itemsize]
                payload = draw(st.integers(1, exp_mask >> 2))
                sign = draw(st.booleans()) << (8 * dtype.itemsize - 1)
                bits[i] = exp_mask | payload | sign
            elif kind == "zero":
                flat[i] = -flat[i] if flat[i] == 0 else dtype.type(0.0) * draw(st.sampled_from([1, -1]))
            elif kind == "ulp":
                with np.errstate(over="ignore", invalid="ignore"):
                    flat[i] = np.nextafter(flat[i], dtype.type(draw(st.sampled_from([np.inf, -np.inf]))))
            elif kind == "inf":
                flat[i] = dtype.type(draw(st.sampled_from([np.inf, -np.inf])))
            else:
                flat[i] = draw(hnp.from_dtype(dtype))
        else:
            flat[i] = draw(hnp.from_dtype(dtype))
    return got, want


TOLS = [None, "scalar", "array", "diff"]


@settings(max_examples=400, deadline=None)
@given(pairs(), st.sampled_from([0, 1, 2]), st.booleans(), st.sampled_from(TOLS), st.data())
def test_fast_path_holds_to_the_element_rule(pair, ulps, any_nan, tol_kind, data):
    got, want = pair
    assume(got.size > 0)
    tol = None
    if tol_kind == "scalar":
        tol = data.draw(st.floats(0, 1e3))
    elif tol_kind == "array":
        tol = data.draw(hnp.arrays(np.float64, want.shape, elements=st.floats(0, 1e3)))
    elif tol_kind == "diff":  # each element's own difference: a tolerance met exactly, element by element
        with np.errstate(all="ignore"):
            tol = np.nan_to_num(np.abs(got.astype(np.float64) - want.astype(np.float64)))
    full_tol = None if tol is None else np.broadcast_to(tol, want.shape)
    with np.errstate(all="ignore"):
        expect = element_verdict(got, want, ulps=ulps, any_nan=any_nan, tol=full_tol)
    assert same_bits(got, want, ulps=ulps, any_nan=any_nan, tol=tol) == expect
    assert same_bits([got, None, got], [want, None, want], ulps=ulps, any_nan=any_nan, tol=tol) == expect


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_equal_bytes_match_with_no_error(pair):
    _, want = pair
    got = want.copy()
    assert same_bits(got, want, any_nan=False) == (0.0, True)
    assert within(got, want, 0.0) == (0.0, True)
    if want.size:
        assert element_verdict(got, want, any_nan=False) == (0.0, True)


def test_signed_zero_and_nan_payload():
    want = np.array([0.0, np.nan, 1.0], np.float32)
    got = want.copy()
    got[0] = -0.0
    assert same_bits(got, want) == (0.0, False)
    assert same_bits(got, want, ulps=1) == (0.0, True)
    nan2 = want.copy()
    _bits(nan2)[1] |= 1
    assert same_bits(nan2, want) == (0.0, True)
    assert same_bits(nan2, want, any_nan=False) == (0.0, False)
    assert same_bits(got, want, tol=np.zeros(3)) == (0.0, True)
    assert same_bits(want.astype(np.float64), want) == (float("inf"), False)


def _update_rule(got, want):
    """The fused update's tolerance (tbe.md) on every element: relative 2e-5 plus 1e-6 of
    ``max(1, largest |value|)``, float16 one ulp more."""
    err, ok = 0.0, True
    for g, w in zip(got, want):
        w64 = w.astype(np.float64)
        tol = 2e-5 * np.abs(w64) + 1e-6 * max(1.0, np.abs(w64).max(initial=0.0))
        if w.dtype == np.float16:
            with np.errstate(invalid="ignore"):
                tol = tol + np.spacing(np.abs(w)).astype(np.float64)
        e, o = within(g, w, tol)
        err, ok = max(err, e), ok and o
    return err, ok


@settings(max_examples=300, deadline=None)
@given(st.lists(pairs().filter(lambda p: p[1].dtype.kind == "f"), min_size=1, max_size=3))
def test_update_check_tolerates_only_the_differing_elements_as_the_full_rule(pair_list):
    from embnum import _registry

    check = _registry.get("tbe_backward_update").check_fn
    got, want = [g for g, _ in pair_list], [w for _, w in pair_list]
    with np.errstate(all="ignore"):
        assert check(got, want, None) == _update_rule(got, want)
