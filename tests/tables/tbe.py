"""The tbe family's test tables (no torch): see tests/tables/__init__.py."""

import numpy as np
from hypothesis import strategies as st

import embnum
from embnum import TBEOptimizer, tbe_layout
from strategies import index_dtypes

DIMS = (1, 3, 4, 8, 64, 130)


def tbe_args(lay, weights, indices, offsets, **kw):
    """The TBE ops' keyword arguments for tables laid out as ``lay`` (a ``tbe_layout``)."""
    return dict(weights=weights, **lay.by_name(), indices=indices, offsets=offsets, **kw)


# dyadic values: sums and squares are exact in float32, so float32 kernels and the
# float64 oracle agree closely even where an optimizer divides by a small norm
DYADIC = st.integers(-8, 8).map(lambda k: k / 4)


def _arr(draw, n, dtype):
    """``n`` dyadic values (multiples of 1/4 in [-2, 2]); long arrays from a drawn seed."""
    if n <= 16:
        return np.array(draw(st.lists(DYADIC, min_size=n, max_size=n)), dtype=dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return (rng.integers(-8, 9, n) / 4).astype(dtype)


@st.composite
def tbe_batch(draw, *, pooling=None, psw=None, bad_ids=False, max_B=4, dims=DIMS):
    """A TBE call: 1-3 tables (tiny, so ids repeat heavily), 1-4 features (adjacent features
    may share a table), empty bags, B = 0, int32/int64 indices and offsets chosen apart."""
    n_tables = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 6), min_size=n_tables, max_size=n_tables))
    pooling = draw(st.sampled_from(["sum", "mean", "none"])) if pooling is None else pooling
    if pooling == "none":
        dim = [draw(st.sampled_from(dims))] * n_tables
    else:
        dim = draw(st.lists(st.sampled_from(dims), min_size=n_tables, max_size=n_tables))
    repeats = draw(st.lists(st.integers(1, 2), min_size=n_tables, max_size=n_tables))
    ftm = [i for i, r in enumerate(repeats) for _ in range(r)]
    lay = tbe_layout(rows, dim, ftm)
    T = len(ftm)
    B = draw(st.integers(0, max_B))
    lengths = np.array(draw(st.lists(st.integers(0, 5), min_size=T * B, max_size=T * B)), dtype=np.int64)
    lead = draw(st.sampled_from([0, 0, 0, 2]))
    offsets = lead + np.concatenate([[0], np.cumsum(lengths)])
    N = int(offsets[-1])
    E = embnum._tbe_bounds.rows_per_feature(lay.hash_size_cumsum)
    hot = draw(st.booleans())  # all lookups of a feature hit one row
    indices = np.zeros(N, dtype=np.int64)
    for t in range(T):
        a, e = int(offsets[t * B]), int(offsets[(t + 1) * B])
        k = int(E[t])
        indices[a:e] = (
            draw(st.integers(0, k - 1))
            if hot
            else draw(st.lists(st.integers(0, k - 1), min_size=e - a, max_size=e - a))
        )
    indices[:lead] = draw(st.integers(-5, 10**6))  # outside every bag: never read
    if bad_ids and N > lead:
        for _ in range(draw(st.integers(1, 3))):
            p = draw(st.integers(lead, N - 1))
            indices[p] = draw(st.sampled_from([-2, -(10**9), 10**6, int(E.max())]))
    wdt = draw(st.sampled_from([np.float32, np.float16]))
    args = dict(
        weights=_arr(draw, lay.num_weights, wdt),
        weights_offsets=lay.weights_offsets.astype(draw(index_dtypes)),
        D_offsets=lay.D_offsets.astype(draw(index_dtypes)),
        hash_size_cumsum=lay.hash_size_cumsum.astype(draw(index_dtypes)),
        indices=indices.astype(draw(index_dtypes)),
        offsets=offsets.astype(draw(index_dtypes)),
        pooling_mode=pooling,
    )
    if psw is None:
        psw = pooling == "sum" and draw(st.booleans())
    if psw:
        args["per_sample_weights"] = _arr(draw, N, np.float32)
    return args


