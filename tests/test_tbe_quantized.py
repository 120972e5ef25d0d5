"""The quantized TBE inference lookup (docs/families/tbe_quantized.md): the
packing helper, every backend against the oracle on drawn inputs (all row
types, pooling modes, pruned rows, bounds repair), the spec's worked example,
bounds modes, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from embnum.ops.tbe_quantized import TYPE_CODES
from harness import check_matches_ref, check_rejects

TYPES = list(TYPE_CODES)
I64 = np.int64


def _dim(draw, ty):
    step = {"int4": 4, "int2": 8}.get(ty, 1)  # what the packing codecs accept
    return step * draw(st.integers(1, max(1, 9 // step)))


@st.composite
def lookup_args(draw):
    n_tables = draw(st.integers(1, 3))
    pooling = draw(st.sampled_from(["sum", "mean", "none", 0, 1]))
    tys = [draw(st.sampled_from(TYPES)) for _ in range(n_tables)]
    if pooling == "none":
        D0 = 8 * draw(st.integers(1, 2))  # one D fits every row type
        dims = [D0] * n_tables
    else:
        dims = [_dim(draw, ty) for ty in tys]
    rows = [draw(st.integers(1, 5)) for _ in range(n_tables)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tables = [
        (rng.standard_normal((r, d)) * 10.0 ** rng.uniform(-2, 2, (r, 1))).astype(np.float32)
        for r, d in zip(rows, dims)
    ]
    row_alignment = draw(st.sampled_from([1, 1, 4, 16]))
    weights, toffs = embnum.tbe_pack_quantized(
        tables, tys, row_alignment=row_alignment, table_alignment=draw(st.sampled_from([1, 128]))
    )
    # features: each reads a table; adjacent features may share one
    feature_table = sorted(draw(st.lists(st.integers(0, n_tables - 1), min_size=1, max_size=4)))
    T = len(feature_table)
    B = draw(st.integers(0, 3))
    lengths = [draw(st.integers(0, 4)) for _ in range(T * B)]
    lead = draw(st.sampled_from([0, 0, 0, 2]))
    offsets = lead + np.concatenate([[0], np.cumsum(lengths)]).astype(I64)
    N = int(offsets[-1])
    mode = draw(st.sampled_from(["fatal", "fatal", "none", "warning", "ignore", 0, 3]))
    idx = []
    for p in range(N):
        k = max(0, int(np.searchsorted(offsets, p, side="right")) - 1)
        E = rows[feature_table[min(k // max(B, 1), T - 1)]]
        choices = st.integers(-1, E - 1)
        if mode in ("warning", "ignore"):
            choices = st.one_of(choices, st.integers(-3, E + 3))
        idx.append(draw(choices))
    indices = np.array(idx, dtype=draw(st.sampled_from([np.int32, np.int64])))
    if mode in ("warning", "ignore") and draw(st.booleans()) and len(offsets) > 1:
        offsets = offsets.copy()
        offsets[draw(st.integers(0, len(offsets) - 1))] = draw(st.integers(-2, N + 3))
    args = dict(
        weights=weights,
        weights_offsets=toffs[feature_table],
        weights_tys=draw(
            st.sampled_from(
                [[tys[i] for i in feature_table], np.array([TYPE_CODES[tys[i]] for i in feature_table], np.uint8)]
            )
        ),
        D_offsets=np.concatenate([[0], np.cumsum([dims[i] for i in feature_table])]).astype(
            draw(st.sampled_from([np.int32, np.int64]))
        ),
        rows_per_table=np.array([rows[i] for i in feature_table], I64),
        indices=indices,
        offsets=offsets.astype(draw(st.sampled_from([np.int32, np.int64]))),
        pooling_mode=pooling,
        row_alignment=row_alignment,
        output_dtype=draw(st.sampled_from(["float32", "float32", "float16"])),
        bounds_check_mode=mode,
    )
    if pooling != "none" and draw(st.booleans()):
        args["per_sample_weights"] = rng.standard_normal(N).astype(np.float32)
    return args


# every fast backend against the oracle: tests/test_ops.py runs this table
STRATEGIES = {"tbe_forward_quantized": lookup_args()}
EXPECTED_WARNINGS = (RuntimeWarning,)  # the 'warning' bounds mode warns by design


# -- the spec's worked example (fbgemm's numbers) ------------------------------------
T0 = np.array([[0, 1, 2, 3], [-1, 0.5, 0, 1]], np.float32)
T1 = np.array([[1, -1, 0, 2], [0.25, 4, 1, -2]], np.float32)
PACKED = [
    102,
    50,
    0,
    0,
    80,
    250,
    68,
    48,
    0,
    188,
    176,
    248,
    6,
    34,
    0,
    188,
    170,
    0,
    85,
    255,
    6,
    38,
    0,
    192,
    96,
    255,
    128,
    0,
]


def test_pack_worked_example():
    weights, offsets = embnum.tbe_pack_quantized([T0, T1], ["int4", "int8"])
    assert weights.tolist() == PACKED and offsets.tolist() == [0, 12]


def _worked_args(**kw):
    w, o = embnum.tbe_pack_quantized([T0, T1], ["int4", "int8"])
    args = dict(
        weights=w,
        weights_offsets=o,
        weights_tys=["int4", "int8"],
        D_offsets=np.array([0, 4, 8]),
        rows_per_table=np.array([2, 2]),
        indices=np.array([1, 0, 1, 1, 0]),
        offsets=np.array([0, 2, 3, 3, 5]),
    )
    args.update(kw)
    return args


WORKED = [
    (
        "tbe_forward_quantized",
        _worked_args(),
        [
            [-1, 1.466064, 2.065918, 3.998779, 0, 0, 0, 0],
            [-1, 0.466309, 0.066406, 0.999512, 1.258759, 2.999908, 1.011703, -4.577637e-05],
        ],
        dict(rtol=1e-5, atol=1e-6),
    ),
]
# test_worked_examples: tests/test_ops.py runs WORKED on every backend


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


# -- bad input ---------------------------------------------------------------------------
def _bad(**kw):
    return "tbe_forward_quantized", dict(_worked_args(), **kw)


BAD = [
    (*_bad(weights=np.zeros(28, np.int8)), TypeError, ("weights", "int8")),
    (*_bad(weights_tys=["int4", "bf16"]), ValueError, ("weights_tys[1]", "bf16")),
    (*_bad(weights_tys=np.array([3, 5])), ValueError, ("weights_tys[1] = 5",)),
    (*_bad(weights_tys=["int4"]), ValueError, ("weights_tys", "2 entries")),
    (*_bad(D_offsets=np.array([0, 3, 8])), ValueError, ("int4", "even D")),
    (*_bad(D_offsets=np.array([0, 4, 4])), ValueError, ("feature 1", "D = ")),
    (*_bad(D_offsets=np.array([0, 4])), ValueError, ("D_offsets", "3 entries")),
    (*_bad(rows_per_table=np.array([2, 3])), ValueError, ("feature 1", "does not fit")),
    (*_bad(rows_per_table=np.array([0, 2])), ValueError, ("rows_per_table[0]",)),
    (*_bad(weights_offsets=np.array([0, -1])), ValueError, ("weights_offsets[1] = -1",)),
    (*_bad(offsets=np.array([0, 2, 3, 5])), ValueError, ("offsets", "T = 2")),
    (*_bad(offsets=np.array([0, 3, 2, 3, 5])), ValueError, ("offsets", "non-decreasing")),
    (*_bad(pooling_mode="max"), ValueError, ("pooling_mode", "max")),
    (*_bad(bounds_check_mode="strict"), ValueError, ("bounds_check_mode",)),
    (*_bad(output_dtype="bfloat16"), TypeError, ("output_dtype",)),
    (*_bad(row_alignment=0), ValueError, ("row_alignment",)),
    (*_bad(per_sample_weights=np.ones(4, np.float32)), ValueError, ("per_sample_weights", "5")),
    (*_bad(per_sample_weights=np.ones(5, np.float16)), TypeError, ("per_sample_weights", "float16")),
    (*_bad(per_sample_weights=np.ones(5, np.float32), pooling_mode="none"), ValueError, ("per_sample_weights", "none")),
    (*_bad(indices=np.array([1, 0, -2, 1, 0])), IndexError, ("indices[2] = -2", "feature 0")),
    (*_bad(indices=np.array([1, 0, 1, 1, 0.0])), TypeError, ("indices",)),
]
# test_bad_input: tests/test_ops.py runs BAD on every backend


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


# -- optional differential tier: fbgemm_gpu's inference TBE module on CPU -----------------
NO_FBGEMM_PEER = {
    "tbe_forward_quantized": "compared through IntNBitTableBatchedEmbeddingBagsCodegen (test_fbgemm_int_nbit_module): "
    "fbgemm's lookup operators are code-generated internal entry points",
}


@pytest.mark.fbgemm
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_fbgemm_int_nbit_module(data):
    """tbe_pack_quantized fills fbgemm's IntNBitTableBatchedEmbeddingBagsCodegen byte for byte
    (same table offsets), and its forward equals tbe_forward_quantized."""
    torch = pytest.importorskip("torch")
    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    except Exception:  # noqa: BLE001
        pytest.skip("fbgemm_gpu is not importable")
    draw = data.draw
    T = draw(st.integers(1, 3))
    tys = [draw(st.sampled_from(TYPES)) for _ in range(T)]
    dims = [8 * draw(st.integers(1, 3)) for _ in range(T)]  # the module needs D % 4 == 0 (and int2: 8)
    rows = [draw(st.integers(1, 6)) for _ in range(T)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tables = [rng.standard_normal((r, d)).astype(np.float32) for r, d in zip(rows, dims)]
    kinds = {
        "fp32": SparseType.FP32,
        "fp16": SparseType.FP16,
        "int8": SparseType.INT8,
        "int4": SparseType.INT4,
        "int2": SparseType.INT2,
    }
    pooling = draw(st.sampled_from(["sum", "mean"]))
    module = IntNBitTableBatchedEmbeddingBagsCodegen(
        [("", r, d, kinds[t], EmbeddingLocation.HOST) for r, d, t in zip(rows, dims, tys)],
        device="cpu",
        pooling_mode=PoolingMode.SUM if pooling == "sum" else PoolingMode.MEAN,
        output_dtype=SparseType.FP32,
        cacheline_alignment=False,
    )
    module.fill_random_weights()  # allocates the module's buffers (overwritten below)
    weights, woffs = embnum.tbe_pack_quantized(tables, tys, row_alignment=module.row_alignment)
    assert woffs.tolist() == module.weights_offsets.tolist() and weights.size == module.weights_host.numel()
    module.weights_host.copy_(torch.from_numpy(weights))
    B = draw(st.integers(1, 3))
    lengths = rng.integers(0, 4, T * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.integers(-1, rows[t], int(lengths[t * B : (t + 1) * B].sum())) for t in range(T)])
    psw = rng.standard_normal(len(indices)).astype(np.float32) if draw(st.booleans()) else None
    want = module(
        torch.from_numpy(indices.astype(np.int32)),
        torch.from_numpy(offsets.astype(np.int32)),
        None if psw is None else torch.from_numpy(psw),
    ).numpy()
    args = dict(
        weights=weights,
        weights_offsets=woffs,
        weights_tys=tys,
        D_offsets=np.concatenate([[0], np.cumsum(dims)]),
        rows_per_table=np.array(rows),
        indices=indices,
        offsets=offsets,
        pooling_mode=pooling,
        per_sample_weights=psw,
    )
    got = embnum.tbe_forward_quantized(**args)
    err, ok = embnum.get_op("tbe_forward_quantized").check_fn(got, want.astype(np.float32), args)
    assert ok, err


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
