"""The kjt family's test tables (no torch): see tests/tables/__init__.py."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import embnum
from harness import Peer, tensor
from strategies import float_dtypes, index_dtypes, maybe_strided, value_dtypes

FAMILY = [op.name for op in embnum.ops("kjt")]
I32, I64 = np.int32, np.int64


# -- building blocks -------------------------------------------------------------
def _shape(draw, small):
    """(T, B): tiny for the simulator; on the host up to T = 50 and B = 4096."""
    if small:
        return draw(st.integers(1, 3)), draw(st.integers(0, 4))
    T = draw(st.one_of(st.integers(1, 4), st.integers(1, 50)))
    B = draw(st.one_of(st.integers(0, 6), st.sampled_from([0, 1, 64, 4096])))
    if T * B > 40_000:  # big batches: a few keys at a time keep the oracle quick
        T = draw(st.integers(1, 10))
    return T, B


def _rng(draw):
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


def _lengths(draw, rng, n, small):
    mean = draw(st.sampled_from([0, 0.5, 2] if small else [0, 0.5, 2, 6]))
    lens = rng.poisson(mean, n) if n else np.zeros(0, np.int64)
    return lens.astype(draw(index_dtypes))


def _values(draw, rng, dtype, n):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        v = rng.standard_normal(n).astype(dtype)
        if n and draw(st.booleans()):
            v[rng.integers(0, n)] = draw(st.sampled_from([np.nan, np.inf, -0.0]))
        return v
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def _maybe(draw, x):
    return x if draw(st.booleans()) else None


def _segment_permute(draw, rng, n, small):
    kind = draw(st.sampled_from(["perm", "repeat", "drop", "empty"]))
    if n == 0 or kind == "empty":
        return np.zeros(0, draw(index_dtypes))
    if kind == "perm":
        p = rng.permutation(n)
    else:
        m = draw(st.integers(1, 2 * n if not small else min(2 * n, 6)))
        p = rng.integers(0, n, m) if kind == "repeat" else rng.permutation(n)[: max(1, n // 2)]
    return p.astype(draw(index_dtypes))


# -- strategies: one per op ---------------------------------------------------------
@st.composite
def permute_2d_args(draw, small=False):
    rng = _rng(draw)
    T, B = _shape(draw, small)
    T = draw(st.sampled_from([T, T, 0])) if not small else T
    lengths = _lengths(draw, rng, T * B, small).reshape(T, B)
    N = int(lengths.sum())
    values = _values(draw, rng, draw(value_dtypes), N)
    weights = _maybe(draw, _values(draw, rng, draw(float_dtypes), N))
    permute = _segment_permute(draw, rng, T, small)
    hint = _maybe(draw, int(lengths[permute.astype(np.int64)].sum()))
    return dict(
        permute=draw(maybe_strided(permute)),
        lengths=draw(maybe_strided(lengths)),
        values=draw(maybe_strided(values)),
        weights=weights,
        permuted_lengths_sum=hint,
    )


@st.composite
def permute_1d_args(draw, small=False):
    args = draw(permute_2d_args(small))
    lengths = np.ascontiguousarray(args["lengths"]).reshape(-1)
    rng = _rng(draw)
    permute = _segment_permute(draw, rng, lengths.shape[0], small)
    hint = _maybe(draw, int(lengths[permute.astype(np.int64)].sum()))
    return dict(args, permute=permute, lengths=lengths, permuted_lengths_sum=hint)


def _ids(draw, rng, n, dtype, reach):
    """Ids in range, past ``reach`` (= block_size * my_size), negative and extreme."""
    info = np.iinfo(dtype)
    ids = rng.integers(0, max(1, 2 * reach), n).astype(dtype)
    if n and draw(st.booleans()):
        k = min(n, draw(st.integers(1, 4)))
        extremes = np.array([-1, -2, info.min, info.max, info.max - 1, reach, max(reach - 1, 0)], dtype=np.int64)
        ids[rng.integers(0, n, k)] = rng.choice(extremes, k).astype(dtype)
    return ids


@st.composite
def bucketize_args(draw, small=False):
    rng = _rng(draw)
    T, B = _shape(draw, small)
    my_size = draw(st.integers(1, 8 if not small else 4))
    vbe = draw(st.booleans())
    batch = rng.integers(0, B + 1, T) if vbe else np.full(T, B)
    n_bags = int(batch.sum())
    lengths = _lengths(draw, rng, n_bags, small)
    N = int(lengths.sum())
    idx_dtype = draw(index_dtypes)
    G = np.full(T, my_size, np.int64)
    total_num_blocks = None
    if draw(st.booleans()):
        G = my_size * rng.integers(1, 4, T)
        total_num_blocks = G.astype(draw(index_dtypes))
    bs = rng.integers(0, draw(st.sampled_from([1, 5, 30])), T)
    bs[rng.random(T) < 0.1] = 0
    indices = _ids(draw, rng, N, idx_dtype, int(bs.max() * my_size) if T else 1)
    pos = None
    if draw(st.integers(0, 3)) == 0:
        pos = []
        for _ in range(T):
            inner = np.sort(rng.integers(0, draw(st.sampled_from([3, 20, 60])), my_size))
            inner[0] = 0
            pos.append(np.append(inner, inner[-1] + rng.integers(0, 10)).astype(draw(index_dtypes)))
    keep_per = None
    if draw(st.integers(0, 3)) == 0:
        keep_per = rng.random(T) < 0.5
    weights = _maybe(draw, _values(draw, rng, draw(float_dtypes), N))
    return dict(
        lengths=draw(maybe_strided(lengths)),
        indices=draw(maybe_strided(indices)),
        bucketize_pos=draw(st.booleans()),
        sequence=draw(st.booleans()),
        block_sizes=bs.astype(draw(index_dtypes)),
        my_size=my_size,
        weights=weights,
        batch_size_per_feature=batch.astype(draw(index_dtypes)) if vbe else None,
        max_B=draw(st.sampled_from([-1, B])),
        block_bucketize_pos=pos,
        keep_orig_idx=draw(st.booleans()),
        total_num_blocks=total_num_blocks,
        keep_orig_idx_per_feature=keep_per,
    )


@st.composite
def bucketize_2d_args(draw, small=False):
    """The drawn bucketize case with a row of 0-5 weights per id (float16/32/64, sometimes strided)."""
    args = draw(bucketize_args(small=small))
    n, dim = np.asarray(args["indices"]).shape[0], draw(st.sampled_from([0, 1, 2, 5]))
    rng = _rng(draw)
    w = _values(draw, rng, draw(float_dtypes), n * dim).reshape(n, dim)
    return dict(args, weights=draw(maybe_strided(w)), weights_dim=dim)


@st.composite
def bucketize_inference_args(draw, small=False):
    return dict(draw(bucketize_args(small=small)), return_bucket_mapping=draw(st.booleans()))


@st.composite
def index_select_args(draw, small=False):
    rng = _rng(draw)
    T, B = _shape(draw, small)
    B = max(B, 1)
    lengths = _lengths(draw, rng, T * B, small)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(draw(index_dtypes))
    N = int(lengths.sum())
    n = draw(st.integers(0, 6 if small else 3 * B))
    return dict(
        values=_values(draw, rng, draw(value_dtypes), N),
        lengths=lengths,
        offsets=offsets,
        indices=rng.integers(0, B, n).astype(draw(index_dtypes)),
        batch_size=B,
        weights=_maybe(draw, _values(draw, rng, draw(float_dtypes), N)),
        selected_lengths_sum=None,
    )


@st.composite
def expand_args(draw, small=False):
    rng = _rng(draw)
    T = draw(st.integers(0, 6 if small else 300))
    same = draw(st.booleans())
    sizes = np.full(T, draw(st.integers(0, 3))) if same else rng.poisson(2, T)
    permute = rng.integers(0, T, T) if (same and T) else rng.permutation(T)
    inp = np.concatenate([[0], np.cumsum(sizes)]).astype(draw(index_dtypes))
    outp = np.concatenate([[0], np.cumsum(sizes[permute])]).astype(draw(index_dtypes))
    return dict(
        permute=permute.astype(draw(index_dtypes)), input_offset=inp, output_offset=outp, output_size=int(outp[-1])
    )


@st.composite
def invert_args(draw, small=False):
    n = draw(st.integers(0, 10 if small else 5000))
    return dict(permute=draw(maybe_strided(_rng(draw).permutation(n).astype(draw(index_dtypes)))))


@st.composite
def unique_args(draw, small=False):
    rng = _rng(draw)
    T, B = _shape(draw, small)
    cuts = np.sort(rng.integers(0, T + 1, T - 1)) if draw(st.booleans()) else np.arange(1, T)
    hso = np.concatenate([[0], cuts, [T]])  # T + 1 entries; equal neighbours are skipped
    tables = [(int(a), int(b)) for a, b in zip(hso[:-1], hso[1:]) if a < b]
    hsc = np.zeros(T + 1, np.int64)  # equal across a table; the table's size is added at its end
    size_of = np.zeros(T, np.int64)
    acc = 0
    for a, b in tables:
        H = int(rng.integers(1, draw(st.sampled_from([3, 50, 10_000]))))
        hsc[a:b] = acc
        acc += H
        hsc[b] = acc
        size_of[a:b] = H
    lengths = _lengths(draw, rng, T * B, small).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    feat = np.repeat(np.repeat(np.arange(T), B), lengths)
    dtype = draw(index_dtypes)
    ids = (rng.random(feat.shape[0]) * size_of[feat]).astype(np.int64)
    tail = feat >= tables[-1][0]
    if tail.any() and draw(st.booleans()):  # the last table's ids are unbounded above
        ids[tail] = rng.integers(0, np.iinfo(dtype).max, int(tail.sum()), endpoint=True)
    return dict(
        hash_size_cumsum=hsc.astype(draw(index_dtypes)),
        hash_size_offsets=hso.astype(draw(index_dtypes)),
        offsets=offsets.astype(draw(index_dtypes)),
        indices=ids.astype(dtype),
    )


STRATEGIES = {
    "permute_2d_sparse_data": permute_2d_args,
    "permute_1d_sparse_data": permute_1d_args,
    "block_bucketize_sparse_features": bucketize_args,
    "block_bucketize_sparse_features_2d_weights": bucketize_2d_args,
    "block_bucketize_sparse_features_inference": bucketize_inference_args,
    "keyed_jagged_index_select_dim1": index_select_args,
    "expand_into_jagged_permute": expand_args,
    "invert_permute": invert_args,
    "jagged_unique_indices": unique_args,
}


# -- the spec's worked examples (fbgemm's numbers), on every backend -----------------
def arr(*xs, dtype=I64):
    return np.array(xs, dtype=dtype)


W9 = (np.arange(9) + 0.5).astype(np.float32)
W10 = (np.arange(10) + 0.5).astype(np.float32)
L2D = np.array([[2, 0, 1], [1, 3, 0], [0, 1, 2]], I32)
V10 = arr(10, 11, 12, 20, 21, 22, 23, 30, 31, 32)
BL, BI = arr(2, 0, 3, 1, 2, 1, dtype=I32), arr(5, 1, 9, 4, 13, 7, 20, 3, 6)
BB = dict(lengths=BL, indices=BI, bucketize_pos=False, sequence=False, block_sizes=arr(4, 5), my_size=3)
WORKED = [
    (
        "permute_2d_sparse_data",
        dict(permute=arr(2, 0, 1, dtype=I32), lengths=L2D, values=V10, weights=W10),
        (
            [[0, 1, 2], [2, 0, 1], [1, 3, 0]],
            [30, 31, 32, 10, 11, 12, 20, 21, 22, 23],
            [7.5, 8.5, 9.5, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5],
        ),
    ),
    (
        "permute_2d_sparse_data",
        dict(permute=arr(1, 1), lengths=L2D, values=V10, weights=W10),
        ([[1, 3, 0], [1, 3, 0]], [20, 21, 22, 23, 20, 21, 22, 23], [3.5, 4.5, 5.5, 6.5, 3.5, 4.5, 5.5, 6.5]),
    ),
    (
        "permute_1d_sparse_data",
        dict(permute=arr(8, 0, 4, 4), lengths=arr(2, 0, 1, 1, 3, 0, 0, 1, 2), values=V10, weights=W10),
        ([2, 2, 3, 3], [31, 32, 10, 11, 21, 22, 23, 21, 22, 23], [8.5, 9.5, 0.5, 1.5, 4.5, 5.5, 6.5, 4.5, 5.5, 6.5]),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, bucketize_pos=True, sequence=True, weights=W9),
        (
            [1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0],
            [1, 3, 1, 0, 4, 2, 1, 1, 6],
            [1.5, 7.5, 0.5, 3.5, 4.5, 5.5, 8.5, 2.5, 6.5],
            [1, 1, 0, 1, 2, 0, 0, 0, 0],
            [2, 0, 7, 3, 4, 5, 8, 1, 6],
        ),
    ),
    (  # the case above with a row of two weights per id: rows move as the 1-D weights do
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, bucketize_pos=True, weights=np.stack([W9, -W9], axis=1), weights_dim=2),
        (
            [1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0],
            [1, 3, 1, 0, 4, 2, 1, 1, 6],
            [[w, -w] for w in [1.5, 7.5, 0.5, 3.5, 4.5, 5.5, 8.5, 2.5, 6.5]],
            [1, 1, 0, 1, 2, 0, 0, 0, 0],
            None,
        ),
    ),
    (  # and the bucket of every id, in input order (fbgemm's numbers)
        "block_bucketize_sparse_features_inference",
        dict(BB, sequence=True, return_bucket_mapping=True),
        (
            [1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0],
            [1, 3, 1, 0, 4, 2, 1, 1, 6],
            None,
            None,
            [2, 0, 7, 3, 4, 5, 8, 1, 6],
            [1, 0, 2, 1, 1, 1, 2, 0, 1],
        ),
    ),
    (
        "block_bucketize_sparse_features_inference",
        dict(BB, keep_orig_idx=True),
        ([1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0], [1, 3, 5, 4, 13, 7, 6, 9, 20], None, None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, keep_orig_idx=True),
        ([1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0], [1, 3, 5, 4, 13, 7, 6, 9, 20], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, keep_orig_idx_per_feature=np.array([True, False])),
        ([1, 0, 0, 0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 0, 1, 0], [1, 3, 5, 4, 13, 2, 1, 9, 6], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_sizes=arr(0, 0)),
        ([0, 0, 1, 0, 1, 1, 1, 0, 2, 1, 0, 0, 1, 0, 0, 0, 1, 0], [3, 1, 2, 0, 1, 4, 2, 1, 6], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(3), indices=arr(-1, -8, 2), block_sizes=arr(4)),
        ([2, 0, 1], [6148914691236517205, 2, 6148914691236517202], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(3), indices=arr(-1, -8, 2, dtype=I32), block_sizes=arr(4)),
        ([2, 0, 1], [1431655765, 2, 1431655762], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(2, 1, 1, 2, 0, 2), indices=arr(1, 8, 5, 6, 7, 8, 8, 4), block_sizes=arr(5, 10, 8))
        | dict(bucketize_pos=True, sequence=True, my_size=2, batch_size_per_feature=arr(3, 1, 2)),
        (
            [1, 0, 0, 2, 0, 1, 1, 1, 1, 0, 0, 1],
            [1, 7, 8, 4, 3, 0, 1, 0],
            None,
            [0, 0, 1, 1, 1, 0, 0, 0],
            [0, 4, 5, 6, 1, 2, 7, 3],
        ),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(0, 3, 2, 0, 1, 5), indices=arr(1, 2, 10, 4, 16, 6, 7, 18, 19, 10, 0))
        | dict(block_sizes=arr(2, 3, 4), total_num_blocks=arr(6, 6, 6)),
        ([0, 2, 1, 0, 1, 2, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 2], [1, 2, 4, 6, 7, 0, 2, 2, 4, 2, 3], None, None, None),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(2, 1, 1), indices=arr(1, 9, 20, 3), sequence=True, block_sizes=arr(5), my_size=2)
        | dict(block_bucketize_pos=[arr(0, 2, 8)]),
        ([1, 1, 0, 1, 0, 1], [1, 10, 4, 1], None, None, [0, 2, 1, 3]),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(4), indices=arr(1, 3, 4, 9), block_sizes=arr(0), my_size=2)
        | dict(block_bucketize_pos=[arr(0, 2, 8)], total_num_blocks=arr(4)),
        ([1, 3], [1, 0, 0, 2], None, None, None),
    ),
    (
        "keyed_jagged_index_select_dim1",
        dict(
            values=np.arange(0, 100, 10),
            lengths=arr(1, 2, 0, 3, 2, 0, 1, 1),
            offsets=arr(0, 1, 3, 3, 6, 8, 8, 9, 10),
            indices=arr(3, 0, 3),
            batch_size=4,
        ),
        [[30, 40, 50, 0, 30, 40, 50, 90, 60, 70, 90], [3, 1, 3, 1, 2, 1]],
    ),
    (
        "expand_into_jagged_permute",
        dict(permute=arr(2, 0, 1), input_offset=arr(0, 3, 5, 9), output_offset=arr(0, 4, 7, 9), output_size=9),
        [5, 6, 7, 8, 0, 1, 2, 3, 4],
    ),
    ("invert_permute", dict(permute=arr(2, 0, 3, 1)), [1, 3, 0, 2]),
    (
        "jagged_unique_indices",
        dict(
            hash_size_cumsum=arr(0, 0, 10, 15),
            hash_size_offsets=arr(0, 2, 2, 3),
            offsets=arr(0, 2, 3, 5, 6, 8, 9),
            indices=arr(3, 7, 7, 1, 3, 9, 0, 4, 0),
        ),
        ([1, 1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5, 6], [1, 3, 7, 9, 0, 4], [1, 2, 2, 0, 1, 3, 4, 5, 4]),
    ),
]


_WR = np.random.default_rng(7)
_WL = _WR.integers(0, 4, 300)
_WL[[3, 150, 299]] = [40, 70, 33]  # bags longer than several passes of a lane group
WIDE_N = int(_WL.sum())
WIDE = dict(lengths=_WL.astype(I32), indices=_WR.integers(-3, 60, WIDE_N), block_sizes=arr(4, 9, 2), my_size=5)
WIDE |= dict(bucketize_pos=False, sequence=False)
WIDE_ROWS = _WR.standard_normal((WIDE_N, 2)).astype(np.float64)
EDGES = {
    "bucketize T=0": (
        "block_bucketize_sparse_features",
        dict(BB, lengths=arr(), indices=arr(), block_sizes=arr(), sequence=True),
    ),
    "bucketize B=0": ("block_bucketize_sparse_features", dict(BB, lengths=arr(), indices=arr(), bucketize_pos=True)),
    "bucketize 2d weights B=0": (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, lengths=arr(), indices=arr(), weights=np.zeros((0, 3), np.float32), weights_dim=3),
    ),
    "bucketize 2d weights of width 0": (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, sequence=True, weights=np.zeros((9, 0), np.float16), weights_dim=0),
    ),
    "bucketize mapping B=0": (
        "block_bucketize_sparse_features_inference",
        dict(BB, lengths=arr(), indices=arr(), return_bucket_mapping=True),
    ),
    "bucketize mapping no ids": (
        "block_bucketize_sparse_features_inference",
        dict(BB, lengths=arr(0, 0, 0, 0, 0, 0), indices=arr(), return_bucket_mapping=True),
    ),
    "bucketize my_size=1": (
        "block_bucketize_sparse_features",
        dict(BB, my_size=1, indices=arr(5, -1, 9, 2**62, -(2**63), 3, 20, 3, 6)),
    ),
    "bucketize my_size=1 int32 extremes": (
        "block_bucketize_sparse_features",
        dict(
            BB,
            my_size=1,
            indices=arr(5, -1, 9, 2**31 - 1, -(2**31), 3, 20, 3, 6, dtype=I32),
            total_num_blocks=arr(1, 1),
        ),
    ),
    "bucketize largest block size": (
        "block_bucketize_sparse_features",
        dict(BB, block_sizes=arr((2**31 - 1) // 3, 1), indices=BI.astype(I32)),
    ),
    "bucketize boundaries wrap at 64 bits": (
        "block_bucketize_sparse_features",
        dict(
            BB,
            lengths=arr(4),
            indices=arr(-1, -5, 7, 2**62),
            block_sizes=arr(0),
            block_bucketize_pos=[arr(0, 2**40, 2**41, 2**62)],
        ),
    ),
    "bucketize many bags, long and short (more than one pass of the grid)": (
        "block_bucketize_sparse_features",
        dict(WIDE, bucketize_pos=True, sequence=True, weights=np.linspace(-1, 1, WIDE_N).astype(np.float16)),
    ),
    "bucketize many bags with boundaries and rows of weights": (
        "block_bucketize_sparse_features_2d_weights",
        dict(WIDE, block_bucketize_pos=[arr(0, 3, 9, 20, 41, 60)] * 3, weights=WIDE_ROWS, weights_dim=2),
    ),
    "bucketize my_size above 256 (a wide bucket index)": (
        "block_bucketize_sparse_features_inference",
        dict(WIDE, indices=WIDE["indices"] * 97, my_size=300, sequence=True, return_bucket_mapping=True),
    ),
    "permute_2d T=0": ("permute_2d_sparse_data", dict(permute=arr(), lengths=np.zeros((0, 3), I64), values=arr())),
    "permute_2d B=0": (
        "permute_2d_sparse_data",
        dict(permute=arr(1, 0, 1), lengths=np.zeros((2, 0), I32), values=np.zeros(0, np.float16)),
    ),
    "select n=0": (
        "keyed_jagged_index_select_dim1",
        dict(values=arr(1, 2), lengths=arr(1, 1), offsets=arr(0, 1, 2), indices=arr(), batch_size=2),
    ),
    "expand T=0": (
        "expand_into_jagged_permute",
        dict(permute=arr(), input_offset=arr(0), output_offset=arr(0), output_size=0),
    ),
    "invert n=0": ("invert_permute", dict(permute=arr(dtype=I32))),
    "unique B=0": (
        "jagged_unique_indices",
        dict(hash_size_cumsum=arr(0, 4), hash_size_offsets=arr(0, 1), offsets=arr(0), indices=arr()),
    ),
}


# -- bad input -----------------------------------------------------------------------
P2 = dict(permute=arr(2, 0, 1), lengths=L2D, values=V10)
P1 = dict(permute=arr(1, 0), lengths=arr(2, 3), values=arr(1, 2, 3, 4, 5))
KS = dict(values=arr(1, 2, 3), lengths=arr(1, 2), offsets=arr(0, 1, 3), indices=arr(1, 0), batch_size=2)
EX = dict(permute=arr(1, 0), input_offset=arr(0, 2, 3), output_offset=arr(0, 1, 3), output_size=3)
UQ = dict(
    hash_size_cumsum=arr(0, 0, 10, 15),
    hash_size_offsets=arr(0, 2, 2, 3),
    offsets=arr(0, 2, 3, 5, 6, 8, 9),
    indices=arr(3, 7, 7, 1, 3, 9, 0, 4, 0),
)
BAD = [
    ("permute_2d_sparse_data", dict(P2, permute=arr(0, 3)), IndexError, ("permute[1] = 3",)),
    ("permute_2d_sparse_data", dict(P2, permute=arr(-1)), IndexError, ("permute[0] = -1",)),
    ("permute_2d_sparse_data", dict(P2, lengths=L2D.reshape(-1)), ValueError, ("lengths", "2-D")),
    ("permute_2d_sparse_data", dict(P2, values=V10[:-1]), ValueError, ("values", "10")),
    ("permute_2d_sparse_data", dict(P2, lengths=-L2D), ValueError, ("lengths", ">= 0")),
    ("permute_2d_sparse_data", dict(P2, weights=W9), ValueError, ("weights",)),
    ("permute_2d_sparse_data", dict(P2, weights=V10), TypeError, ("weights", "int64")),
    ("permute_2d_sparse_data", dict(P2, values=V10.astype(np.uint8)), TypeError, ("values", "uint8")),
    ("permute_2d_sparse_data", dict(P2, permute=arr(0, dtype=np.int16)), TypeError, ("permute", "int16")),
    ("permute_2d_sparse_data", dict(P2, permuted_lengths_sum=9), ValueError, ("permuted_lengths_sum = 9", "10")),
    ("permute_2d_sparse_data", dict(P2, permuted_lengths_sum=-1), ValueError, ("permuted_lengths_sum",)),
    ("permute_2d_sparse_data", dict(P2, values=V10.reshape(2, 5)), ValueError, ("values", "1-D")),
    ("permute_1d_sparse_data", dict(P1, lengths=arr(2, -1)), ValueError, ("lengths", "entry 1 is -1")),
    ("permute_1d_sparse_data", dict(P1, permute=arr(2)), IndexError, ("permute[0] = 2",)),
    ("permute_1d_sparse_data", dict(P1, lengths=arr(2, 3).reshape(1, 2)), ValueError, ("lengths", "1-D")),
    ("permute_1d_sparse_data", dict(P1, values=arr(1, 2, 3, 4, 5, 6)), ValueError, ("values", "6", "5")),
    ("block_bucketize_sparse_features", dict(BB, indices=BI[:-1]), ValueError, ("indices", "8", "9")),
    (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, weights=np.zeros((9, 2), np.float32), weights_dim=3),
        ValueError,
        ("weights has 2 columns", "weights_dim = 3"),
    ),
    (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, weights=np.zeros((8, 2), np.float32), weights_dim=2),
        ValueError,
        ("weights has 8 rows", "9"),
    ),
    ("block_bucketize_sparse_features_2d_weights", dict(BB, weights=W9, weights_dim=1), ValueError, ("weights", "2-D")),
    (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, weights=np.zeros((9, 1), np.int64), weights_dim=1),
        TypeError,
        ("weights", "int64"),
    ),
    (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, weights=np.zeros((9, 1), np.float32), weights_dim=-1),
        ValueError,
        ("weights_dim",),
    ),
    (
        "block_bucketize_sparse_features_2d_weights",
        dict(BB, weights=np.zeros((9, 1), np.float32), my_size=0),
        ValueError,
        ("my_size",),
    ),
    (
        "block_bucketize_sparse_features_inference",
        dict(BB, return_bucket_mapping=1),
        TypeError,
        ("return_bucket_mapping",),
    ),
    ("block_bucketize_sparse_features_inference", dict(BB, block_sizes=arr(4, -5)), ValueError, ("block_sizes", "-5")),
    ("block_bucketize_sparse_features_inference", dict(BB, indices=BI[:-1]), ValueError, ("indices", "8", "9")),
    ("block_bucketize_sparse_features", dict(BB, lengths=arr(2, 0, 3, 1, 2, -1, 2)), ValueError, ("lengths", "-1")),
    ("block_bucketize_sparse_features", dict(BB, block_sizes=arr(4, 5, 6, 7)), ValueError, ("len(lengths) = 6", "4")),
    ("block_bucketize_sparse_features", dict(BB, block_sizes=arr(4, -5)), ValueError, ("block_sizes", "-5")),
    ("block_bucketize_sparse_features", dict(BB, block_sizes=arr(2**62, 5)), ValueError, ("block_sizes[0]",)),
    ("block_bucketize_sparse_features", dict(BB, my_size=0), ValueError, ("my_size",)),
    ("block_bucketize_sparse_features", dict(BB, my_size=2.0), TypeError, ("my_size",)),
    ("block_bucketize_sparse_features", dict(BB, max_B=None), TypeError, ("max_B",)),
    ("block_bucketize_sparse_features", dict(BB, weights=W10), ValueError, ("weights",)),
    ("block_bucketize_sparse_features", dict(BB, weights=BI), TypeError, ("weights",)),
    ("block_bucketize_sparse_features", dict(BB, indices=BI.astype(np.uint32)), TypeError, ("indices", "uint32")),
    (
        "block_bucketize_sparse_features",
        dict(BB, batch_size_per_feature=arr(3, 4)),
        ValueError,
        ("batch_size_per_feature", "7"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, batch_size_per_feature=arr(7, -1)),
        ValueError,
        ("batch_size_per_feature", "-1"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, batch_size_per_feature=arr(6)),
        ValueError,
        ("batch_size_per_feature", "2"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, total_num_blocks=arr(3, 4)),
        ValueError,
        ("total_num_blocks[1] = 4", "multiple"),
    ),
    ("block_bucketize_sparse_features", dict(BB, total_num_blocks=arr(3, 0)), ValueError, ("total_num_blocks[1] = 0",)),
    (
        "block_bucketize_sparse_features",
        dict(BB, total_num_blocks=arr(3)),
        ValueError,
        ("total_num_blocks", "2 entries"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_bucketize_pos=[arr(0, 1, 2, 3)]),
        ValueError,
        ("block_bucketize_pos", "2 arrays"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_bucketize_pos=[arr(0, 1, 2, 3), arr(0, 1, 2)]),
        ValueError,
        ("block_bucketize_pos[1]", "4 entries"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_bucketize_pos=[arr(1, 2, 3, 4)] * 2),
        ValueError,
        ("block_bucketize_pos[0][0]",),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_bucketize_pos=[arr(0, 3, 2, 4)] * 2),
        ValueError,
        ("block_bucketize_pos[0]", "non-decreasing"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, block_bucketize_pos=arr(0, 1, 2, 3)),
        ValueError,
        ("block_bucketize_pos", "list"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, keep_orig_idx_per_feature=arr(1, 0)),
        TypeError,
        ("keep_orig_idx_per_feature", "bool"),
    ),
    (
        "block_bucketize_sparse_features",
        dict(BB, keep_orig_idx_per_feature=np.array([True])),
        ValueError,
        ("keep_orig_idx_per_feature",),
    ),
    ("block_bucketize_sparse_features", dict(BB, block_sizes=arr()), ValueError, ("block_sizes", "T = 0")),
    ("keyed_jagged_index_select_dim1", dict(KS, indices=arr(2)), IndexError, ("indices[0] = 2",)),
    ("keyed_jagged_index_select_dim1", dict(KS, offsets=arr(0, 2, 3)), ValueError, ("offsets",)),
    ("keyed_jagged_index_select_dim1", dict(KS, offsets=arr(0, 1)), ValueError, ("offsets", "3 entries")),
    ("keyed_jagged_index_select_dim1", dict(KS, batch_size=0), ValueError, ("batch_size",)),
    ("keyed_jagged_index_select_dim1", dict(KS, batch_size=3), ValueError, ("batch_size = 3",)),
    ("keyed_jagged_index_select_dim1", dict(KS, values=arr(1, 2)), ValueError, ("values",)),
    ("keyed_jagged_index_select_dim1", dict(KS, selected_lengths_sum=2), ValueError, ("selected_lengths_sum = 2",)),
    ("keyed_jagged_index_select_dim1", dict(KS, lengths=arr(-1, 4), offsets=arr(0, -1, 3)), ValueError, ("lengths",)),
    ("expand_into_jagged_permute", dict(EX, output_size=4), ValueError, ("output_size = 4",)),
    ("expand_into_jagged_permute", dict(EX, permute=arr(1, 2)), IndexError, ("permute[1] = 2",)),
    (
        "expand_into_jagged_permute",
        dict(EX, output_offset=arr(0, 2, 3)),
        ValueError,
        ("output_offset segment 0", "size 2"),
    ),
    ("expand_into_jagged_permute", dict(EX, input_offset=arr(1, 2, 3)), ValueError, ("input_offset[0]",)),
    ("expand_into_jagged_permute", dict(EX, input_offset=arr(0, 3)), ValueError, ("input_offset", "3 entries")),
    ("invert_permute", dict(permute=arr(0, 0, 1)), ValueError, ("permute", "0 appears 2 times")),
    ("invert_permute", dict(permute=arr(0, 3, 1)), IndexError, ("permute[1] = 3",)),
    ("invert_permute", dict(permute=arr(0, 1).reshape(1, 2)), ValueError, ("permute", "1-D")),
    ("jagged_unique_indices", dict(UQ, indices=arr(3, 7, 7, 1, 3, 10, 0, 4, 0)), IndexError, ("indices", "10")),
    ("jagged_unique_indices", dict(UQ, indices=arr(3, 7, -7, 1, 3, 9, 0, 4, 0)), IndexError, ("indices[2] = -7",)),
    (
        "jagged_unique_indices",
        dict(UQ, hash_size_cumsum=arr(0, 2, 10, 15)),
        ValueError,
        ("hash_size_cumsum", "one table"),
    ),
    ("jagged_unique_indices", dict(UQ, hash_size_offsets=arr(0, 2, 2, 2)), ValueError, ("hash_size_offsets[-1]",)),
    ("jagged_unique_indices", dict(UQ, offsets=arr(0, 2, 3, 5, 6, 9)), ValueError, ("len(offsets) - 1 = 5",)),
    ("jagged_unique_indices", dict(UQ, offsets=arr(0, 2, 3, 5, 6, 8, 8)), ValueError, ("offsets[-1] = 8",)),
    ("jagged_unique_indices", dict(UQ, hash_size_cumsum=arr(0)), ValueError, ("hash_size_cumsum",)),
]


def _permute_domain(args):
    """fbgemm's permutes take no float64 values, no float16 weights (1D) and only int32 permutes."""
    args = dict(args, permute=np.ascontiguousarray(args["permute"]).astype(I32))
    if args["values"].dtype == np.float64:
        args["values"] = args["values"].astype(np.float32)
    if args["weights"] is not None and args["weights"].dtype == np.float16:
        args["weights"] = args["weights"].astype(np.float32)
    return args


