"""The containers at the edges of their input (``docs/containers.md``, "At the edges").

Construction checks are overflow-safe (lengths whose int64 sum wraps back to ``len(values)``,
offsets whose differences wrap, uint64 offsets), dtypes the ops cannot read are rejected at
construction, ``permute``'s ``indices_tensor`` must agree with ``indices``, and ``bucketize``
never wraps ``block_sizes`` to the ids' dtype. NumPy and torch, every constructor.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import embnum

KJT, JT = embnum.KeyedJaggedTensor, embnum.JaggedTensor
I64 = 2**63 - 1
BIG = 2**63 - 2**40  # 2 * (1 + BIG) + 2**41 = 2**64 + 2: the int64 sum wraps to 2


def _kinds():
    kinds = ["numpy"]
    try:
        import torch  # noqa: F401

        kinds.append("torch")
    except ImportError:  # pragma: no cover - torch is a test dependency
        pass
    return kinds


KINDS = _kinds()


def arr(kind, values, dtype):
    a = np.array(values, dtype=dtype)
    if kind == "numpy":
        return a
    import torch

    if a.dtype == np.uint64:
        return torch.from_numpy(a.view(np.int64)).view(torch.uint64)
    return torch.from_numpy(a)


def build(how, kind, values, arrays):
    """A KJT with keys ``["a"]`` (or a JaggedTensor) built the way ``how`` names."""
    values = arr(kind, *values)
    lengths = None if "lengths" not in arrays else arr(kind, *arrays["lengths"])
    offsets = None if "offsets" not in arrays else arr(kind, *arrays["offsets"])
    if how == "init":
        return KJT(["a"], values, lengths=lengths, offsets=offsets)
    if how == "sync":
        if offsets is None:
            return KJT.from_lengths_sync(["a"], values, lengths)
        return KJT.from_offsets_sync(["a"], values, offsets)
    return JT(values, lengths=lengths, offsets=offsets)


V2 = ([10, 20], np.int64)
BAD_ARRAYS = [
    # (what, arrays, error, words)
    ("lengths sum wraps", dict(lengths=([1 + BIG, 1 + BIG, 2**41], np.int64)), ValueError, ["lengths"]),
    ("lengths sum wraps by 2**64", dict(lengths=([I64, I64, 4], np.int64)), ValueError, ["lengths"]),
    ("offsets differences wrap", dict(offsets=([0, I64, -2, 2], np.int64)), ValueError, ["offsets"]),
    ("negative offsets", dict(offsets=([0, -5, 2], np.int64)), ValueError, ["offsets"]),
    ("uint64 offsets", dict(offsets=([0, 2**64 - 1, 2], np.uint64)), TypeError, ["offsets", "uint64"]),
    ("uint64 lengths", dict(lengths=([1, 1], np.uint64)), TypeError, ["lengths", "uint64"]),
    ("int16 lengths", dict(lengths=([1, 1], np.int16)), TypeError, ["lengths", "int16"]),
    ("uint8 lengths", dict(lengths=([1, 1], np.uint8)), TypeError, ["lengths", "uint8"]),
    ("int16 offsets", dict(offsets=([0, 1, 2], np.int16)), TypeError, ["offsets", "int16"]),
    (
        "lengths and offsets agree only modulo 2**64",
        dict(lengths=([I64, I64, 4], np.int64), offsets=([0, I64, -2, 2], np.int64)),
        ValueError,
        ["lengths"],
    ),
]


@pytest.mark.parametrize("how", ["init", "sync", "jt"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", BAD_ARRAYS, ids=[c[0] for c in BAD_ARRAYS])
def test_construction_is_overflow_safe(case, kind, how):
    _, arrays, exc, words = case
    if how == "sync" and len(arrays) == 2:
        pytest.skip("from_*_sync take lengths or offsets, not both")
    with pytest.raises(exc) as info:
        build(how, kind, V2, arrays)
    for w in words:
        assert w in str(info.value), info.value


@pytest.mark.parametrize("how", ["init", "sync", "jt"])
@pytest.mark.parametrize("kind", KINDS)
def test_object_values_rejected_at_construction(kind, how):
    if kind == "torch":
        pytest.skip("torch has no object dtype")
    with pytest.raises(TypeError, match="values"):
        build(how, kind, ([1, 2], object), dict(lengths=([1, 1], np.int64)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_lengths_near_the_int64_top_are_judged_exactly(kind, dtype):
    """One huge length is rejected (it exceeds len(values)) without summing; valid lengths of
    either index dtype still build and report the exact per-key counts."""
    if dtype == np.int32:
        bad = dict(lengths=([2**31 - 1, 2**31 - 1, 4], dtype))
    else:
        bad = dict(lengths=([I64, 1, 0], dtype))
    with pytest.raises(ValueError, match="lengths"):
        build("init", kind, ([1, 2, 3, 4], np.int64), bad)
    k = build("sync", kind, ([1, 2, 3, 4], np.int64), dict(lengths=([3, 0, 1], dtype)))
    assert k.length_per_key() == [4] and k.offset_per_key() == [0, 4]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=3, max_size=8),
    at=st.integers(0, 7),
    a=st.integers(2**63 - 2**40, I64 - 10),
    b=st.integers(2**63 - 2**40, I64 - 10),
    kind=st.sampled_from(KINDS),
    how=st.sampled_from(["init", "sync", "jt"]),
)
def test_any_lengths_whose_sum_wraps_are_rejected(lengths, at, a, b, kind, how):
    """Three lengths raised by ``a``, ``b`` and ``2**64 - a - b``: the int64 sum is unchanged
    (it wraps once), the lengths are not valid; never accepted."""
    n = sum(lengths)
    i, j, l = ((at + d) % len(lengths) for d in range(3))
    bad = list(lengths)
    bad[i], bad[j], bad[l] = bad[i] + a, bad[j] + b, bad[l] + 2**64 - a - b
    assume(all(x <= I64 for x in bad))
    with pytest.raises(ValueError, match="lengths"):
        build(how, kind, (list(range(n)), np.int64), dict(lengths=(bad, np.int64)))


# -- permute: indices_tensor must say what indices says ---------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_permute_indices_tensor_must_agree(kind):
    k = KJT(["a", "b", "c"], arr(kind, [1, 2, 3], np.int64), lengths=arr(kind, [1, 0, 1, 0, 1, 0], np.int64))
    want = k.permute([2, 0])
    same = k.permute([2, 0], arr(kind, [2, 0], np.int64))
    assert same.keys() == want.keys() and same.values().tolist() == want.values().tolist() == [3, 1]
    for bad, exc in [
        (arr(kind, [0, 2], np.int64), ValueError),
        (arr(kind, [2], np.int64), ValueError),
        (arr(kind, [2, 0, 1], np.int64), ValueError),
        (arr(kind, [2.0, 0.0], np.float64), TypeError),
        (arr(kind, [[2, 0]], np.int64), ValueError),
    ]:
        with pytest.raises(exc, match="indices_tensor"):
            k.permute([2, 0], bad)
    with pytest.raises(TypeError, match="indices_tensor"):
        k.permute([2, 0], [2, 0])


# -- bucketize: block_sizes never wrap to the ids' dtype ---------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "block_sizes",
    [[2**32 + 3], np.array([2**32 + 3]), [2**31], [2**63], [2**64], [-1]],
    ids=["list 2**32+3", "int64 array 2**32+3", "list 2**31", "list 2**63", "list 2**64", "negative"],
)
def test_bucketize_block_sizes_never_wrap(kind, block_sizes):
    """int32 ids, a block size beyond int32: a clean error naming block_sizes (what the op says), not
    ids bucketized by the block size wrapped to 3."""
    k = KJT(["a"], arr(kind, [26, 7, 27], np.int32), lengths=arr(kind, [1, 1, 1], np.int32))
    if isinstance(block_sizes, np.ndarray):
        block_sizes = arr(kind, block_sizes, np.int64)
    with pytest.raises(ValueError, match="block_sizes"):
        k.bucketize(3, block_sizes)
    ok, _ = k.bucketize(3, [10])
    assert [b.values().tolist() for b in ok] == [[7], [], [6, 7]]


@pytest.mark.parametrize("flag", ["output_permute", "bucketize_pos", "keep_original_indices"])
@pytest.mark.parametrize("value", [2**32 - 1, 1, "yes", None])
def test_bucketize_flags_are_bools(flag, value):
    """A flag that is not a bool is a TypeError naming it, not a truthy yes."""
    k = KJT(["a"], np.array([26, 7, 27]), lengths=np.array([1, 1, 1]))
    with pytest.raises(TypeError, match=flag):
        k.bucketize(3, [10], **{flag: value})


@pytest.mark.parametrize(
    "groups, word",
    [(2**64 - 1, "groups"), (["ab"], r"groups\[0\]"), ([["a", 3]], r"groups\[0\]\[1\]"), ("a", "groups")],
)
def test_regroup_groups_are_lists_of_keys(groups, word):
    """groups is a list of lists of str: an int, or a str read as its characters, is a TypeError."""
    kt = embnum.KeyedTensor(["a", "b"], [1, 1], np.zeros((2, 2)))
    with pytest.raises(TypeError, match=word):
        embnum.KeyedTensor.regroup([kt], groups)
    with pytest.raises(TypeError, match=word):
        embnum.KeyedTensor.regroup_as_dict([kt], groups, ["x"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "segments, exc", [(np.array(3), ValueError), (np.array([1.9, 1.2]), TypeError), (np.array([[3]]), ValueError)]
)
def test_int_lists_given_as_arrays_are_1d_integer(kind, segments, exc):
    """split(segments) and permute(indices) as arrays: 1-D and integer (a 0-d array is not [3], a
    float array is not truncated to ints)."""
    k = KJT(["a", "b", "c"], arr(kind, [1, 2, 3], np.int64), lengths=arr(kind, [1, 1, 1], np.int64))
    seg = arr(kind, segments, segments.dtype)
    with pytest.raises(exc, match="segments"):
        k.split(seg)
    with pytest.raises(exc, match="indices"):
        k.permute(arr(kind, segments, segments.dtype))


def test_masked_arrays_are_rejected_by_name():
    """A masked array (its mask would be dropped) is a TypeError naming the container's argument."""
    m = np.ma.array(np.array([1, 1]), mask=[0, 1])
    with pytest.raises(TypeError, match="lengths is a masked array"):
        KJT(["a"], np.array([1, 2]), lengths=m)
    k = KJT(["a", "b"], np.array([1, 2]), lengths=np.array([1, 1]))
    with pytest.raises(TypeError, match="indices_tensor is a masked array"):
        k.permute([1, 0], np.ma.array(np.array([1, 0])))
