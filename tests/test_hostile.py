"""The adversarial tier: hostile input never crashes the process.

Every case runs in a worker subprocess (``hostile_worker.py``; see ``hostile.py``),
on ref, cpu and the torch bridge: a crash or a hang fails the case, not the run.
A case passes when every backend gives a clean ``TypeError``/``ValueError``/
``IndexError`` naming an argument with its inputs unchanged, or a result equal to
ref's. ``--hostile-examples=N`` (or ``EMBNUM_HOSTILE_EXAMPLES``) sets the cases drawn
per op; the default is the short CI profile. The counts are printed at the end of
the run (and written to ``EMBNUM_HOSTILE_REPORT`` as JSON when that is set).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

import embnum
import hostile
from harness import pme_args

OPS = [op.name for op in embnum.ops()]


def _backends():
    try:
        import embnum.torch_bridge  # noqa: F401
    except ImportError:
        return ("ref", "cpu")
    return ("ref", "cpu", "torch")


BACKENDS = _backends()


# -- the issue's examples, and one case of every class it names -------------------------------
I64 = 2**63 - 1
X = np.arange(8, dtype=np.float32).reshape(2, 4)
W16 = np.arange(16, dtype=np.float32)
TBE = dict(weights_offsets=np.array([0]), D_offsets=np.array([0, 4]))

REGRESSIONS = {
    "permute out_offset + length wraps": (
        "permute_multi_embedding",
        pme_args([X], np.array([[0, 0, 0, I64, 1, 0]]), np.array([4]), np.array([1]), [1]),
    ),
    "permute backward in_offset + length wraps": (
        "permute_multi_embedding_backward",
        pme_args([X[:, :1].copy()], np.array([[0, 0, I64, 0, 1, 0]]), np.array([4]), np.array([1]), [4], backward=True),
    ),
    "lengths sum wraps to len(values)": (
        "permute_1d_sparse_data",
        dict(permute=np.array([2]), lengths=np.array([I64, I64, 4]), values=np.array([10, 20])),
    ),
    "permuted segments sum wraps": (
        "permute_1d_sparse_data",
        dict(permute=np.array([0, 0, 0]), lengths=np.array([2**62, 0]), values=np.array([], np.int64)),
    ),
    "tbe rows * D wraps": (
        "tbe_forward",
        dict(
            weights=W16,
            **TBE,
            hash_size_cumsum=np.array([0, 2**62]),
            indices=np.array([5]),
            offsets=np.array([0, 1]),
            pooling_mode="sum",
        ),
    ),
    "tbe weights_offsets near 2**63": (
        "tbe_forward",
        dict(
            weights=W16,
            weights_offsets=np.array([I64 - 3]),
            D_offsets=np.array([0, 4]),
            hash_size_cumsum=np.array([0, 2]),
            indices=np.array([1]),
            offsets=np.array([0, 1]),
        ),
    ),
    "tbe table overlap check wraps": (
        "tbe_forward",
        dict(
            weights=W16,
            weights_offsets=np.array([8, 0]),
            D_offsets=np.array([0, 4, 8]),
            hash_size_cumsum=np.array([0, 2**62, 2**62 + 1]),
            indices=np.array([0, 0]),
            offsets=np.array([0, 1, 2]),
        ),
    ),
    "tbe D_offsets difference wraps": (
        "tbe_forward",
        dict(
            weights=W16,
            weights_offsets=np.array([0, 0]),
            D_offsets=np.array([0, I64, -(2**63) + 3]),
            hash_size_cumsum=np.array([0, 1, 2]),
            indices=np.array([0, 0]),
            offsets=np.array([0, 1, 2]),
        ),
    ),
    "index_select offsets wrap": (
        "keyed_jagged_index_select_dim1",
        dict(
            values=np.arange(2),
            lengths=np.array([I64, I64, 4]),
            offsets=np.array([0, I64, -2, 2]),
            indices=np.array([0]),
            batch_size=3,
        ),
    ),
    "bucketize lengths sum wraps": (
        "block_bucketize_sparse_features",
        dict(
            lengths=np.array([I64, I64, 4]),
            indices=np.arange(2),
            bucketize_pos=False,
            sequence=False,
            block_sizes=np.array([4]),
            my_size=2,
        ),
    ),
    "bucketize batch_size_per_feature sum wraps": (
        "block_bucketize_sparse_features",
        dict(
            lengths=np.array([1, 1]),
            indices=np.arange(2),
            bucketize_pos=False,
            sequence=False,
            block_sizes=np.array([4, 4, 4]),
            my_size=2,
            batch_size_per_feature=np.array([I64, I64, 4]),
        ),
    ),
    "unique ids: last table's keys wrap": (
        "jagged_unique_indices",
        dict(
            hash_size_cumsum=np.array([0, 5, 10]),
            hash_size_offsets=np.array([0, 1, 2]),
            offsets=np.array([0, 1, 2]),
            indices=np.array([1, I64]),
        ),
    ),
    "size past 2**63": ("offsets_range", dict(offsets=np.array([0]), range_size=2**64)),
    "size as np.uint64": (
        "dense_to_jagged",
        dict(dense=np.zeros((1, 2, 1)), offsets=[np.array([0, 1])], total_L=np.uint64(2**63)),
    ),
    "max_lengths near 2**62": (
        "jagged_to_padded_dense",
        dict(values=np.zeros((1, 1)), offsets=[np.array([0, 1])], max_lengths=[2**62]),
    ),
    "my_size past 2**63": (
        "block_bucketize_sparse_features",
        dict(
            lengths=np.array([1]),
            indices=np.arange(1),
            bucketize_pos=False,
            sequence=False,
            block_sizes=np.array([4]),
            my_size=2**64,
        ),
    ),
    "0-d input to float_to_hfp8": (
        "float_to_hfp8",
        dict(input=np.array(1.5, np.float32), ebits=4, exponent_bias=7, max_pos=480.0),
    ),
    "0-d input to bfloat16_to_float": ("bfloat16_to_float", dict(input=np.array(0x3FC0, np.uint16))),
    "np.matrix input": ("fp16_to_float", dict(input=np.ones((2, 3), np.float16).view(np.matrix))),
    "masked input": ("float_to_fp16", dict(input=np.ma.array(np.ones(3, np.float32), mask=[0, 1, 0]))),
}


def _strided_quantized():
    from embnum.ops.tbe_quantized import tbe_pack_quantized

    rng = np.random.default_rng(0)
    w, woff = tbe_pack_quantized([rng.standard_normal((4, 8)).astype(np.float32)], ["int8"])
    big = np.zeros(2 * w.size, np.uint8)
    big[::2] = w
    return dict(
        weights=big[::2],
        weights_offsets=woff,
        weights_tys=np.array([2]),  # int8
        D_offsets=np.array([0, 8]),
        rows_per_table=np.array([4]),
        indices=np.array([0, 3, 1]),
        offsets=np.array([0, 2, 3]),
    )


@pytest.fixture(scope="module")
def worker():
    w = hostile.Worker()
    yield w
    w.close()


@pytest.fixture(scope="session")
def hostile_counts(request):
    return request.config.hostile_counts


@pytest.mark.parametrize("label", list(REGRESSIONS) + ["strided uint8 weights in tbe_forward_quantized"])
def test_issue_examples(label, worker, hostile_counts):
    """The issue's crashes and wrong reads, each in the worker: a clean error or ref's result."""
    name, args = REGRESSIONS[label] if label in REGRESSIONS else ("tbe_forward_quantized", _strided_quantized())
    failures = hostile.run_cases(worker, hostile_counts, [(name, args, ("none", None), BACKENDS)])
    assert not failures, "\n".join(failures)


def test_in_place_ops_reject_every_aliased_pair(worker, hostile_counts):
    """Every pair of an in-place op's array arguments, one a view of the other: a ValueError naming both."""
    cases = []
    for op in embnum.ops():
        if not op.mutates:
            continue
        args = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)
        arrays = hostile.array_targets(args)
        cases += [(op.name, 0, ("alias", b, a, False), BACKENDS) for a in arrays for b in arrays if a != b]
    assert cases
    failures = hostile.run_cases(worker, hostile_counts, cases)
    assert not failures, "\n".join(failures)