def _permute_peer(fb_name):
    def call(fb, a):
        M = int(np.asarray(a["lengths"])[a["permute"].astype(I64)].sum())
        return getattr(fb, fb_name)(
            tensor(a["permute"]), tensor(a["lengths"]), tensor(a["values"]), tensor(a["weights"]), M
        )

    return call


def _bucketize_domain(args):
    """Block sizes >= 1 (fbgemm 1.8.0 divides by zero for T == 0 and corrupts the heap for a block
    size of 0; block size 0 is covered by the oracle and the worked examples); not both
    ``block_bucketize_pos`` and ``total_num_blocks`` (fbgemm skips the multiple-of check
    there); float32 weights (fbgemm rejects float16 weights here)."""
    if args["block_sizes"].size == 0 or (
        args["block_bucketize_pos"] is not None and args["total_num_blocks"] is not None
    ):
        return None
    args = dict(args, block_sizes=np.maximum(args["block_sizes"], 1), lengths=np.ascontiguousarray(args["lengths"]))
    if args["weights"] is not None and args["weights"].dtype == np.float16:
        args["weights"] = args["weights"].astype(np.float32)
    return args


def _bucketize_peer(fb, a):
    idt, ldt = a["indices"].dtype, a["lengths"].dtype
    batch, pos, total = a["batch_size_per_feature"], a["block_bucketize_pos"], a["total_num_blocks"]
    return fb.block_bucketize_sparse_features(
        tensor(a["lengths"]),
        tensor(a["indices"]),
        a["bucketize_pos"],
        a["sequence"],
        tensor(a["block_sizes"].astype(idt)),
        a["my_size"],
        tensor(a["weights"]),
        None if batch is None else tensor(batch.astype(ldt)),
        a["max_B"],
        None if pos is None else [tensor(p.astype(idt)) for p in pos],
        a["keep_orig_idx"],
        None if total is None else tensor(total.astype(idt)),
        tensor(a["keep_orig_idx_per_feature"]),
    )


