"""The jagged family's test tables (no torch): see tests/tables/__init__.py."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import embnum
from harness import Peer, tensor
from strategies import (
    index_dtypes,
    jagged_offsets,
    lengths,
    maybe_strided,
    value_arrays,
    value_dtypes,
)

FAMILY = [op.name for op in embnum.ops("jagged")]


# -- strategies: one per op ---------------------------------------------------
@st.composite
def cumsum_lengths(draw, ndim=1):
    dtype = draw(index_dtypes)
    shape = (draw(st.integers(0, 4)), draw(st.integers(0, 30))) if ndim == 2 else (draw(st.integers(0, 60)),)
    n = max(1, shape[-1])
    style = draw(st.sampled_from(["small", "negative", "near_int32_max"]))
    if style == "small":
        elem = st.integers(0, 20)
    elif style == "negative":
        elem = st.integers(-20, 20)
    else:  # prefix sums reach, but never pass, int32's range
        elem = st.integers(0, (2**31 - 1) // n)
    a = np.array(draw(st.lists(elem, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))), dtype=dtype)
    return {"lengths": draw(maybe_strided(a.reshape(shape)))}


@st.composite
def offsets_range_args(draw):
    lens = draw(lengths(draw(st.integers(0, 12)), max_len=6))
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(draw(index_dtypes))
    complete = draw(st.booleans()) or len(lens) == 0
    return {"offsets": offs if complete else offs[:-1], "range_size": int(offs[-1])}


@st.composite
def csr_runs(draw):
    batch_size = draw(st.integers(0, 4))
    (csr,), n_groups = draw(jagged_offsets(1, max_len=3, max_B=6))
    return batch_size, csr, n_groups * batch_size


@st.composite
def segment_sum_args(draw):
    batch_size, csr, needed = draw(csr_runs())
    dtype = draw(value_dtypes)
    values = draw(value_arrays(dtype, needed + draw(st.integers(0, 3)), special=False))
    return {"batch_size": batch_size, "csr_seg": csr, "values": draw(maybe_strided(values))}


@st.composite
def segment_sum_backward_args(draw):
    batch_size, csr, needed = draw(csr_runs())
    grad = draw(value_arrays(draw(value_dtypes), len(csr) - 1))
    return {
        "batch_size": batch_size,
        "csr_seg": csr,
        "grad_output": grad,
        "num_values": needed + draw(st.integers(0, 3)),
    }


def _padding(draw, dtype):
    if np.dtype(dtype).kind == "f":
        return draw(st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, -1.5, 1e6])))
    info = np.iinfo(dtype)
    return draw(st.one_of(st.integers(int(info.min), int(info.max)), st.sampled_from([0, -1, 7.0])))


@st.composite
def to_dense_args(draw, max_J=3):
    J = draw(st.integers(1, max_J))
    offsets, needed = draw(jagged_offsets(J, max_len=3 if J > 1 else 5))
    dtype = draw(value_dtypes)
    N = needed + draw(st.integers(0, 2))
    shape = (N,) if draw(st.integers(0, 3)) == 0 else (N, draw(st.integers(0, 5)))
    values = draw(maybe_strided(draw(value_arrays(dtype, shape))))
    max_lengths = [draw(st.integers(0, 4)) for _ in range(J)]
    return {"values": values, "offsets": offsets, "max_lengths": max_lengths, "padding_value": _padding(draw, dtype)}


@st.composite
def one_jagged_dim(draw, ndim):
    """Arguments of jagged_1d_to_dense (``ndim=1``) or jagged_2d_to_dense (``ndim=2``)."""
    (offsets,), needed = draw(jagged_offsets(1, max_len=5))
    dtype = draw(value_dtypes)
    shape = (needed + draw(st.integers(0, 2)),) + ((draw(st.integers(0, 5)),) if ndim == 2 else ())
    args = {
        "values": draw(maybe_strided(draw(value_arrays(dtype, shape)))),
        "offsets": offsets,
        "max_sequence_length": draw(st.integers(0, 6)),
    }
    if ndim == 1:
        args["padding_value"] = _padding(draw, dtype)
    return args


@st.composite
def to_jagged_args(draw, max_J=3):
    J = draw(st.integers(1, max_J))
    offsets, needed = draw(jagged_offsets(J, max_len=3 if J > 1 else 5))
    B = len(offsets[0]) - 1
    dims = [draw(st.integers(0, 4)) for _ in range(J)] + [draw(st.integers(0, 4))]
    dense = draw(maybe_strided(draw(value_arrays(draw(value_dtypes), (B, *dims)))))
    total_L = draw(st.one_of(st.none(), st.integers(needed, needed + 2)))
    return {"dense": dense, "offsets": offsets, "total_L": total_L}


STRATEGIES = {
    "complete_cumsum": st.one_of(cumsum_lengths(1), cumsum_lengths(2)),
    "exclusive_cumsum": cumsum_lengths(1),
    "inclusive_cumsum": cumsum_lengths(1),
    "offsets_range": offsets_range_args(),
    "segment_sum_csr": segment_sum_args(),
    "segment_sum_csr_backward": segment_sum_backward_args(),
    "jagged_to_padded_dense": to_dense_args(),
    "jagged_1d_to_dense": one_jagged_dim(1),
    "jagged_2d_to_dense": one_jagged_dim(2),
    "dense_to_jagged": to_jagged_args(),
}


# -- edges named by the spec, on every backend -----------------------------------
def offsets_array(*xs, dtype=np.int64):
    return np.array(xs, dtype=dtype)


_MR = np.random.default_rng(11)
_ML = _MR.integers(0, 4, 300)
_ML[[5, 200]] = [9, 12]  # rows past the dense length
MANY_O = np.concatenate([[0], np.cumsum(_ML)]).astype(np.int64)  # 300 jagged rows
MANY_V = _MR.standard_normal((int(MANY_O[-1]), 3)).astype(np.float32)
MANY_TOP = np.concatenate([[0], np.cumsum(np.tile([2, 1, 3, 0], 38))[:149], [300]]).astype(np.int64)  # 150 rows
EDGES = {
    "B=0": (
        "jagged_to_padded_dense",
        dict(values=np.zeros((0, 3), np.float32), offsets=[offsets_array(0)], max_lengths=[4]),
    ),
    "all bags empty": (
        "dense_to_jagged",
        dict(dense=np.ones((3, 2, 2), np.float16), offsets=[offsets_array(0, 0, 0, 0)]),
    ),
    "five jagged dims": (
        "jagged_to_padded_dense",
        dict(
            values=np.arange(8.0),
            offsets=[
                offsets_array(0, 2),
                offsets_array(0, 1, 3),
                offsets_array(0, 2, 3, 4),
                offsets_array(0, 1, 2, 3, 5),
                offsets_array(0, 1, 3, 4, 6, 8),
            ],
            max_lengths=[2, 2, 2, 2, 2],
            padding_value=-1.0,
        ),
    ),
    "five jagged dims back": (
        "dense_to_jagged",
        dict(
            dense=np.arange(32.0).reshape(1, 2, 2, 2, 2, 2, 1),
            offsets=[
                offsets_array(0, 2),
                offsets_array(0, 1, 3),
                offsets_array(0, 2, 3, 4),
                offsets_array(0, 1, 2, 3, 5),
                offsets_array(0, 1, 3, 4, 6, 8),
            ],
        ),
    ),
    "3000 float16 ones": (
        "segment_sum_csr",
        dict(batch_size=1, csr_seg=offsets_array(0, 3000), values=np.ones(3000, np.float16)),
    ),
    "int32 wraps": (
        "segment_sum_csr",
        dict(batch_size=1, csr_seg=offsets_array(0, 2), values=np.array([2**31 - 1, 1], np.int32)),
    ),
    "int64 sums past 2**53, exact and wrapping": (
        "segment_sum_csr",
        dict(
            batch_size=1,
            csr_seg=offsets_array(0, 1, 1, 40, 41, 100),
            values=np.concatenate([2**53 + 2 * np.arange(1, 97) + 1, [2**62, 2**62, 2**62, -3]]).astype(np.int64),
        ),
    ),
    "many padded rows, short and long (more than one pass of the grid)": (
        "jagged_to_padded_dense",
        dict(values=MANY_V, offsets=[MANY_O], max_lengths=[10], padding_value=-2.5),
    ),
    "many rows of one element (more than one pass of the grid)": (
        "jagged_1d_to_dense",
        dict(values=MANY_V[:, 0].astype(np.int32), offsets=MANY_O, max_sequence_length=1, padding_value=-1),
    ),
    "many rows over two jagged levels": (
        "jagged_to_padded_dense",
        dict(values=MANY_V[:, :2].astype(np.float16), offsets=[MANY_TOP, MANY_O], max_lengths=[2, 5]),
    ),
    "many jagged rows back (more than one pass of the grid)": (
        "dense_to_jagged",
        dict(dense=np.arange(300 * 4 * 3, dtype=np.float64).reshape(300, 4, 3), offsets=[MANY_O]),
    ),
    "many jagged rows back over two levels, rows wider than a lane group": (
        "dense_to_jagged",
        dict(dense=np.arange(150 * 2 * 3 * 11.0).reshape(150, 2, 3, 11), offsets=[MANY_TOP, MANY_O]),
    ),
    "many short runs (more than one pass of the grid)": (
        "segment_sum_csr",
        # 96 runs of 0-3 elements: the simulated grid sums 8 runs a pass (64 with 256-thread blocks)
        dict(batch_size=2, csr_seg=np.cumsum(np.arange(97) % 4), values=np.arange(288, dtype=np.float32) / 7),
    ),
    "exclusive int32 at the limit": ("exclusive_cumsum", dict(lengths=np.array([2**31 - 1, 5], np.int32))),
    "float16 padding overflows to inf": (
        "jagged_1d_to_dense",
        dict(values=np.ones(3, np.float16), offsets=offsets_array(0, 1, 3), max_sequence_length=3, padding_value=1e6),
    ),
    "scan over three levels of blocks": ("inclusive_cumsum", dict(lengths=np.arange(100, dtype=np.int64) % 7)),
    "empty offsets_range": ("offsets_range", dict(offsets=offsets_array(), range_size=0)),
    "batch_size 0": ("segment_sum_csr", dict(batch_size=0, csr_seg=offsets_array(0, 2, 5), values=np.ones(4))),
}


# -- the spec's worked examples (fbgemm's numbers), on every backend ------------
V = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]], np.float32)
O = offsets_array(0, 2, 3, 3, 6)
WORKED = [
    ("complete_cumsum", dict(lengths=offsets_array(2, 0, 3, 1, dtype=np.int32)), [0, 2, 2, 5, 6]),
    ("exclusive_cumsum", dict(lengths=offsets_array(2, 0, 3, 1, dtype=np.int32)), [0, 2, 2, 5]),
    ("inclusive_cumsum", dict(lengths=offsets_array(2, 0, 3, 1, dtype=np.int32)), [2, 2, 5, 6]),
    ("complete_cumsum", dict(lengths=np.array([[1, 2, 0], [3, 0, 4]])), [[0, 1, 3, 3], [0, 3, 3, 7]]),
    ("offsets_range", dict(offsets=offsets_array(0, 2, 2, 5), range_size=6), [0, 1, 0, 1, 2, 0]),
    ("offsets_range", dict(offsets=offsets_array(0, 2, 2, 5, 6), range_size=6), [0, 1, 0, 1, 2, 0]),
    ("segment_sum_csr", dict(batch_size=2, csr_seg=offsets_array(0, 1, 1, 3), values=np.arange(1, 7.0)), [3, 0, 18]),
    ("segment_sum_csr", dict(batch_size=1, csr_seg=offsets_array(1, 3), values=np.arange(1, 7.0)), [5]),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[O], max_lengths=[2], padding_value=-1.0),
        [[[1, 2], [3, 4]], [[5, 6], [-1, -1]], [[-1, -1], [-1, -1]], [[7, 8], [9, 10]]],
    ),
    (
        "jagged_to_padded_dense",
        dict(values=np.arange(1, 7.0), offsets=[O], max_lengths=[3]),
        [[1, 2, 0], [3, 0, 0], [0, 0, 0], [4, 5, 6]],
    ),
    (
        "jagged_to_padded_dense",
        dict(values=np.arange(1, 7.0), offsets=[offsets_array(0, 2, 3), offsets_array(0, 1, 3, 6)], max_lengths=[2, 3]),
        [[[1, 0, 0], [2, 3, 0]], [[4, 5, 6], [0, 0, 0]]],
    ),
    (
        "jagged_to_padded_dense",
        dict(
            values=np.arange(1, 7.0)[:, None],
            offsets=[offsets_array(0, 2, 3), offsets_array(0, 1, 3, 6)],
            max_lengths=[2, 2],
            padding_value=9.0,
        ),
        [[[[1], [9]], [[2], [3]]], [[[4], [5]], [[9], [9]]]],
    ),
    (
        "dense_to_jagged",
        dict(dense=np.arange(1, 17.0).reshape(4, 2, 2), offsets=[O]),
        [[1, 2], [3, 4], [5, 6], [13, 14], [15, 16], [0, 0]],
    ),
    (
        "dense_to_jagged",
        dict(dense=np.arange(1, 17.0).reshape(4, 2, 2), offsets=[O], total_L=7),
        [[1, 2], [3, 4], [5, 6], [13, 14], [15, 16], [0, 0], [0, 0]],
    ),
    (
        "jagged_1d_to_dense",
        dict(values=np.arange(10, 16), offsets=O, max_sequence_length=2, padding_value=-1),
        [[10, 11], [12, -1], [-1, -1], [13, 14]],
    ),
    (
        "jagged_2d_to_dense",
        dict(values=V, offsets=O, max_sequence_length=3),
        [[[1, 2], [3, 4], [0, 0]], [[5, 6], [0, 0], [0, 0]], [[0, 0], [0, 0], [0, 0]], [[7, 8], [9, 10], [11, 12]]],
    ),
]


NOT_WORKED = {
    "segment_sum_csr_backward": "the spec gives no example: it is segment_sum_csr's adjoint, checked by "
    "test_gradcheck_segment_sum_csr and the drawn oracle comparison",
}


# -- bad input ----------------------------------------------------------------------
I32 = np.int32
SSB = dict(batch_size=2, csr_seg=offsets_array(0, 1, 3), grad_output=np.ones(2), num_values=6)
BAD = [
    ("segment_sum_csr_backward", dict(SSB, grad_output=np.ones(3)), ValueError, ("grad_output", "2 entries", "3")),
    ("segment_sum_csr_backward", dict(SSB, num_values=5), ValueError, ("csr_seg[-1] * batch_size", "5")),
    ("segment_sum_csr_backward", dict(SSB, csr_seg=offsets_array(0, 2, 1)), ValueError, ("csr_seg", "non-decreasing")),
    ("complete_cumsum", dict(lengths=np.array(3)), ValueError, ("lengths", "1-D or 2-D")),
    ("complete_cumsum", dict(lengths=np.zeros((2, 2, 2), np.int64)), ValueError, ("lengths",)),
    ("complete_cumsum", dict(lengths=np.ones(3, np.float32)), TypeError, ("lengths", "float32")),
    ("complete_cumsum", dict(lengths=[1, 2]), TypeError, ("lengths", "list")),
    ("complete_cumsum", dict(lengths=np.array([2**31 - 1, 5], I32)), ValueError, ("lengths", "overflows int32")),
    ("inclusive_cumsum", dict(lengths=np.array([2**31 - 1, 5], I32)), ValueError, ("overflows int32",)),
    ("exclusive_cumsum", dict(lengths=np.array([2**31 - 1, 5, 1], I32)), ValueError, ("overflows int32",)),
    ("exclusive_cumsum", dict(lengths=np.ones((2, 2), np.int64)), ValueError, ("lengths", "1-D")),
    ("offsets_range", dict(offsets=offsets_array(0, 7), range_size=5), ValueError, ("offsets[-1] = 7",)),
    (
        "offsets_range",
        dict(offsets=offsets_array(0, 3, 2), range_size=5),
        ValueError,
        ("offsets", "non-decreasing", "offsets[2] = 2"),
    ),
    ("offsets_range", dict(offsets=offsets_array(1, 2), range_size=5), ValueError, ("offsets[0]",)),
    ("offsets_range", dict(offsets=offsets_array(), range_size=3), ValueError, ("offsets", "range_size = 3")),
    ("offsets_range", dict(offsets=offsets_array(0), range_size=-1), ValueError, ("range_size",)),
    ("offsets_range", dict(offsets=offsets_array(0), range_size=2.0), TypeError, ("range_size",)),
    ("segment_sum_csr", dict(batch_size=1, csr_seg=offsets_array(), values=np.ones(3)), ValueError, ("csr_seg",)),
    (
        "segment_sum_csr",
        dict(batch_size=1, csr_seg=offsets_array(0, 2), values=np.ones((2, 2))),
        ValueError,
        ("values", "1-D"),
    ),
    (
        "segment_sum_csr",
        dict(batch_size=2, csr_seg=offsets_array(0, 2), values=np.ones(3)),
        ValueError,
        ("csr_seg[-1] * batch_size", "len(values) = 3"),
    ),
    (
        "segment_sum_csr",
        dict(batch_size=1, csr_seg=offsets_array(0, 1), values=np.ones(1, bool)),
        TypeError,
        ("values", "bool"),
    ),
    (
        "segment_sum_csr",
        dict(batch_size=-1, csr_seg=offsets_array(0, 1), values=np.ones(1)),
        ValueError,
        ("batch_size",),
    ),
    (
        "segment_sum_csr",
        dict(batch_size=1, csr_seg=offsets_array(0, 2, 1), values=np.ones(3)),
        ValueError,
        ("csr_seg", "non-decreasing"),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[offsets_array(0, 7)], max_lengths=[2]),
        ValueError,
        ("offsets[0][-1] = 7", "6"),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[offsets_array(0, 3, 2)], max_lengths=[2]),
        ValueError,
        ("offsets[0]", "non-decreasing"),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[offsets_array(0, 2), offsets_array(0, 1)], max_lengths=[2, 2]),
        ValueError,
        ("offsets[1]", "3 entries"),
    ),
    ("jagged_to_padded_dense", dict(values=V, offsets=[O], max_lengths=[2, 2]), ValueError, ("max_lengths",)),
    ("jagged_to_padded_dense", dict(values=V, offsets=[O], max_lengths=[-1]), ValueError, ("max_lengths[0]",)),
    ("jagged_to_padded_dense", dict(values=V, offsets=O, max_lengths=[2]), TypeError, ("offsets", "list")),
    ("jagged_to_padded_dense", dict(values=V, offsets=[], max_lengths=[]), ValueError, ("offsets",)),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[offsets_array(0)] * 6, max_lengths=[0] * 6),
        ValueError,
        ("offsets", "6"),
    ),
    ("jagged_to_padded_dense", dict(values=np.ones((6, 1, 2)), offsets=[O], max_lengths=[2]), ValueError, ("values",)),
    (
        "jagged_to_padded_dense",
        dict(values=V.astype(np.uint8), offsets=[O], max_lengths=[2]),
        TypeError,
        ("values", "uint8"),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[O.astype(np.float32)], max_lengths=[2]),
        TypeError,
        ("offsets[0]",),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V, offsets=[O], max_lengths=[2], padding_value="x"),
        TypeError,
        ("padding_value",),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V.astype(I32), offsets=[O], max_lengths=[2], padding_value=2.7),
        ValueError,
        ("padding_value",),
    ),
    (
        "jagged_to_padded_dense",
        dict(values=V.astype(I32), offsets=[O], max_lengths=[2], padding_value=1e12),
        ValueError,
        ("padding_value",),
    ),
    ("dense_to_jagged", dict(dense=np.ones((4, 2, 2)), offsets=[O], total_L=5), ValueError, ("total_L = 5",)),
    ("dense_to_jagged", dict(dense=np.ones((4, 2)), offsets=[O]), ValueError, ("dense", "3 dims")),
    ("dense_to_jagged", dict(dense=np.ones((3, 2, 2)), offsets=[O]), ValueError, ("offsets[0]", "4 entries")),
    ("jagged_1d_to_dense", dict(values=V, offsets=O, max_sequence_length=2), ValueError, ("values", "1-D")),
    ("jagged_1d_to_dense", dict(values=V[:, 0], offsets=[O], max_sequence_length=2), TypeError, ("offsets",)),
    ("jagged_2d_to_dense", dict(values=V[:, 0], offsets=O, max_sequence_length=2), ValueError, ("values", "2-D")),
]


# -- optional differential tier: fbgemm_gpu (tests/test_ops_fbgemm.py runs FBGEMM) ----------
def _no_f64(args, key):
    """fbgemm has no float64 kernels: float64 cases are compared in float32."""
    a = args[key]
    return dict(args, **{key: a.astype(np.float32)}) if a.dtype == np.float64 else args


def _j2pd_domain(args):
    """float32 for float64; no empty values (fbgemm rejects padding conversions on them); for
    integer values an integral padding that a double holds exactly (fbgemm takes the padding as
    a double)."""
    args = _no_f64(args, "values")
    args["values"] = values = np.ascontiguousarray(args["values"])
    if values.size == 0:
        return None
    if values.dtype.kind == "i":
        pad = int(args["padding_value"])
        info = np.iinfo(values.dtype)
        if float(pad) != pad or not info.min <= float(pad) <= info.max:
            return None
        args["padding_value"] = pad
    return args


def _d2j_domain(args):
    """float32 for float64 and integer dense (fbgemm's dense_to_jagged takes floating types)."""
    args = _no_f64(args, "dense")
    dense = np.ascontiguousarray(args["dense"])
    return dict(args, dense=dense.astype(np.float32) if dense.dtype.kind == "i" else dense)


def _segment_sum_domain(args):
    """float32 values (fbgemm: no float64; float16 accumulates in float16), NaN/inf made finite."""
    v = args["values"]
    return args if v.dtype == np.float32 else dict(args, values=np.nan_to_num(v).astype(np.float32))


def _to_dense_domain(args):
    """fbgemm's jagged_1d/2d_to_dense: ``max_sequence_length > 0`` (it asserts), float32 for float64,
    and a padding its int ``padding_value`` holds exactly."""
    pad = args.get("padding_value", 0)
    if args["max_sequence_length"] <= 0 or not float(pad).is_integer() or int(float(pad)) != pad:
        return None  # fbgemm carries the padding through a double
    dtype = np.dtype(args["values"].dtype)
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    if not float(info.min) <= pad <= float(info.max) or not -(2**63) <= int(pad) < 2**63:
        return None  # fbgemm raises where the padding overflows the values' dtype or its int
    return dict(_no_f64(args, "values"), **({"padding_value": int(pad)} if "padding_value" in args else {}))


def _one_dim(a):
    return tensor(a["values"]), tensor(a["offsets"]), a["max_sequence_length"]


def _offsets64(offsets):
    return [tensor(o.astype(np.int64)) for o in offsets]  # fbgemm wants one offsets dtype


FBGEMM = [
    Peer(
        "jagged_to_padded_dense",
        lambda fb, a: fb.jagged_to_padded_dense(
            tensor(a["values"]), _offsets64(a["offsets"]), a["max_lengths"], float(a["padding_value"])
        ),
        _j2pd_domain,
    ),
    Peer(
        "dense_to_jagged",
        lambda fb, a: fb.dense_to_jagged(tensor(a["dense"]), _offsets64(a["offsets"]), a["total_L"])[0],
        _d2j_domain,
        "values",
    ),
    Peer("complete_cumsum", lambda fb, a: fb.asynchronous_complete_cumsum(tensor(a["lengths"]))),
    Peer("exclusive_cumsum", lambda fb, a: fb.asynchronous_exclusive_cumsum(tensor(a["lengths"]))),
    Peer("inclusive_cumsum", lambda fb, a: fb.asynchronous_inclusive_cumsum(tensor(a["lengths"]))),
    Peer(
        "offsets_range",
        lambda fb, a: fb.offsets_range(tensor(a["offsets"]), a["range_size"]),
        # fbgemm leaves the output uninitialised for empty offsets (docs/families/jagged.md)
        lambda a: a if a["range_size"] else None,
    ),
    Peer("jagged_1d_to_dense", lambda fb, a: fb.jagged_1d_to_dense(*_one_dim(a), a["padding_value"]), _to_dense_domain),
    Peer("jagged_2d_to_dense", lambda fb, a: fb.jagged_2d_to_dense(*_one_dim(a)), _to_dense_domain),
    Peer(
        "segment_sum_csr",
        lambda fb, a: fb.segment_sum_csr(a["batch_size"], tensor(a["csr_seg"]), tensor(a["values"])),
        _segment_sum_domain,
        "tolerance",
    ),
]
NO_FBGEMM_PEER = {
    "segment_sum_csr_backward": "fbgemm has no operator for it (its segment_sum_csr has no backward)",
}
