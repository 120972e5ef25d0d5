"""The quantized TBE inference lookup beyond its tables (tests/tables/tbe_quantized.py, run by
tests/test_ops.py): the packing helper, pruned rows, bounds modes, bad input, the layout cache."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embnum
from harness import check_matches_ref, check_rejects
from tables.tbe_quantized import PACKED, T0, T1


def test_pack_worked_example():
    weights, offsets = embnum.tbe_pack_quantized([T0, T1], ["int4", "int8"])
    assert weights.tolist() == PACKED and offsets.tolist() == [0, 12]


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_pack_with_either_backends_quantizers(backend):
    weights, offsets = embnum.tbe_pack_quantized([T0, T1], ["int4", "int8"], backend=backend)
    assert weights.tolist() == PACKED and offsets.tolist() == [0, 12]


@pytest.mark.parametrize("backend", ["cuda", "numpy", 1])
def test_pack_takes_only_a_host_backend(backend):
    with pytest.raises(ValueError, match="backend must be 'cpu' or 'ref'"):
        embnum.tbe_pack_quantized([T0, T1], ["int4", "int8"], backend=backend)


def test_pack_alignment_and_padding():
    w, o = embnum.tbe_pack_quantized([T0, T1], ["int4", "fp16"], row_alignment=16, table_alignment=128)
    assert o.tolist() == [0, 128] and w.size == 256
    assert w[:6].tolist() == PACKED[:6] and w[16:22].tolist() == PACKED[6:12]  # the rows, aligned
    assert w[6:16].tolist() == [0] * 10 and w[32:128].tolist() == [0] * 96  # row and table padding
    assert np.array_equal(w[128:136].view("<f2"), T1[0].astype(np.float16))


def test_pack_int8_any_dim_and_float16_scale_in_front():
    t = np.array([[0, 1, 2.5]], np.float32)  # D = 3: fbgemm's quantize_embs(INT8) cannot
    w, _ = embnum.tbe_pack_quantized([t], ["int8"])
    q = embnum.float_to_fused_8bit_rowwise(t)
    sb32 = np.ascontiguousarray(q[:, 3:]).view("<f4")[0]
    assert np.array_equal(w[:4].view("<f2"), sb32.astype(np.float16)) and np.array_equal(w[4:], q[0, :3])


# -- pruned rows and bounds modes -------------------------------------------------------
def _fp32_tables():
    t0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    t1 = np.arange(12, 20, dtype=np.float32).reshape(2, 4)
    w, o = embnum.tbe_pack_quantized([t0, t1], ["fp32", "fp32"])
    return dict(
        weights=w,
        weights_offsets=o,
        weights_tys=["fp32", "fp32"],
        D_offsets=np.array([0, 4, 8]),
        rows_per_table=np.array([3, 2]),
    )


def test_pruned_rows_count_in_the_mean(fast_backend):
    args = dict(
        _fp32_tables(), indices=np.array([0, -1, 2, -1, -1]), offsets=np.array([0, 3, 3, 3, 5]), pooling_mode="mean"
    )
    for mode in ("fatal", "warning", "ignore", "none"):
        got = check_matches_ref("tbe_forward_quantized", dict(args, bounds_check_mode=mode), fast_backend)
        np.testing.assert_allclose(got, [[8 / 3, 10 / 3, 4, 14 / 3, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], rtol=1e-6)


def test_bounds_modes(fast_backend):
    base = dict(_fp32_tables(), indices=np.array([2, 7, 1, 0]), offsets=np.array([0, 2, 3, 3, 4]))
    want = [[8, 10, 12, 14, 0, 0, 0, 0], [4, 5, 6, 7, 12, 13, 14, 15]]
    for mode in ("fatal", "none"):
        check_rejects(
            "tbe_forward_quantized",
            dict(base, bounds_check_mode=mode),
            IndexError,
            ("indices[1] = 7", "feature 0", "3 rows"),
            fast_backend,
        )
    got = check_matches_ref("tbe_forward_quantized", dict(base, bounds_check_mode="warning"), fast_backend)
    np.testing.assert_array_equal(got, want)  # the fast backend warned as ref did (checked there); ref warns:
    with pytest.warns(RuntimeWarning, match="repaired out-of-range indices"):
        embnum.tbe_forward_quantized(**dict(base, bounds_check_mode="warning"), backend="ref")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'ignore' repairs silently
        got = check_matches_ref("tbe_forward_quantized", dict(base, bounds_check_mode="ignore"), fast_backend)
    np.testing.assert_array_equal(got, want)
    bad_end = dict(base, indices=np.array([2, 0, 1, 0]), offsets=np.array([0, 2, 3, 3, 9]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = check_matches_ref("tbe_forward_quantized", dict(bad_end, bounds_check_mode="warning"), fast_backend)
    np.testing.assert_array_equal(got, want)
    check_rejects(
        "tbe_forward_quantized",
        dict(bad_end, bounds_check_mode="fatal"),
        ValueError,
        ("offsets[4] = 9", "4"),
        fast_backend,
    )


def test_bounds_mode_codes_and_offset_clamp(fast_backend):
    """fbgemm's BoundsCheckMode codes 0..3 name the modes too; an offset past N is clamped by the repair."""
    bad = dict(_fp32_tables(), indices=np.array([2, 0, 1, 0]), offsets=np.array([0, 2, 7, 3, 4]))
    for code in (0, 3):
        check_rejects(
            "tbe_forward_quantized", dict(bad, bounds_check_mode=code), ValueError, ("offsets[2] = 7",), fast_backend
        )
    want = [[8, 10, 12, 14, 0, 0, 0, 0], [4, 6, 8, 10, 0, 0, 0, 0]]  # offsets repaired to [0, 2, 4, 4, 4]
    got = check_matches_ref("tbe_forward_quantized", dict(bad, bounds_check_mode=1), fast_backend)
    np.testing.assert_array_equal(got, want)  # the fast backend warned as ref did (checked there); ref warns:
    with pytest.warns(RuntimeWarning, match="repaired out-of-range offsets"):
        embnum.tbe_forward_quantized(**dict(bad, bounds_check_mode=1), backend="ref")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = check_matches_ref("tbe_forward_quantized", dict(bad, bounds_check_mode=2), fast_backend)
    np.testing.assert_array_equal(got, want)


