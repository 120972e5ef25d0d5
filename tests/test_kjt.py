"""The KeyedJaggedTensor family beyond its tables (tests/tables/kjt.py, run by tests/test_ops.py):
``out=`` checks, outputs never aliasing inputs, read-only inputs, the cpu backend's thread splits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from tables.kjt import BB, BI, I32, I64, arr, permute_1d_args, permute_2d_args


def test_bad_out():
    args = dict(BB, sequence=True)
    r = embnum.block_bucketize_sparse_features(**args)
    good = [np.empty_like(x) if x is not None else None for x in r]
    with pytest.raises(ValueError, match=r"out\[3\] must be None"):
        embnum.block_bucketize_sparse_features(**args, out=tuple(good[:3]) + (np.empty(9, I64), good[4]))
    with pytest.raises(ValueError, match=r"out\[4\] must be an array"):
        embnum.block_bucketize_sparse_features(**args, out=tuple(good[:4]) + (None,))
    with pytest.raises(ValueError, match="must hold 5 arrays"):
        embnum.block_bucketize_sparse_features(**args, out=tuple(good[:4]))
    with pytest.raises(TypeError, match=r"out\[1\] must have dtype int64"):
        embnum.block_bucketize_sparse_features(**args, out=(good[0], np.empty(9, I32), *good[2:]))
    with pytest.raises(ValueError, match="shares memory with the input 'indices'"):
        ids = BI.copy()
        embnum.block_bucketize_sparse_features(**dict(args, indices=ids), out=(good[0], ids, *good[2:]))
    out = tuple(good)
    assert embnum.block_bucketize_sparse_features(**args, out=out) is out


def test_outputs_never_alias_inputs():
    for backend in ("ref", "cpu"):
        lengths, ids = arr(1, 2), arr(3, 4, 5)
        r = embnum.block_bucketize_sparse_features(lengths, ids, False, False, arr(10), 1, backend=backend)
        assert not np.shares_memory(r[0], lengths) and not np.shares_memory(r[1], ids)
        p = embnum.permute_1d_sparse_data(arr(0, 1), lengths, ids, backend=backend)
        assert not np.shares_memory(p[0], lengths) and not np.shares_memory(p[1], ids)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("flags", [(False, False), (True, True)])
def test_bucketize_reads_read_only_inputs(weighted, flags):
    """Read-only lengths, ids and weights (a frozen buffer, a memory-mapped file) give the result
    of writable ones on every backend: the kernels never write through an input."""
    lengths, ids = arr(2, 1, 0, 3), arr(3, 12, 7, 0, 9, 31)
    w = np.linspace(0, 1, 6, dtype=np.float32) if weighted else None
    want = embnum.block_bucketize_sparse_features(lengths, ids, *flags, arr(5, 8), 3, w, backend="ref")
    frozen = [None if a is None else a.copy() for a in (lengths, ids, w)]
    for a in frozen:
        if a is not None:
            a.flags.writeable = False
    for backend in ("ref", "cpu"):
        got = embnum.block_bucketize_sparse_features(
            frozen[0], frozen[1], *flags, arr(5, 8), 3, frozen[2], backend=backend
        )
        for g, x in zip(got, want):
            assert (g is None and x is None) or np.array_equal(g, x), backend


def test_unbucketize_permute_restores_order():
    rng = np.random.default_rng(0)
    lengths = rng.poisson(3, 40)
    ids = rng.integers(-5, 200, int(lengths.sum()))
    r = embnum.block_bucketize_sparse_features(lengths, ids, False, True, arr(10, 20, 30, 40), 4, keep_orig_idx=True)
    np.testing.assert_array_equal(r[1][r[4]], ids)


def test_cpu_bucketize_does_not_depend_on_the_thread_count():
    numba = pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    lengths = rng.poisson(4, 3000)
    ids = rng.integers(-10, 5000, int(lengths.sum()))
    w = rng.random(ids.shape[0], dtype=np.float32)
    args = (lengths, ids, True, True, arr(100, 200, 300), 7, w)
    most = numba.config.NUMBA_NUM_THREADS
    if most < 2:
        pytest.skip("Numba has one thread here (NUMBA_NUM_THREADS=1): nothing to compare")
    before = numba.get_num_threads()
    try:
        results = []
        for n in (1, 2, most):  # one thread, two, all: the same bytes
            numba.set_num_threads(n)
            results.append(embnum.block_bucketize_sparse_features(*args, backend="cpu"))
    finally:
        numba.set_num_threads(before)
    assert len(results) == 3
    for r in results[1:]:
        for a, b in zip(results[0], r, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert embnum.get_op("block_bucketize_sparse_features").check_fn(
        results[0], embnum.block_bucketize_sparse_features(*args, backend="ref"), {}
    )[1]


@pytest.mark.parametrize("name", ["permute_2d_sparse_data", "permute_1d_sparse_data"])
@settings(max_examples=25)
@given(data=st.data())
def test_cpu_permute_split_across_threads_is_ref(name, data):
    """The gather cut into equal element ranges across the threads (cpu.kjt._gather_split, used
    from SPLIT_BYTES of output) gives ref's bytes: ranges that start inside a segment, empty
    segments, repeated and dropped keys."""
    numba = pytest.importorskip("numba")
    from embnum.cpu import kjt as cpu_kjt

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here (NUMBA_NUM_THREADS=1): nothing to split")
    args = data.draw(permute_2d_args() if name == "permute_2d_sparse_data" else permute_1d_args())
    want = getattr(embnum, name)(**args, backend="ref")
    before, threads = (cpu_kjt.SPLIT_BYTES, cpu_kjt.SPLIT_SEGMENT_BYTES), numba.get_num_threads()
    try:
        cpu_kjt.SPLIT_BYTES = cpu_kjt.SPLIT_SEGMENT_BYTES = 0
        numba.set_num_threads(data.draw(st.integers(2, numba.config.NUMBA_NUM_THREADS)))
        got = getattr(embnum, name)(**args, backend="cpu")
    finally:
        cpu_kjt.SPLIT_BYTES, cpu_kjt.SPLIT_SEGMENT_BYTES = before
        numba.set_num_threads(threads)
    for a, b in zip(want, got, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


@settings(max_examples=40)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    picks=st.lists(st.integers(0, 11), max_size=15),
    parts=st.integers(1, 7),
)
def test_cpu_split_gather_any_number_of_parts(sizes, picks, parts):
    """cpu.kjt._gather_split with 1-7 parts (more than there are threads too) equals the serial
    gather: every cut of the output, in a segment or on a boundary, empty segments included."""
    pytest.importorskip("numba")
    from embnum.cpu import kjt as cpu_kjt

    sizes = np.array(sizes, np.int64)
    seg = np.array([p % sizes.shape[0] for p in picks], np.int64)
    src_offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    dst_offs = np.concatenate([[0], np.cumsum(sizes[seg])]).astype(np.int64)
    src = np.arange(1, src_offs[-1] + 1, dtype=np.uint64)
    wsrc = src.astype(np.uint32) * 3
    want, wwant = np.zeros(dst_offs[-1], np.uint64), np.zeros(dst_offs[-1], np.uint32)
    got, wgot = np.zeros_like(want), np.zeros_like(wwant)
    cpu_kjt._gather(src, wsrc, src_offs, seg, dst_offs, want, wwant)
    cpu_kjt._gather_split(src, wsrc, src_offs, seg, dst_offs, got, wgot, parts)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(wgot, wwant)


@given(
    st.sampled_from([np.int32, np.int64]).flatmap(
        lambda dt: st.lists(
            st.one_of(
                st.integers(0, 5),
                st.integers(int(np.iinfo(dt).min), int(np.iinfo(dt).max)),
                st.sampled_from([int(np.iinfo(dt).min), int(np.iinfo(dt).max), 0, -1]),
            ),
            max_size=40,
        ).map(lambda x: np.array(x, dt))
    )
)
def test_unique_ids_sort_order_is_a_stable_argsort(ids):
    """The unique-ids kernel's order (a sort of packed ``id * n + position`` keys, NumPy's argsort
    when the ids span too wide a range) sorts the ids, equal ids by position, on any int32/int64 values."""
    from embnum.cpu import kjt as cpu_kjt

    copy = ids.copy()
    order = cpu_kjt._id_order(ids)
    assert np.array_equal(ids, copy)
    assert order.dtype == np.int64
    assert np.array_equal(ids[order], np.sort(ids))
    if ids.size and int(ids.max()) - int(ids.min()) < (1 << 62) // ids.size:
        assert np.array_equal(order, np.argsort(ids, kind="stable"))
    else:
        assert np.array_equal(np.sort(order), np.arange(ids.size))