@st.composite
def vbe_batch(draw, pooling=None, **kw):
    """A VBE call (``batch_size_per_feature_per_rank``): a drawn fixed-batch call whose feature
    ``t`` keeps its first ``B_t`` bags (0..B, drawn apart), split over 1-3 ranks at drawn cuts
    (ranks with no samples included)."""
    pooling = draw(st.sampled_from(["sum", "mean"])) if pooling is None else pooling
    args = draw(tbe_batch(pooling=pooling, **kw))
    T = args["weights_offsets"].shape[0]
    offs = args["offsets"].astype(np.int64)
    B = (offs.shape[0] - 1) // T
    R = draw(st.integers(1, 3))
    sizes, keep = [], []
    for t in range(T):
        Bt = draw(st.integers(0, B))
        cuts = sorted(draw(st.lists(st.integers(0, Bt), min_size=R - 1, max_size=R - 1)))
        sizes.append([b - a for a, b in zip([0, *cuts], [*cuts, Bt])])
        keep += [(int(offs[t * B + b]), int(offs[t * B + b + 1])) for b in range(Bt)]
    lead = int(offs[0])
    pos = np.concatenate([np.arange(lead)] + [np.arange(a, e) for a, e in keep]).astype(np.int64)
    lengths = [e - a for a, e in keep]
    new_offs = lead + np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    args["indices"] = args["indices"][pos]
    args["offsets"] = new_offs.astype(args["offsets"].dtype)
    if "per_sample_weights" in args:
        args["per_sample_weights"] = args["per_sample_weights"][pos]
    args["batch_size_per_feature_per_rank"] = draw(
        st.sampled_from([sizes, np.array(sizes, dtype=np.int64), np.array(sizes, dtype=np.int32)])
    )
    return args


def _grad_for(draw, args):
    fwd = embnum.tbe_forward(**args, bounds_check_mode="ignore", backend="ref")
    return _arr(draw, fwd.size, draw(st.sampled_from([np.float32, np.float16]))).reshape(fwd.shape)


@st.composite
def forward_args(draw):
    bad = draw(st.booleans())
    args = draw(st.one_of(tbe_batch(bad_ids=bad), vbe_batch(bad_ids=bad)))
    args["output_dtype"] = draw(st.sampled_from(["float32", "float16", np.float32]))
    args["bounds_check_mode"] = (
        draw(st.sampled_from(["warning", "ignore", 2])) if bad else draw(st.sampled_from(["fatal", "none", 1]))
    )
    return args


@st.composite
def backward_args(draw, pooling=None):
    bad = draw(st.booleans())
    fixed = tbe_batch(pooling=pooling, bad_ids=bad)
    args = draw(fixed if pooling == "none" else st.one_of(fixed, vbe_batch(pooling=pooling, bad_ids=bad)))
    args["grad_output"] = _grad_for(draw, args)
    args["bounds_check_mode"] = "ignore"
    return args


@st.composite
def sparse_args(draw):
    args = draw(backward_args())
    if draw(st.booleans()):  # fixed output sizes: a bound on the touched rows, sometimes too small
        args["max_rows"] = draw(st.integers(0, len(args["indices"]) + 2))
    return args


@st.composite
def psw_grad_args(draw):
    args = draw(backward_args(pooling="sum"))
    args.pop("pooling_mode")
    args.pop("per_sample_weights", None)
    return args