def test_none_pooling_zero_rows_outside_bags(fast_backend):
    args = dict(
        _fp32_tables(), indices=np.array([1, 2, -1, 1, 0]), offsets=np.array([1, 2, 3, 3, 5]), pooling_mode="none"
    )
    got = check_matches_ref("tbe_forward_quantized", args, fast_backend)
    np.testing.assert_array_equal(got, [[0] * 4, [8, 9, 10, 11], [0] * 4, [16, 17, 18, 19], [12, 13, 14, 15]])


def test_none_pooling_needs_one_dim():
    w, o = embnum.tbe_pack_quantized([T0, T1[:, :2]], ["fp32", "fp32"])
    with pytest.raises(ValueError, match="one D"):
        embnum.tbe_forward_quantized(
            w, o, ["fp32", "fp32"], np.array([0, 4, 6]), np.array([2, 2]), np.array([0]), np.array([0, 1, 1]), "none"
        )


def test_pack_bad_input():
    with pytest.raises(ValueError, match="int2 rows need D % 4"):
        embnum.tbe_pack_quantized([T0[:, :2]], ["int2"])
    with pytest.raises(ValueError, match="tables\\[0\\]: packing int4 rows needs D % 4"):
        embnum.tbe_pack_quantized([np.ones((2, 6), np.float32)], ["int4"])
    with pytest.raises(ValueError, match="weights_tys\\[0\\]"):
        embnum.tbe_pack_quantized([T0], ["fp8"])
    with pytest.raises(ValueError, match="table_alignment"):
        embnum.tbe_pack_quantized([T0], ["fp32"], table_alignment=0)
    with pytest.raises(TypeError, match="tables\\[0\\]"):
        embnum.tbe_pack_quantized([T0.astype(np.float64)], ["fp32"])


@pytest.mark.parametrize("name", ["D_offsets", "rows_per_table"])
@pytest.mark.parametrize("alter", [lambda a: a.view(a.dtype.newbyteorder()), lambda a: a.reshape(1, -1)])
def test_cached_layout_never_skips_the_array_checks(name, alter):
    """A validated layout is cached by dtype, shape and bytes, and a hit skips the index-array
    checks of D_offsets and rows_per_table: an array with the same bytes in another byte order
    ('>i8' and '<i8' share the code 'l') or shape must still fail them."""
    table = np.array([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], dtype=np.float32)
    weights, weights_offsets = embnum.tbe_pack_quantized([table], ["fp16"])
    args = dict(
        weights=weights,
        weights_offsets=weights_offsets,
        weights_tys=["fp16"],
        D_offsets=np.array([0, 4]),
        rows_per_table=np.array([2]),
        indices=np.array([0, 1]),
        offsets=np.array([0, 2]),
    )
    embnum.tbe_forward_quantized(**args)  # validated and cached
    bad = alter(args[name])
    assert bad.tobytes() == args[name].tobytes()
    args[name] = bad
    with pytest.raises((TypeError, ValueError), match=name):
        embnum.tbe_forward_quantized(**args)


def test_cached_layout_takes_no_object_array_of_type_names():
    """An object array's bytes are addresses: it never makes a cache key (a freed name's address
    can be reused by another)."""
    from embnum.ops import tbe_quantized as ops_q

    tys = np.array(["fp16"], dtype=object)
    w = np.zeros(8, np.uint8)
    assert ops_q._layout_key(w, np.array([0]), tys, np.array([0, 4]), np.array([1]), 1) is None