def _expand_domain(args):
    """int64 permute and offsets; a non-empty permute (fbgemm raises for an empty one, docs/families/kjt.md)."""
    if args["permute"].size == 0:
        return None
    return dict(args, **{k: args[k].astype(I64) for k in ("permute", "input_offset", "output_offset")})


def _bucketize_2d_peer(fb, a):
    idt, ldt = a["indices"].dtype, a["lengths"].dtype
    batch, pos, total = a["batch_size_per_feature"], a["block_bucketize_pos"], a["total_num_blocks"]
    return fb.block_bucketize_sparse_features_2d_weights(
        tensor(a["lengths"]),
        tensor(a["indices"]),
        a["bucketize_pos"],
        a["sequence"],
        tensor(a["block_sizes"].astype(idt)),
        a["my_size"],
        tensor(a["weights"]),
        a["weights_dim"],
        None if batch is None else tensor(batch.astype(ldt)),
        a["max_B"],
        None if pos is None else [tensor(p.astype(idt)) for p in pos],
        a["keep_orig_idx"],
        None if total is None else tensor(total.astype(idt)),
        tensor(a["keep_orig_idx_per_feature"]),
    )


def _bucketize_inference_domain(args):
    """The 1-D domain, with ``sequence=True`` where the mapping is asked for (fbgemm 1.8.0 fills
    ``bucket_mapping`` only then and returns uninitialised memory otherwise)."""
    args = _bucketize_domain(args)
    if args is not None and args["return_bucket_mapping"]:
        args = dict(args, sequence=True)
    return args