OPTIMIZERS = [
    TBEOptimizer("sgd", 0.1),
    TBEOptimizer("adagrad", 0.05, eps=1e-4),
    TBEOptimizer("rowwise_adagrad", 0.1),
    TBEOptimizer("rowwise_adagrad", 0.1, weight_decay=0.01, weight_decay_mode="l2"),
    TBEOptimizer("exact_row_wise_adagrad", 0.1, weight_decay=0.01, weight_decay_mode="decoupled", max_gradient=1.0),
    TBEOptimizer("adam", 0.01, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lamb", 0.01, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lamb", 0.05, max_gradient=1.0),
    TBEOptimizer("partial_rowwise_adam", 0.01, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("partial_row_wise_lamb", 0.01, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lars_sgd", 0.1, eta=0.5, momentum=0.9, weight_decay=0.01, weight_decay_mode="l2"),
    TBEOptimizer("lars_sgd", 0.1, eta=0.01, momentum=0.0),
    TBEOptimizer("rowwise_adagrad", 0.5, max_norm=1.0),
    TBEOptimizer("sgd", 0.5, max_norm=0.75),
]


def state_for(opt, weights, hash_size_cumsum, rng=None):
    rng = rng or np.random.default_rng(0)
    sizes = opt.state_sizes(weights.shape[0], int(hash_size_cumsum[-1]))
    state = {k: (rng.integers(0, 5, n) / 4).astype(np.float32) for k, n in sizes.items()}
    return dict(momentum1=state.get("momentum1"), momentum2=state.get("momentum2"), step=3 if opt.uses_step else None)


@st.composite
def update_args(draw):
    # sum/none: row gradients are exact in float32 (1/L of "mean" is not), so an optimizer that
    # divides by a tiny accumulated norm sees the same gradient on every backend
    args = draw(backward_args(pooling=draw(st.sampled_from(["sum", "none"]))))
    opt = draw(st.sampled_from(OPTIMIZERS))
    return dict(
        args,
        optimizer=opt,
        **state_for(opt, args["weights"], args["hash_size_cumsum"], np.random.default_rng(draw(st.integers(0, 9)))),
    )


# -- every fast backend against the oracle: tests/test_ops.py runs this table ---------
STRATEGIES = {
    "tbe_forward": forward_args(),
    "tbe_backward": backward_args(),
    "tbe_backward_sparse": sparse_args(),
    "tbe_grad_per_sample_weights": psw_grad_args(),
    "tbe_backward_update": update_args(),
}


# -- the family page's worked examples -------------------------------------------
LAY = tbe_layout([3, 2], [2, 3])
W12 = np.arange(12, dtype=np.float32)
IND = np.array([2, 0, 2, 1, 0, 0, 1])
OFF = np.array([0, 3, 3, 4, 7])
PSW = np.array([0.5, 1, 2, 1, 1, -1, 3], np.float32)
GRAD = np.array([[1, 2, 1, 0, -1], [3, 4, 0.5, 0.5, 0.5]], np.float32)
BASE = (W12, *LAY.arrays(), IND, OFF)


FW = tbe_args(LAY, W12, IND, OFF)
BWD = dict(FW, grad_output=GRAD)
_NONE = tbe_args(tbe_layout([3, 2], [2, 2]), np.arange(10, dtype=np.float32), IND, OFF, pooling_mode="none")
_STEP = dict(rtol=1e-5, atol=1e-6)
WORKED = [
    ("tbe_forward", FW, [[8, 11, 9, 10, 11], [0, 0, 21, 24, 27]]),
    ("tbe_forward", dict(FW, pooling_mode="mean"), [[8 / 3, 11 / 3, 9, 10, 11], [0, 0, 7, 8, 9]]),
    ("tbe_forward", dict(FW, per_sample_weights=PSW), [[10, 13.5, 9, 10, 11], [0, 0, 27, 30, 33]]),
    ("tbe_forward", dict(FW, output_dtype="float16"), np.array([[8, 11, 9, 10, 11], [0, 0, 21, 24, 27]], np.float16)),
    ("tbe_forward", _NONE, [[4, 5], [0, 1], [4, 5], [8, 9], [6, 7], [6, 7], [8, 9]]),
    ("tbe_backward", BWD, [1, 2, 0, 0, 2, 4, 1, 1, 1, 1.5, 0.5, -0.5]),
    (
        "tbe_backward",
        dict(BWD, pooling_mode="mean"),
        [1 / 3, 2 / 3, 0, 0, 2 / 3, 4 / 3, 1 / 3, 1 / 3, 1 / 3, 7 / 6, 1 / 6, -5 / 6],
    ),
    ("tbe_backward", dict(BWD, per_sample_weights=PSW), [1, 2, 0, 0, 2.5, 5, 0, 0, 0, 2.5, 1.5, 0.5]),
    (
        "tbe_backward_sparse",
        BWD,
        (
            np.array([0, 2, 3, 4], np.int64),
            np.array([1, 2, 2, 4, 1, 1, 1, 1.5, 0.5, -0.5], np.float32),
            np.array([0, 2, 4, 7, 10], np.int64),
        ),
    ),
    ("tbe_grad_per_sample_weights", BWD, [14, 2, 14, -2, 10.5, 10.5, 15]),
    # tbe_backward_update writes the weights (and momentum1): its result is what it wrote
    (
        "tbe_backward_update",
        dict(BWD, weights=W12.copy(), optimizer=TBEOptimizer("sgd", 0.1)),
        [[-0.1, 0.8, 2, 3, 3.8, 4.6, 5.9, 6.9, 7.9, 8.85, 9.95, 11.05]],
        _STEP,
    ),
    (
        "tbe_backward_update",
        dict(BWD, weights=W12.copy(), optimizer=TBEOptimizer("adagrad", 0.1), momentum1=np.zeros(12, np.float32)),
        [[-0.1, 0.9, 2, 3, 3.9, 4.9, 5.9, 6.9, 7.9, 8.9, 9.9, 11.1], [1, 4, 0, 0, 4, 16, 1, 1, 1, 2.25, 0.25, 0.25]],
        _STEP,
    ),
    (
        "tbe_backward_update",
        dict(
            BWD, weights=W12.copy(), optimizer=TBEOptimizer("rowwise_adagrad", 0.1), momentum1=np.zeros(5, np.float32)
        ),
        [
            [-0.063246, 0.873509, 2, 3, 3.936754, 4.873509, 5.9, 6.9, 7.9, 8.843330, 9.947777, 11.052223],
            [2.5, 0, 10, 1, 0.916667],
        ],
        _STEP,
    ),
    (
        "tbe_backward_update",
        dict(
            BWD,
            weights=W12.copy(),
            optimizer=TBEOptimizer("rowwise_adagrad", 0.1, weight_decay=0.01, weight_decay_mode="decoupled"),
            momentum1=np.zeros(5, np.float32),
        ),
        [
            [-0.063246, 0.872509, 2, 3, 3.932755, 4.868509, 5.894, 6.893, 7.892, 8.834331, 9.937777, 11.041224],
            [2.5, 0, 10, 1, 0.916667],
        ],
        _STEP,
    ),
]
# variable batch per feature (docs/families/tbe.md): FW's bags with feature 0's two samples on
# ranks 0 and 1 and feature 1's both on rank 0; the flat output is rank 0's [f0 s0, f1 s0, f1 s1]
# then rank 1's [f0 s1]
VBE_SIZES = [[1, 1], [2, 0]]
VBE_FW = dict(FW, batch_size_per_feature_per_rank=VBE_SIZES)
VBE_GRAD = np.array([1, 2, 1, 0, -1, 3, 4, 5, 6, 7], np.float32)
VBE_BWD = dict(VBE_FW, grad_output=VBE_GRAD)
WORKED += [
    ("tbe_forward", VBE_FW, [8, 11, 9, 10, 11, 21, 24, 27, 0, 0]),
    ("tbe_forward", dict(VBE_FW, pooling_mode="mean"), [8 / 3, 11 / 3, 9, 10, 11, 7, 8, 9, 0, 0]),
    ("tbe_backward", VBE_BWD, [1, 2, 0, 0, 2, 4, 6, 8, 10, 4, 4, 4]),
    (
        "tbe_backward_sparse",
        VBE_BWD,
        (
            np.array([0, 2, 3, 4], np.int64),
            np.array([1, 2, 2, 4, 6, 8, 10, 4, 4, 4], np.float32),
            np.array([0, 2, 4, 7, 10], np.int64),
        ),
    ),
    ("tbe_grad_per_sample_weights", VBE_BWD, [14, 2, 14, -2, 86, 86, 122]),
    (
        "tbe_backward_update",
        dict(VBE_BWD, weights=W12.copy(), optimizer=TBEOptimizer("sgd", 0.1)),
        [[-0.1, 0.8, 2, 3, 3.8, 4.6, 5.4, 6.2, 7, 8.6, 9.6, 10.6]],
        _STEP,
    ),
]
WORKED_TOL = dict(rtol=1e-6)  # float results: the spec's printed digits


# -- validation ------------------------------------------------------------------
def _vargs(**kw):
    return dict(FW, **kw)


VBE_BAD = [
    (
        dict(batch_size_per_feature_per_rank=[[1, -1], [2, 0]]),
        ValueError,
        ("batch_size_per_feature_per_rank[0][1] = -1",),
    ),
    (dict(batch_size_per_feature_per_rank=[[1, 1], [1, 0]]), ValueError, ("sums to 3", "len(offsets) - 1 = 4")),
    (dict(batch_size_per_feature_per_rank=[[2, 2]]), ValueError, ("batch_size_per_feature_per_rank", "T = 2")),
    (dict(batch_size_per_feature_per_rank=[[1, 1], [2]]), ValueError, ("batch_size_per_feature_per_rank", "ranks")),
    (dict(batch_size_per_feature_per_rank=[[], []]), ValueError, ("batch_size_per_feature_per_rank", "R >= 1")),
    (dict(batch_size_per_feature_per_rank=[2, 2]), TypeError, ("batch_size_per_feature_per_rank",)),
    (dict(batch_size_per_feature_per_rank=[[1.0, 1], [2, 0]]), TypeError, ("batch_size_per_feature_per_rank", "ints")),
    (dict(batch_size_per_feature_per_rank=[[True, 1], [2, 0]]), TypeError, ("batch_size_per_feature_per_rank",)),
    (dict(batch_size_per_feature_per_rank=np.ones((2, 2))), TypeError, ("batch_size_per_feature_per_rank", "float64")),
    (
        dict(batch_size_per_feature_per_rank=[[2**64, 1], [2, 0]]),
        ValueError,
        ("batch_size_per_feature_per_rank", "int64"),
    ),
    # int64 entries whose int64 sum wraps to the 4 bags: the sums are exact
    (
        dict(batch_size_per_feature_per_rank=np.array([[2**62, 2**62], [2**62, 2**62 + 4]], np.int64)),
        ValueError,
        ("sums to 18446744073709551620",),
    ),
    (
        dict(batch_size_per_feature_per_rank=VBE_SIZES, pooling_mode="none"),
        ValueError,
        ("batch_size_per_feature_per_rank", "'sum' or 'mean'"),
    ),
    (dict(batch_size_per_feature_per_rank=VBE_SIZES, offsets=OFF[:-1]), ValueError, ("sums to 4", "= 3")),
    (
        dict(batch_size_per_feature_per_rank=VBE_SIZES, offsets=np.array([0, 3, 5, 4, 7])),
        ValueError,
        ("offsets[3] = 4 < offsets[2] = 5",),
    ),
]
FORWARD_BAD = [
    (dict(pooling_mode="mean", per_sample_weights=PSW), ValueError, ("mean", "per_sample_weights")),
    (dict(pooling_mode="none"), ValueError, ("one embedding dim",)),
    (dict(pooling_mode="max"), ValueError, ("pooling_mode", "max")),
    (dict(bounds_check_mode="strict"), ValueError, ("bounds_check_mode", "strict")),
    (dict(output_dtype="bfloat16"), TypeError, ("bfloat16",)),
    (dict(output_dtype="float64"), TypeError, ("output_dtype",)),
    (dict(weights=W12.astype(np.float64)), TypeError, ("weights", "float64")),
    (dict(indices=IND.astype(np.float32)), TypeError, ("indices",)),
    (dict(per_sample_weights=PSW.astype(np.float16)), TypeError, ("per_sample_weights", "float16")),
    (dict(per_sample_weights=PSW[:3]), ValueError, ("per_sample_weights", "7")),
    (dict(offsets=OFF[:-1]), ValueError, ("multiple of T",)),
    (dict(weights=W12[:11]), ValueError, ("weights_offsets[1]", "11")),
    (dict(hash_size_cumsum=np.array([0, 3, 3])), ValueError, ("hash_size_cumsum[2] = 3",)),
    (dict(hash_size_cumsum=np.array([0, 4, 3])), ValueError, ("non-decreasing",)),
    (dict(D_offsets=np.array([1, 2, 5])), ValueError, ("D_offsets[0]",)),
    (dict(D_offsets=np.array([0, 2])), ValueError, ("D_offsets", "3 entries")),
    (dict(weights_offsets=np.array([0, 4])), ValueError, ("overlap",)),
]


def _uargs(optimizer, **kw):
    a = _vargs(grad_output=GRAD, optimizer=optimizer, weights=W12.copy())
    a.update(kw)
    return a


UPDATE_BAD = [
    (dict(optimizer=TBEOptimizer("rowwise_adagrad", 0.1)), ValueError, ("momentum1", "required")),
    (
        dict(optimizer=TBEOptimizer("rowwise_adagrad", 0.1), momentum1=np.zeros(12, np.float32)),
        ValueError,
        ("momentum1", "5 entries"),
    ),
    (
        dict(optimizer=TBEOptimizer("adagrad", 0.1), momentum1=np.zeros(12, np.float64)),
        TypeError,
        ("momentum1", "float32"),
    ),
    (
        dict(optimizer=TBEOptimizer("sgd", 0.1), momentum1=np.zeros(12, np.float32)),
        ValueError,
        ("momentum1", "None"),
    ),
    (
        dict(
            optimizer=TBEOptimizer("adam", 0.1),
            momentum1=np.zeros(12, np.float32),
            momentum2=np.zeros(12, np.float32),
        ),
        ValueError,
        ("step",),
    ),
    (dict(optimizer=TBEOptimizer("sgd", 0.1), step=1), ValueError, ("step", "None")),
    (dict(optimizer="sgd"), TypeError, ("TBEOptimizer",)),
    (
        dict(optimizer=TBEOptimizer("sgd", 0.1), weights=np.arange(24, dtype=np.float32)[::2]),
        ValueError,
        ("weights", "contiguous"),
    ),
]
# the bad-input table tests/test_ops.py runs on every backend (a rejected update writes nothing)
BAD = [
    *(("tbe_forward", _vargs(**kw), exc, words) for kw, exc, words in FORWARD_BAD),
    *(("tbe_forward", _vargs(**kw), exc, words) for kw, exc, words in VBE_BAD),
    ("tbe_backward", dict(VBE_FW, grad_output=GRAD), ValueError, ("grad_output", "1-D")),
    ("tbe_backward", dict(VBE_FW, grad_output=VBE_GRAD[:9]), ValueError, ("grad_output", "(10,)")),
    ("tbe_grad_per_sample_weights", dict(VBE_FW, grad_output=VBE_GRAD[:9]), ValueError, ("(10,)",)),
    (
        "tbe_backward_update",
        dict(VBE_BWD, weights=W12.copy(), optimizer=TBEOptimizer("sgd", 0.1), batch_size_per_feature_per_rank=[[1, 1]]),
        ValueError,
        ("batch_size_per_feature_per_rank", "T = 2"),
    ),
    ("tbe_backward", _vargs(grad_output=np.ones((2, 4), np.float32)), ValueError, ("grad_output", "(2, 5)")),
    ("tbe_backward", _vargs(grad_output=np.ones((2, 5))), TypeError, ("grad_output", "float64")),
    ("tbe_backward_sparse", _vargs(grad_output=np.ones((2, 4), np.float32)), ValueError, ("grad_output", "(2, 5)")),
    ("tbe_backward_sparse", _vargs(grad_output=np.ones((2, 5))), TypeError, ("grad_output", "float64")),
    ("tbe_grad_per_sample_weights", _vargs(grad_output=np.ones((2, 4), np.float32)), ValueError, ("(2, 5)",)),
    ("tbe_grad_per_sample_weights", _vargs(grad_output=np.ones((2, 5))), TypeError, ("grad_output", "float64")),
    *(("tbe_backward_update", _uargs(**kw), exc, words) for kw, exc, words in UPDATE_BAD),
]


# -- optional differential tier: fbgemm_gpu's CPU TBE module -------------------------
# fbgemm's TBE operators are code-generated internal entry points: the comparisons are with its module.
NO_FBGEMM_PEER = {
    "tbe_forward": "compared through SplitTableBatchedEmbeddingBagsCodegen "
    "(test_fbgemm_module_forward_and_training_steps; with batch_size_per_feature_per_rank: "
    "tests/test_fbgemm_compat.py, test_training_tbe_with_variable_batch_matches_fbgemm)",
    "tbe_backward": "fbgemm has no operator with this contract (its module's backward is fused into the update)",
    "tbe_backward_sparse": "fbgemm has no operator with this contract (its module's backward is fused into the update)",
    "tbe_grad_per_sample_weights": "compared with split_embedding_codegen_grad_indice_weights_cpu on the spec's "
    "example only (test_fbgemm_cpu_ops_backward_and_per_sample_weights), not on drawn inputs",
    "tbe_backward_update": "compared through SplitTableBatchedEmbeddingBagsCodegen for sgd, adagrad and "
    "rowwise_adagrad (test_fbgemm_module_forward_and_training_steps)",
}
