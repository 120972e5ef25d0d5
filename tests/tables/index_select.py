"""The index_select family's test tables (no torch): see tests/tables/__init__.py."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from harness import Peer, tensor
from strategies import FLOAT_DTYPES, index_dtypes, maybe_strided, value_dtypes

I32, I64 = np.int32, np.int64


def _rng(draw):
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _values(draw, rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        v = rng.standard_normal(shape).astype(dtype)
        if v.size and draw(st.booleans()):
            v.reshape(-1)[rng.integers(0, v.size)] = draw(st.sampled_from([np.nan, np.inf, -0.0]))
        return v
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _picks(draw, rng, rows, small):
    """Indices into ``rows`` rows: repeats, a permutation, a few, or none."""
    if rows == 0:
        return np.zeros(0, draw(index_dtypes))
    n = draw(st.integers(0, 6 if small else 3 * rows))
    return rng.integers(0, rows, n).astype(draw(index_dtypes))


# -- strategies ---------------------------------------------------------------------------------
@st.composite
def group_args(draw, small=False):
    rng = _rng(draw)
    G = draw(st.integers(1, 3 if small else 6))
    inputs, indices = [], []
    for _ in range(G):
        rows = draw(st.integers(0, 5 if small else 300))
        inner = tuple(draw(st.lists(st.integers(0, 4 if small else 9), max_size=2)))
        a = _values(draw, rng, draw(value_dtypes), (rows, *inner))
        inputs.append(draw(maybe_strided(a)))
        indices.append(draw(maybe_strided(_picks(draw, rng, rows, small))))
    return dict(input_group=inputs, indices_group=indices)


@st.composite
def _batch_layout(draw, small, positive=False):
    """``(num, rows, cols, indices, permute)`` of a batch op: ``T`` tables (rows may be 0, widths may
    be 0); with ``permute`` every table selects the same number ``B`` of rows. ``positive``: every
    count at least 1 (fbgemm's domain)."""
    rng = _rng(draw)
    lo = int(positive)
    T = draw(st.integers(lo, 3 if small else 12))
    rows = [draw(st.integers(lo, 5 if small else 200)) for _ in range(T)]
    cols = [
        draw(st.sampled_from([1, 3, 4, 16, 33] if positive else [0, 1, 3, 4] if small else [0, 1, 3, 4, 16, 33]))
        for _ in range(T)
    ]
    permute = draw(st.booleans())
    if permute:  # one batch size; tables with no rows cannot be selected from
        rows = [max(r, 1) for r in rows]
        B = draw(st.integers(lo, 5 if small else 300))
        num = [B] * T
    else:
        num = [0 if r == 0 else draw(st.integers(lo, 6 if small else 300)) for r in rows]
    dtype = draw(index_dtypes)
    idx = [rng.integers(0, max(r, 1), n) for r, n in zip(rows, num)]
    indices = (np.concatenate(idx) if idx else np.zeros(0)).astype(dtype)
    return num, rows, cols, draw(maybe_strided(indices)), permute


@st.composite
def batch_args(draw, small=False, positive=False):
    num, rows, cols, indices, permute = draw(_batch_layout(small, positive))
    n_in = sum(r * c for r, c in zip(rows, cols))
    inputs = _values(draw, _rng(draw), draw(value_dtypes), n_in)
    return dict(
        inputs=draw(maybe_strided(inputs)),
        indices=indices,
        input_num_indices=num,
        input_rows=rows,
        input_columns=cols,
        permute_output_dim_0_1=permute,
    )


@st.composite
def batch_backward_args(draw, small=False, positive=False):
    num, rows, cols, indices, permute = draw(_batch_layout(small, positive))
    n_out = sum(n * c for n, c in zip(num, cols))
    # few distinct rows: repeats, whose sums depend on the order of addition
    grad = _values(draw, _rng(draw), draw(st.sampled_from(FLOAT_DTYPES)), n_out)
    return dict(
        grad_output=draw(maybe_strided(grad)),
        indices=indices,
        input_num_indices=num,
        input_rows=rows,
        input_columns=cols,
        permute_output_dim_0_1=permute,
    )


@st.composite
def jagged_select_args(draw, small=False, fb=False):
    """Segments of 0..4 rows (some empty), a selection with repeats; sometimes a row cap, and
    rows past the last segment (a pool's spare capacity). ``fb``: int64 offsets, at least one
    selection and no float64 (fbgemm's domain)."""
    rng = _rng(draw)
    n_seg = draw(st.integers(1 if fb else 0, 5 if small else 40))
    lengths = rng.integers(0, 5, n_seg)
    spare = draw(st.integers(0, 3))
    width = draw(st.sampled_from([1, 2, 3] if small else [0, 1, 2, 5, 16]))
    dtype = draw(value_dtypes.filter(lambda d: not (fb and np.dtype(d) == np.float64)))
    values = _values(draw, rng, dtype, (int(lengths.sum()) + spare, width))
    m = draw(st.integers(1 if fb else 0, 6 if small else 60)) if n_seg else 0
    indices = rng.integers(0, max(n_seg, 1), m)
    offset_dtype = I64 if fb else draw(index_dtypes)
    out_offsets = np.cumsum(lengths[indices]).astype(offset_dtype)
    rows = None
    if draw(st.booleans()):
        rows = draw(st.integers(0, int(out_offsets[-1]) if m else 0))
    return dict(
        values=draw(maybe_strided(values)),
        indices=draw(maybe_strided(indices.astype(draw(index_dtypes)))),
        input_offsets=np.cumsum(lengths).astype(offset_dtype),
        output_offsets=out_offsets,
        num_dense_output_rows=rows,
    )


STRATEGIES = {
    "jagged_index_select_2d": jagged_select_args,
    "group_index_select_dim0": group_args,
    "batch_index_select_dim0": batch_args,
    "batch_index_select_dim0_backward": batch_backward_args,
}


# -- the page's worked examples, on every backend -------------------------------------------------
def arr(*xs, dtype=I64):
    return np.array(xs, dtype=dtype)


A6 = np.arange(6.0).reshape(3, 2)
X12 = np.arange(12.0)
J6 = np.arange(12.0).reshape(6, 2)  # segments of 2, 0, 3 and 1 rows
JS = dict(values=J6, indices=arr(2, 0, 3), input_offsets=arr(2, 2, 5, 6), output_offsets=arr(3, 5, 6))
BS = dict(indices=arr(2, 0, 1, 0), input_num_indices=[2, 2], input_rows=[3, 2], input_columns=[2, 3])
WORKED = [
    ("jagged_index_select_2d", JS, J6[[2, 3, 4, 0, 1, 5]]),
    ("jagged_index_select_2d", dict(JS, num_dense_output_rows=4), J6[[2, 3, 4, 0]]),
    (
        "group_index_select_dim0",
        dict(input_group=[A6, arr(7, 8, 9)], indices_group=[arr(2, 2, 0), arr(1)]),
        [np.array([[4.0, 5.0], [4.0, 5.0], [0.0, 1.0]]), arr(8)],
    ),
    ("batch_index_select_dim0", dict(BS, inputs=X12), np.array([4.0, 5, 0, 1, 9, 10, 11, 6, 7, 8])),
    (
        "batch_index_select_dim0",
        dict(BS, inputs=X12, permute_output_dim_0_1=True),
        np.array([4.0, 5, 9, 10, 11, 0, 1, 6, 7, 8]),
    ),
    (
        "batch_index_select_dim0_backward",
        dict(BS, indices=arr(2, 2, 1, 0), grad_output=np.arange(1.0, 11.0)),
        np.array([0.0, 0, 0, 0, 4, 6, 8, 9, 10, 5, 6, 7]),
    ),
    (  # float16 repeats: 2048 + 1 + 1 added in float32, rounded once (float16 steps would stay at 2048)
        "batch_index_select_dim0_backward",
        dict(
            grad_output=np.array([2048, 1, 1], np.float16),
            indices=arr(0, 0, 0),
            input_num_indices=[3],
            input_rows=[1],
            input_columns=[1],
        ),
        np.array([2050], np.float16),
    ),
]

EDGES = {
    "jagged select nothing": ("jagged_index_select_2d", dict(JS, indices=arr(), output_offsets=arr())),
    "jagged no segments": (
        "jagged_index_select_2d",
        dict(values=J6[:0], indices=arr(), input_offsets=arr(), output_offsets=arr()),
    ),
    "jagged only empty segments": (
        "jagged_index_select_2d",
        dict(JS, indices=arr(1, 1, dtype=I32), output_offsets=arr(0, 0)),
    ),
    "jagged zero rows kept": ("jagged_index_select_2d", dict(JS, num_dense_output_rows=0)),
    "jagged zero-width rows": ("jagged_index_select_2d", dict(JS, values=np.zeros((6, 0), np.float32))),
    "group one empty selection": ("group_index_select_dim0", dict(input_group=[A6], indices_group=[arr()])),
    "group no rows": (
        "group_index_select_dim0",
        dict(input_group=[np.zeros((0, 3), np.float32)], indices_group=[arr(dtype=I32)]),
    ),
    "batch T=0": (
        "batch_index_select_dim0",
        dict(inputs=X12[:0], indices=arr(), input_num_indices=[], input_rows=[], input_columns=[]),
    ),
    "batch zero-width table": (
        "batch_index_select_dim0",
        dict(inputs=X12[:6], indices=arr(1, 1, 0), input_num_indices=[1, 2], input_rows=[4, 3], input_columns=[0, 2]),
    ),
    "batch permuted B=0": (
        "batch_index_select_dim0",
        dict(BS, inputs=X12, indices=arr(), input_num_indices=[0, 0], permute_output_dim_0_1=True),
    ),
    "backward every row repeated": (
        "batch_index_select_dim0_backward",
        dict(
            grad_output=np.full(8, 0.1, np.float32),
            indices=arr(1, 1, 1, 1, 0, 0, 0, 0, dtype=I32),
            input_num_indices=[8],
            input_rows=[3],
            input_columns=[1],
        ),
    ),
}

BAD = [
    ("jagged_index_select_2d", dict(JS, indices=arr(4, 0, 3)), IndexError, ("indices[0] = 4", "[0, 4)")),
    ("jagged_index_select_2d", dict(JS, indices=arr(2, -1, 3)), IndexError, ("indices[1] = -1",)),
    ("jagged_index_select_2d", dict(JS, output_offsets=arr(3, 4, 5)), ValueError, ("output_offsets[1] = 4", "5")),
    ("jagged_index_select_2d", dict(JS, output_offsets=arr(3, 5)), ValueError, ("output_offsets", "3 entries")),
    (
        "jagged_index_select_2d",
        dict(JS, input_offsets=arr(2, 1, 5, 6)),
        ValueError,
        ("input_offsets", "non-decreasing"),
    ),
    ("jagged_index_select_2d", dict(JS, input_offsets=arr(2, 2, 5, 7)), ValueError, ("input_offsets[-1] = 7", "6")),
    ("jagged_index_select_2d", dict(JS, input_offsets=arr(-1, 2, 5, 6)), ValueError, ("input_offsets[0]",)),
    ("jagged_index_select_2d", dict(JS, num_dense_output_rows=7), ValueError, ("num_dense_output_rows", "7")),
    ("jagged_index_select_2d", dict(JS, num_dense_output_rows=-1), ValueError, ("num_dense_output_rows",)),
    ("jagged_index_select_2d", dict(JS, num_dense_output_rows=2.0), TypeError, ("num_dense_output_rows",)),
    ("jagged_index_select_2d", dict(JS, values=J6.reshape(-1)), ValueError, ("values", "2-D")),
    ("jagged_index_select_2d", dict(JS, values=J6.astype(np.uint8)), TypeError, ("values", "uint8")),
    ("jagged_index_select_2d", dict(JS, indices=J6[:3, 0]), TypeError, ("indices", "float64")),
    (
        "jagged_index_select_2d",
        dict(JS, output_offsets=arr(3, 5, 6, dtype=np.int16)),
        TypeError,
        ("output_offsets", "int16"),
    ),
    ("group_index_select_dim0", dict(input_group=[], indices_group=[]), ValueError, ("input_group", "at least 1")),
    (
        "group_index_select_dim0",
        dict(input_group=[A6], indices_group=[arr(3)]),
        IndexError,
        ("indices_group[0][0] = 3", "[0, 3)"),
    ),
    (
        "group_index_select_dim0",
        dict(input_group=[A6], indices_group=[arr(-1)]),
        IndexError,
        ("indices_group[0][0] = -1",),
    ),
    ("group_index_select_dim0", dict(input_group=[A6, A6], indices_group=[arr(0)]), ValueError, ("indices_group", "2")),
    (
        "group_index_select_dim0",
        dict(input_group=[A6], indices_group=[arr(0, dtype=np.int16)]),
        TypeError,
        ("indices_group[0]", "int16"),
    ),
    (
        "group_index_select_dim0",
        dict(input_group=[A6.astype(np.uint8)], indices_group=[arr(0)]),
        TypeError,
        ("input_group[0]", "uint8"),
    ),
    (
        "group_index_select_dim0",
        dict(input_group=[np.float32(1.0)], indices_group=[arr(0)]),
        TypeError,
        ("input_group[0]",),
    ),
    ("group_index_select_dim0", dict(input_group=A6, indices_group=[arr(0)]), TypeError, ("input_group", "list")),
    ("batch_index_select_dim0", dict(BS, inputs=X12[:11]), ValueError, ("len(inputs) = 11", "12")),
    (
        "batch_index_select_dim0",
        dict(BS, inputs=X12, indices=arr(0, 0, 2, 0)),
        IndexError,
        ("indices[2] = 2", "table 1", "input_rows[1]"),
    ),
    (
        "batch_index_select_dim0",
        dict(BS, inputs=X12, indices=arr(0, -1, 0, 0)),
        IndexError,
        ("indices[1] = -1", "table 0"),
    ),
    ("batch_index_select_dim0", dict(BS, inputs=X12, indices=arr(0, 0, 0)), ValueError, ("len(indices) = 3", "4")),
    ("batch_index_select_dim0", dict(BS, inputs=X12, input_rows=[3]), ValueError, ("input_rows", "2 entries")),
    ("batch_index_select_dim0", dict(BS, inputs=X12, input_columns=[2, -3]), ValueError, ("input_columns[1]",)),
    (
        "batch_index_select_dim0",
        dict(BS, inputs=X12, input_num_indices=[3, 1], permute_output_dim_0_1=True),
        ValueError,
        ("permute_output_dim_0_1", "[3, 1]"),
    ),
    ("batch_index_select_dim0", dict(BS, inputs=X12.reshape(3, 4)), ValueError, ("inputs", "1-D")),
    ("batch_index_select_dim0", dict(BS, inputs=X12.astype(np.uint16)), TypeError, ("inputs", "uint16")),
    ("batch_index_select_dim0", dict(BS, inputs=X12, permute_output_dim_0_1=2), TypeError, ("permute_output_dim_0_1",)),
    ("batch_index_select_dim0_backward", dict(BS, grad_output=X12[:9]), ValueError, ("len(grad_output) = 9", "10")),
    ("batch_index_select_dim0_backward", dict(BS, grad_output=np.arange(10)), TypeError, ("grad_output", "int64")),
    (
        "batch_index_select_dim0_backward",
        dict(BS, grad_output=X12[:10], indices=arr(0, 3, 0, 0)),
        IndexError,
        ("indices[1] = 3",),
    ),
]


# -- optional differential tier: fbgemm_gpu's CPU operators -------------------------------------------
def _fb_dtype_ok(a):
    """fbgemm's CPU kernels take float16/32/64 and int64 values (not int32)."""
    return np.asarray(a).dtype != I32


def _group_domain(args):
    """int64 indices (fbgemm takes one index dtype per group call) and no int32 values."""
    if not all(_fb_dtype_ok(a) for a in args["input_group"]):
        return None
    return dict(args, indices_group=[np.asarray(i).astype(I64) for i in args["indices_group"]])


def _batch_domain(args):
    """fbgemm 1.8.0 rejects tables with no rows, no columns or no selections (its checks say
    'must be the same' / 'greater than zero'), and T = 0."""
    num, rows, cols = args["input_num_indices"], args["input_rows"], args["input_columns"]
    if not num or min(num + rows + cols) == 0 or not _fb_dtype_ok(args.get("inputs", args.get("grad_output"))):
        return None
    return args


def _batch_call(fb, a):
    return fb.batch_index_select_dim0(
        tensor(a["inputs"]),
        tensor(a["indices"]),
        a["input_num_indices"],
        a["input_rows"],
        a["input_columns"],
        a["permute_output_dim_0_1"],
    )


def _batch_backward_domain(args):
    """float32 and float64 gradients (fbgemm's float16 backward rounds after every addition)."""
    args = _batch_domain(args)
    if args is None or np.asarray(args["grad_output"]).dtype == np.float16:
        return None
    return args


def _batch_backward_call(fb, a):
    import torch

    grad = tensor(a["grad_output"])
    x = torch.zeros(sum(r * c for r, c in zip(a["input_rows"], a["input_columns"])), dtype=grad.dtype)
    x.requires_grad_()
    out = fb.batch_index_select_dim0(
        x,
        tensor(a["indices"]),
        a["input_num_indices"],
        a["input_rows"],
        a["input_columns"],
        a["permute_output_dim_0_1"],
    )
    out.backward(grad)
    return x.grad


def _jagged_select_call(fb, a):
    rows = a["num_dense_output_rows"]
    extra = () if rows is None else (rows,)
    return fb.jagged_index_select_2d_forward_v2(
        tensor(a["values"]), tensor(a["indices"]), tensor(a["input_offsets"]), tensor(a["output_offsets"]), *extra
    )


FBGEMM = [
    Peer(
        "jagged_index_select_2d",
        _jagged_select_call,
        strategy=jagged_select_args(fb=True),
        examples=60,
    ),
    Peer(
        "group_index_select_dim0",
        lambda fb, a: fb.group_index_select_dim0(
            [tensor(x) for x in a["input_group"]], [tensor(i) for i in a["indices_group"]]
        ),
        _group_domain,
        examples=40,
    ),
    Peer("batch_index_select_dim0", _batch_call, _batch_domain, strategy=batch_args(positive=True), examples=40),
    Peer(
        "batch_index_select_dim0_backward",
        _batch_backward_call,
        _batch_backward_domain,
        same="values",
        strategy=batch_backward_args(positive=True),
        examples=40,
    ),
]