# -- drawn hostile cases, every op ---------------------------------------------------------------
@pytest.mark.parametrize("name", OPS)
def test_hostile(name, worker, hostile_counts, hostile_examples):
    op = embnum.get_op(name)
    base = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)
    cases = []

    @settings(
        max_examples=hostile_examples,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(mutation=hostile.mutations(base), seed=__import__("hypothesis").strategies.integers(0, 3))
    def draw(mutation, seed):
        cases.append((name, seed, mutation, BACKENDS))

    draw()
    failures = hostile.run_cases(worker, hostile_counts, [(name, 0, ("none", None), BACKENDS)] + cases)
    assert not failures, "\n".join(failures[:60])


# -- the torch bridge checks what it is given (item 3) ---------------------------------------------
@pytest.mark.parametrize("mode", [-3, 1.7, True, "strict", None])
def test_bridge_bounds_check_mode_same_error_as_numpy(mode):
    torch = pytest.importorskip("torch")
    tb = pytest.importorskip("embnum.torch_bridge")
    op = embnum.get_op("tbe_forward")
    args = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)
    args["bounds_check_mode"] = mode
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        embnum.tbe_forward(**args)
    targs = {k: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for k, a in args.items()}
    with pytest.raises(type(numpy_error.value), match="bounds_check_mode") as torch_error:
        tb.tbe_forward(**targs)
    assert str(torch_error.value) == str(numpy_error.value)