def _bucketize_inference_peer(fb, a):
    idt, ldt = a["indices"].dtype, a["lengths"].dtype
    batch, pos, total = a["batch_size_per_feature"], a["block_bucketize_pos"], a["total_num_blocks"]
    return fb.block_bucketize_sparse_features_inference(
        tensor(a["lengths"]),
        tensor(a["indices"]),
        a["bucketize_pos"],
        a["sequence"],
        tensor(a["block_sizes"].astype(idt)),
        a["my_size"],
        tensor(a["weights"]),
        None if batch is None else tensor(batch.astype(ldt)),
        a["max_B"],
        None if pos is None else [tensor(p.astype(idt)) for p in pos],
        a["return_bucket_mapping"],
        a["keep_orig_idx"],
        None if total is None else tensor(total.astype(idt)),
        tensor(a["keep_orig_idx_per_feature"]),
    )


FBGEMM = [
    Peer("permute_2d_sparse_data", _permute_peer("permute_2D_sparse_data"), _permute_domain, examples=30),
    Peer("block_bucketize_sparse_features_2d_weights", _bucketize_2d_peer, _bucketize_domain, examples=40),
    Peer(
        "block_bucketize_sparse_features_inference",
        _bucketize_inference_peer,
        _bucketize_inference_domain,
        examples=40,
    ),
    Peer("permute_1d_sparse_data", _permute_peer("permute_1D_sparse_data"), _permute_domain, examples=30),
    Peer("block_bucketize_sparse_features", _bucketize_peer, _bucketize_domain, examples=60),
    Peer(
        "expand_into_jagged_permute",
        lambda fb, a: fb.expand_into_jagged_permute(
            tensor(a["permute"]), tensor(a["input_offset"]), tensor(a["output_offset"]), a["output_size"]
        ),
        _expand_domain,
        examples=30,
    ),
    Peer("invert_permute", lambda fb, a: fb.invert_permute(tensor(a["permute"])), examples=30),
]
NO_FBGEMM_PEER = {
    "keyed_jagged_index_select_dim1": "fbgemm-gpu-cpu 1.8.0 registers no CPU kernel for it (CUDA and Meta only)",
    "jagged_unique_indices": "fbgemm-gpu-cpu 1.8.0 registers no CPU kernel for it (CUDA and Meta only)",
}
