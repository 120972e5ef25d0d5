"""The tbe_quantized family's test tables (no torch): see tests/tables/__init__.py."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import embnum
from embnum.ops.tbe_quantized import TYPE_CODES

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


# -- optional differential tier: fbgemm_gpu's inference TBE module on CPU -----------------
NO_FBGEMM_PEER = {
    "tbe_forward_quantized": "compared through IntNBitTableBatchedEmbeddingBagsCodegen (test_fbgemm_int_nbit_module): "
    "fbgemm's lookup operators are code-generated internal entry points",
}