@pytest.mark.parametrize(
    "make, exc, word",
    [
        (lambda c: c.Int8RowwiseCodec(row_dim=2.5), TypeError, "row_dim"),
        (lambda c: c.Int8RowwiseCodec(row_dim=0), ValueError, "row_dim"),
        (lambda c: c.Int8RowwiseCodec(4).calc_quantized_size(-1), ValueError, "input_len"),
        (lambda c: c.FP16Codec().calc_quantized_size(2**64), ValueError, "input_len"),
        (lambda c: c.HFP8Codec(ebits=9), ValueError, "ebits"),
        (lambda c: c.HFP8Codec(max_pos=-1.0), ValueError, "max_pos"),
        (lambda c: c.FP16Codec(saturate=2), TypeError, "saturate"),
    ],
)
def test_bridge_codec_parameters_are_checked(make, exc, word):
    pytest.importorskip("torch")
    from embnum.torch_bridge import codecs

    with pytest.raises(exc, match=word):
        make(codecs)


@pytest.mark.parametrize(
    "name, kw, exc, word",
    [
        ("offsets_range", dict(range_size=2.5), TypeError, "range_size"),
        ("offsets_range", dict(range_size=2**64), ValueError, "range_size"),
        ("float_to_fused_nbit_rowwise", dict(bit_rate="4"), TypeError, "bit_rate"),
        ("float_to_fp16", dict(saturate=1), TypeError, "saturate"),
        ("jagged_to_padded_dense", dict(offsets=np.array([0, 1])), TypeError, "offsets"),
    ],
)
def test_bridge_wrong_python_types_are_named(name, kw, exc, word):
    """A wrong Python type is a TypeError naming the argument, not the schema parser's RuntimeError."""
    torch = pytest.importorskip("torch")
    tb = pytest.importorskip("embnum.torch_bridge")
    op = embnum.get_op(name)
    args = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)

    def conv(a):
        if isinstance(a, np.ndarray):
            return torch.from_numpy(a)
        return [conv(x) for x in a] if isinstance(a, list) else a

    targs = {k: conv(a) for k, a in args.items()}
    targs.update(kw)
    with pytest.raises(exc, match=word):
        getattr(tb, name)(**targs)


def test_validation_cache_under_threads():
    """The permute-validation cache is shared by every thread: concurrent validations that
    fill and evict it raise nothing (an unlocked dict evicted with ``pop(next(iter(d)))``
    raised KeyError in a run of 100,000 such calls)."""
    import concurrent.futures
    import sys

    from embnum.ops import keyed_tensor as kt

    rows = np.array([[0, 0, 0, 0, 1, 0]])

    def call(i):  # 1000 distinct widths: the cache (256 entries) evicts on almost every call
        kt._rows(rows, [1], [1 + i % 1000], "pooled_embs", "out_lengths")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(call, range(20_000)))
    finally:
        sys.setswitchinterval(old)
    assert len(kt._VALID) <= kt._VALID.maxsize
