"""The keyed_tensor family (docs/families/keyed_tensor.md): every backend against the
oracle on drawn regroupings (keys used 0-3 times, B = 0, odd widths, float16/32/64,
strided inputs, hand-written rows), the spec's worked examples, bad permutes,
the torch bridge and its gradients, the training module, and (optional tier)
fbgemm_gpu."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import embnum
from harness import Peer, check_matches_ref, fbgemm, pme_args, tensor
from strategies import FLOAT_DTYPES, float_dtypes, index_dtypes, maybe_strided, value_arrays, value_dtypes

FAMILY = [op.name for op in embnum.ops("keyed_tensor")]


# -- strategies -------------------------------------------------------------------
@st.composite
def regroupings(draw, max_inputs=3, max_keys=3, max_width=5):
    """``(keys, lengths, groups)``: every key used 0, 1, 2 or 3 times, in random groups and order."""
    n_in = draw(st.integers(1, max_inputs))
    keys, lengths, names = [], [], []
    for i in range(n_in):
        k = draw(st.integers(0, max_keys))
        keys.append([f"k{i}_{m}" for m in range(k)])
        lengths.append([draw(st.integers(0, max_width)) for _ in range(k)])
        names += keys[-1]
    n_out = draw(st.integers(0, 4))
    groups = [[] for _ in range(n_out)]
    if n_out:
        for name in names:
            for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
                groups[draw(st.integers(0, n_out - 1))].append(name)
        groups = [draw(st.permutations(g)) for g in groups]
    return keys, lengths, groups


@st.composite
def inputs_for(draw, lengths, dtype=None):
    dtype = dtype or draw(float_dtypes)
    B = draw(st.sampled_from([0, 1, 2, 3, 5]))
    return [draw(maybe_strided(draw(value_arrays(dtype, (B, sum(ls)))))) for ls in lengths]


@st.composite
def regroup_args(draw):
    keys, lengths, groups = draw(regroupings())
    return {"pooled_embs": draw(inputs_for(lengths)), "keys": keys, "lengths": lengths, "groups": groups}


@st.composite
def permute_args(draw, backward=False):
    """Arguments of permute_multi_embedding (or its backward): kt_regroup_arguments rows, as
    int32 or int64, sometimes hand-written: shuffled, some dropped (uncovered columns), ``next = -1``."""
    keys, lengths, groups = draw(regroupings())
    perm, ins, outs, out_lengths = embnum.kt_regroup_arguments(None, keys, lengths, groups, backend="ref")
    style = draw(st.sampled_from(["canonical", "canonical", "shuffled", "dropped", "next=-1"]))
    if style == "shuffled":
        perm = perm[draw(st.permutations(range(len(perm))))] if len(perm) else perm
    elif style == "dropped" and len(perm):
        perm = perm[np.array(draw(st.lists(st.booleans(), min_size=len(perm), max_size=len(perm))))].copy()
        perm[:, 5] = 0  # the chain no longer holds; embnum never follows it
    elif style == "next=-1" and len(perm):
        perm = perm.copy()
        perm[:, 5] = -1
    perm = perm.reshape(-1, 6).astype(draw(index_dtypes))
    ins, outs = ins.astype(draw(index_dtypes)), outs.astype(draw(index_dtypes))
    if not backward:
        return {
            "pooled_embs": draw(inputs_for(lengths)),
            "permutes": perm,
            "in_shapes": ins,
            "out_shapes": outs,
            "out_lengths": out_lengths,
        }
    if not out_lengths:  # the backward needs a gradient to read B from
        out_lengths, outs = [0], np.array([0], dtype=outs.dtype)
    grads = draw(inputs_for([[w] for w in out_lengths]))
    return {"grad_outputs": grads, "permutes": perm, "in_shapes": ins, "out_shapes": outs, "in_lengths": ins.tolist()}


@st.composite
def pooled_args(draw, dtypes=None, min_batch=0):
    """permute_pooled_embs' arguments; ``dtypes`` (a strategy) and ``min_batch`` narrow the
    drawn values to a peer's domain (drawing there, not filtering into it)."""
    T = draw(st.integers(0, 5))
    dims = np.array([draw(st.integers(0, 5)) for _ in range(T)], dtype=np.int64)
    perm = np.array(draw(st.permutations(range(T))), dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(dims)]).astype(draw(index_dtypes))
    inv_offs = np.concatenate([[0], np.cumsum(dims[perm])]).astype(draw(index_dtypes))
    inv = np.argsort(perm).astype(draw(index_dtypes))
    dtype = draw(value_dtypes if dtypes is None else dtypes)
    x = draw(maybe_strided(draw(value_arrays(dtype, (draw(st.integers(min_batch, 4)), int(offs[-1]))))))
    return {
        "pooled_embs": x,
        "offset_dim_list": offs,
        "permute_list": perm.astype(draw(index_dtypes)),
        "inv_offset_dim_list": inv_offs,
        "inv_permute_list": inv,
    }


@st.composite
def kt_args(draw):
    keys, lengths, groups = draw(regroupings(max_inputs=4, max_keys=4))
    return {
        "embs": draw(st.sampled_from([None, np.zeros((2, 3), np.float32)])),
        "keys": keys,
        "lengths": lengths,
        "groups": groups,
    }


@st.composite
def handwritten_args(draw, backward=False):
    """Arbitrary valid rows: each output is tiled with segments (and gaps) that read any
    range of any input, so input ranges overlap partially and some columns stay uncovered."""
    in_widths = [draw(st.integers(0, 7)) for _ in range(draw(st.integers(1, 3)))]
    rows, out_widths = [], []
    for j in range(draw(st.integers(1, 3))):
        col = 0
        for _ in range(draw(st.integers(0, 4))):
            col += draw(st.integers(0, 2))  # a gap: uncovered columns
            i = draw(st.integers(0, len(in_widths) - 1))
            n = draw(st.integers(0, in_widths[i]))
            a = draw(st.integers(0, in_widths[i] - n))
            rows.append([i, j, a, col, n, 0])
            col += n
        out_widths.append(col + draw(st.integers(0, 2)))
    rows = [rows[k] for k in draw(st.permutations(range(len(rows))))]
    P = len(rows)
    for r in rows:
        r[5] = draw(st.integers(-P, P - 1)) if P else 0  # never followed
    perm = np.array(rows, dtype=draw(index_dtypes)).reshape(P, 6)
    ins, outs = np.array(in_widths, np.int64), np.array(out_widths, np.int32)
    if not backward:
        return {
            "pooled_embs": draw(inputs_for([[w] for w in in_widths])),
            "permutes": perm,
            "in_shapes": ins,
            "out_shapes": outs,
            "out_lengths": out_widths,
        }
    grads = draw(inputs_for([[w] for w in out_widths]))
    return {"grad_outputs": grads, "permutes": perm, "in_shapes": ins, "out_shapes": outs, "in_lengths": in_widths}


STRATEGIES = {
    "permute_pooled_embs": pooled_args(),
    "kt_regroup_arguments": kt_args(),
    "permute_multi_embedding": st.one_of(permute_args(), handwritten_args()),
    "permute_multi_embedding_backward": st.one_of(permute_args(backward=True), handwritten_args(backward=True)),
    "regroup_keyed_tensor": regroup_args(),
}


# test_matches_ref: tests/test_ops.py runs STRATEGIES for every op on every backend


# -- the spec's worked examples (fbgemm's numbers), on every backend ---------------
def _kt(keys, lengths, groups):
    return dict(embs=None, keys=keys, lengths=lengths, groups=groups)


KT_WORKED = [
    (
        _kt([["a", "b"], ["c"]], [[2, 1], [2]], [["a", "c"], ["b", "a"], ["a"]]),
        [[0, 0, 0, 0, 2, 3], [1, 0, 0, 2, 2, 0], [0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, -4], [0, 2, 0, 0, 2, -5]],
        [3, 2],
        [4, 3, 2],
    ),
    (
        _kt([["a", "b"]], [[2, 3]], [["a"], ["b", "a"]]),
        [[0, 0, 0, 0, 2, 2], [0, 1, 2, 0, 3, 0], [0, 1, 0, 3, 2, -3]],
        [5],
        [2, 5],
    ),
    (_kt([["a", "b", "c"]], [[2, 3, 4]], [["c", "a"]]), [[0, 0, 5, 0, 4, 0], [0, 0, 0, 4, 2, 0]], [9], [6]),
    (
        _kt([["a", "b"]], [[0, 3]], [["a", "b", "a"]]),
        [[0, 0, 0, 0, 0, 2], [0, 0, 0, 0, 3, 0], [0, 0, 0, 3, 0, -3]],
        [3],
        [3],
    ),
    (
        _kt(
            [["f1", "f2"], ["f3", "f4", "f5"], ["f6"]],
            [[3, 4], [5, 6, 7], [8]],
            [["f1", "f3"], ["f2"], ["f4", "f1", "f6"], ["f1", "f5"]],
        ),
        [
            [0, 0, 0, 0, 3, 4],
            [1, 0, 0, 3, 5, 0],
            [0, 1, 3, 0, 4, 0],
            [1, 2, 5, 0, 6, 0],
            [0, 2, 0, 6, 3, -6],
            [2, 2, 0, 9, 8, 0],
            [0, 3, 0, 0, 3, -8],
            [1, 3, 11, 3, 7, 0],
        ],
        [7, 18, 8],
        [8, 4, 17, 10],
    ),
]
NEXT_WORKED = [
    (_kt([["a"]], [[2]], [["a"], ["a"], ["a"], ["a"]]), [1, -2, -3, -4]),
    (_kt([["a", "b"]], [[2, 3]], [["a", "b"], ["b", "a"], ["a", "b"]]), [3, 2, -5, -4, -6, -6]),
    (_kt([["a", "b"]], [[2, 3]], [["a", "a", "b"]]), [1, -3, 0]),
]


@pytest.mark.parametrize("case", range(len(NEXT_WORKED)))
def test_kt_regroup_next_chains(case, fast_backend):
    args, nxt = NEXT_WORKED[case]
    perm = check_matches_ref("kt_regroup_arguments", args, fast_backend)[0]
    assert perm[:, 5].tolist() == nxt


def test_kt_regroup_duplicate_in_one_group_offsets():
    perm = embnum.kt_regroup_arguments(None, [["a", "b"]], [[2, 3]], [["a", "a", "b"]])[0]
    assert perm[:, 3].tolist() == [0, 2, 4]


def test_kt_regroup_empty():
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, [], [], [])
    assert perm.shape == (0, 6) and ins.shape == (0,) and outs.shape == (0,) and ol == []


SEC3_IN = [np.array([[1, 2, 3], [4, 5, 6]], np.float32), np.array([[10, 20], [30, 40]], np.float32)]
SEC3_OUT = [[[1, 2, 10, 20], [4, 5, 30, 40]], [[3, 1, 2], [6, 4, 5]], [[1, 2], [4, 5]]]
SEC3_GRAD = [
    np.array([[1, 2, 3, 4], [5, 6, 7, 8]]),
    np.array([[10, 20, 30], [40, 50, 60]]),
    np.array([[100, 200], [300, 400]]),
]
SEC3_KEYS = ([["a", "b"], ["c"]], [[2, 1], [2]], [["a", "c"], ["b", "a"], ["a"]])
SEC3_TABLES = [np.array(t, np.int32) for t in KT_WORKED[0][1:]]  # permutes, in_shapes, out_shapes of SEC3_KEYS
POOLED_X = np.array([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], np.float32)
POOLED_LISTS = dict(
    offset_dim_list=np.array([0, 2, 5, 6]),
    permute_list=np.array([2, 0, 1]),
    inv_offset_dim_list=np.array([0, 1, 3, 6]),
    inv_permute_list=np.array([1, 2, 0]),
)
# the gradient swaps the plain and the inverse lists
POOLED_SWAPPED = dict(
    offset_dim_list=POOLED_LISTS["inv_offset_dim_list"],
    permute_list=POOLED_LISTS["inv_permute_list"],
    inv_offset_dim_list=POOLED_LISTS["offset_dim_list"],
    inv_permute_list=POOLED_LISTS["permute_list"],
)
WORKED = [
    *(
        (
            "kt_regroup_arguments",
            args,
            (np.array(rows, np.int32), np.array(ins, np.int32), np.array(outs, np.int32), outs),
        )
        for args, rows, ins, outs in KT_WORKED
    ),
    *(
        row
        for dtype in FLOAT_DTYPES
        for row in (
            (
                "permute_multi_embedding",
                pme_args([x.astype(dtype) for x in SEC3_IN], *SEC3_TABLES, [4, 3, 2]),
                [np.array(o, dtype) for o in SEC3_OUT],
            ),
            (
                "regroup_keyed_tensor",
                dict(
                    pooled_embs=[x.astype(dtype) for x in SEC3_IN],
                    **dict(zip(("keys", "lengths", "groups"), SEC3_KEYS)),
                ),
                [np.array(o, dtype) for o in SEC3_OUT],
            ),
            (
                "permute_multi_embedding_backward",
                pme_args([g.astype(dtype) for g in SEC3_GRAD], *SEC3_TABLES, [3, 2], backward=True),
                [np.array(g, dtype) for g in ([[121, 232, 10], [355, 466, 40]], [[3, 4], [7, 8]])],
            ),
        )
    ),
    ("permute_pooled_embs", dict(pooled_embs=POOLED_X, **POOLED_LISTS), [[6, 1, 2, 3, 4, 5], [12, 7, 8, 9, 10, 11]]),
    (
        "permute_pooled_embs",
        dict(pooled_embs=POOLED_X * 10, **POOLED_SWAPPED),
        [[20, 30, 40, 50, 60, 10], [80, 90, 100, 110, 120, 70]],
    ),
]
# test_worked_examples: tests/test_ops.py runs WORKED on every backend


# -- edges --------------------------------------------------------------------------
def _classic(B, dtype=np.float32, small=True):
    from embnum.examples.keyed_tensor import classic_case

    return classic_case(np.random.default_rng(B), B, small=small, dtype=dtype)


def _permute_edge(embs, keys, lengths, groups, perm_dtype=np.int32):
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    return pme_args(embs, perm.astype(perm_dtype), ins, outs, ol)


EDGES = {
    "B=0 classic": ("regroup_keyed_tensor", dict(zip(("pooled_embs", "keys", "lengths", "groups"), _classic(0)))),
    "no groups": ("regroup_keyed_tensor", dict(pooled_embs=[np.ones((2, 3))], keys=[["a"]], lengths=[[3]], groups=[])),
    "empty group": (
        "regroup_keyed_tensor",
        dict(pooled_embs=[np.ones((2, 3))], keys=[["a"]], lengths=[[3]], groups=[[], ["a"]]),
    ),
    "odd widths float16": (
        "permute_multi_embedding",
        _permute_edge(
            [np.arange(2 * 12, dtype=np.float16).reshape(2, 12)],
            [["a", "b", "c"]],
            [[3, 5, 4]],
            [["c", "a"], ["b", "c", "c"]],
            np.int64,
        ),
    ),
    "no rows at all": (
        "permute_multi_embedding",
        pme_args([np.ones((3, 2))], np.zeros((0, 6), np.int64), np.array([2]), np.array([4]), [4]),
    ),
    "backward, uncovered columns are 0": (
        "permute_multi_embedding_backward",
        pme_args([np.ones((2, 2))], np.array([[0, 0, 1, 0, 2, 0]]), np.array([5]), np.array([2]), [5], backward=True),
    ),
    "backward float16 rounds after every addition": (
        "permute_multi_embedding_backward",
        pme_args(
            [np.array([[2048.0, 1.0, 1.0]], np.float16)],
            np.array([[0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 2, 1, 0]]),
            np.array([1]),
            np.array([3]),
            [1],
            backward=True,
        ),
    ),
    "negative zero gradient becomes +0 (sum from zeros)": (
        "permute_multi_embedding_backward",
        pme_args(
            [np.array([[-0.0]])], np.array([[0, 0, 0, 0, 1, 0]]), np.array([1]), np.array([1]), [1], backward=True
        ),
    ),
    "strided columns": (
        "permute_multi_embedding",
        pme_args(
            [np.arange(24.0).reshape(4, 6)[:, ::2]], np.array([[0, 0, 1, 0, 2, 0]]), np.array([3]), np.array([2]), [2]
        ),
    ),
    "pooled int64 ids": (
        "permute_pooled_embs",
        dict(
            pooled_embs=np.arange(12, dtype=np.int64).reshape(2, 6),
            offset_dim_list=np.array([0, 2, 5, 6], np.int32),
            permute_list=np.array([2, 0, 1], np.int32),
            inv_offset_dim_list=np.array([0, 1, 3, 6], np.int32),
            inv_permute_list=np.array([1, 2, 0], np.int32),
        ),
    ),
    "pooled T=0": (
        "permute_pooled_embs",
        dict(
            pooled_embs=np.ones((3, 0)),
            offset_dim_list=np.array([0]),
            permute_list=np.zeros(0, np.int64),
            inv_offset_dim_list=np.array([0]),
            inv_permute_list=np.zeros(0, np.int64),
        ),
    ),
}


# test_edges: tests/test_ops.py runs EDGES on every backend


def test_float16_backward_rounding_is_per_addition():
    g = EDGES["backward float16 rounds after every addition"][1]
    got = embnum.permute_multi_embedding_backward(**g)
    assert got[0].tolist() == [[2048.0]]  # 2048 + 1 rounds back to 2048 twice; summed at once it would be 2050


def test_classic_case_production_widths():
    embs, keys, lengths, groups = _classic(64, small=False)
    outs = embnum.regroup_keyed_tensor(embs, keys, lengths, groups)
    assert [o.shape for o in outs] == [(64, 608), (64, 256), (64, 1248), (64, 864)]
    f1 = embs[0][:, :96]
    np.testing.assert_array_equal(outs[0][:, :96], f1)
    np.testing.assert_array_equal(outs[2][:, 128:224], f1)
    np.testing.assert_array_equal(outs[3][:, :96], f1)
    perm, ins, o, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    grads = [np.ones_like(x) for x in outs]
    g = embnum.permute_multi_embedding_backward(grads, perm, ins, o, ins.tolist())
    assert (g[0][:, :96] == 3).all() and (g[0][:, 96:] == 1).all()  # f1 is used three times


# -- bad input: a clear error before any kernel runs ---------------------------------
PERM = np.array([[0, 0, 0, 0, 2, 0], [0, 1, 2, 0, 1, 0]])
GOOD = pme_args([np.ones((2, 3), np.float32)], PERM, np.array([3]), np.array([2, 1]), [2, 1])
GOOD_BW = pme_args(
    [np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)],
    PERM,
    np.array([3]),
    np.array([2, 1]),
    [3],
    backward=True,
)


def _with_row(r, col, value, base=GOOD):
    p = PERM.copy()
    p[r, col] = value
    return {**base, "permutes": p}


POOLED = dict(
    pooled_embs=np.ones((2, 6)),
    offset_dim_list=np.array([0, 2, 5, 6]),
    permute_list=np.array([2, 0, 1]),
    inv_offset_dim_list=np.array([0, 1, 3, 6]),
    inv_permute_list=np.array([1, 2, 0]),
)
KT = dict(embs=None, keys=[["a", "b"]], lengths=[[2, 3]], groups=[["a"]])
RG = dict(pooled_embs=[np.ones((2, 5))], keys=[["a", "b"]], lengths=[[2, 3]], groups=[["b", "a"]])
PME, BW, PPE, KTA, RKT = (
    "permute_multi_embedding",
    "permute_multi_embedding_backward",
    "permute_pooled_embs",
    "kt_regroup_arguments",
    "regroup_keyed_tensor",
)
BAD = [
    (PME, _with_row(0, 0, 1), ValueError, ("permutes[0, 0]", "in_tensor", "= 1")),
    (PME, _with_row(1, 0, -1), ValueError, ("permutes[1, 0]",)),
    (PME, _with_row(1, 1, 2), ValueError, ("permutes[1, 1]", "out_tensor")),
    (PME, _with_row(0, 2, 2), ValueError, ("permutes[0]", "in_offset + length", "width 3")),
    (PME, _with_row(0, 2, -1), ValueError, ("permutes[0, 2]", "in_offset")),
    (PME, _with_row(0, 3, 1), ValueError, ("permutes[0]", "out_offset + length", "width 2")),
    (PME, _with_row(0, 4, 3), ValueError, ("permutes[0]",)),
    (PME, _with_row(0, 4, -2), ValueError, ("permutes[0, 4]", "length")),
    (PME, _with_row(0, 5, 2), ValueError, ("permutes[0, 5]", "next")),
    (PME, _with_row(0, 5, -3), ValueError, ("permutes[0, 5]", "next")),
    (
        PME,
        {**GOOD, "permutes": np.array([[0, 0, 0, 0, 2, 0], [0, 0, 2, 1, 1, 0]])},
        ValueError,
        ("rows 0 and 1", "overlapping", "output 0"),
    ),
    (PME, {**GOOD, "permutes": PERM[:, :5]}, ValueError, ("permutes", "[P, 6]")),
    (PME, {**GOOD, "permutes": PERM.astype(np.float32)}, TypeError, ("permutes", "float32")),
    (PME, {**GOOD, "permutes": PERM.tolist()}, TypeError, ("permutes", "list")),
    (PME, {**GOOD, "in_shapes": np.array([4])}, ValueError, ("in_shapes[0] = 4", "3")),
    (PME, {**GOOD, "out_shapes": np.array([2, 2])}, ValueError, ("out_shapes[1] = 2",)),
    (PME, {**GOOD, "out_shapes": np.array([2])}, ValueError, ("out_shapes", "2 entries")),
    (PME, {**GOOD, "out_lengths": [2, -1]}, ValueError, ("out_lengths[1]",)),
    (PME, {**GOOD, "pooled_embs": []}, ValueError, ("pooled_embs", "at least 1")),
    (PME, {**GOOD, "pooled_embs": [np.ones((2, 3), np.int32)]}, TypeError, ("pooled_embs[0]", "int32")),
    (PME, {**GOOD, "pooled_embs": [np.ones(3)]}, ValueError, ("pooled_embs[0]", "2-D")),
    (
        PME,
        {**GOOD, "pooled_embs": [np.ones((2, 3)), np.ones((3, 1))], "in_shapes": np.array([3, 1])},
        ValueError,
        ("pooled_embs[1]", "one B"),
    ),
    (
        PME,
        {**GOOD, "pooled_embs": [np.ones((2, 3)), np.ones((2, 1), np.float32)], "in_shapes": np.array([3, 1])},
        TypeError,
        ("pooled_embs[1]", "one dtype"),
    ),
    (BW, _with_row(0, 2, 2, GOOD_BW), ValueError, ("permutes[0]", "width 3")),
    (BW, _with_row(1, 1, 2, GOOD_BW), ValueError, ("permutes[1, 1]",)),
    (BW, {**GOOD_BW, "in_lengths": [4]}, ValueError, ("in_shapes[0] = 3", "in_lengths")),
    (BW, {**GOOD_BW, "grad_outputs": []}, ValueError, ("grad_outputs",)),
    (BW, {**GOOD_BW, "out_shapes": np.array([2, 2])}, ValueError, ("out_shapes[1] = 2",)),
    (PPE, {**POOLED, "offset_dim_list": np.array([0, 2, 5, 5])}, ValueError, ("offset_dim_list[-1]", "6")),
    (PPE, {**POOLED, "offset_dim_list": np.array([1, 2, 5, 6])}, ValueError, ("offset_dim_list[0]",)),
    (PPE, {**POOLED, "offset_dim_list": np.array([0, 5, 2, 6])}, ValueError, ("offset_dim_list", "non-decreasing")),
    (PPE, {**POOLED, "permute_list": np.array([2, 0, 0])}, ValueError, ("permute_list[2] = 0", "permutation")),
    (PPE, {**POOLED, "permute_list": np.array([2, 0, 3])}, ValueError, ("permute_list[2] = 3",)),
    (PPE, {**POOLED, "permute_list": np.array([2, 0])}, ValueError, ("permute_list", "3 entries")),
    (PPE, {**POOLED, "inv_permute_list": np.array([1, 0, 2])}, ValueError, ("inv_permute_list", "inverse")),
    (PPE, {**POOLED, "inv_offset_dim_list": np.array([0, 2, 3, 6])}, ValueError, ("inv_offset_dim_list[1] = 2", "1")),
    (PPE, {**POOLED, "pooled_embs": np.ones((2, 6, 1))}, ValueError, ("pooled_embs", "2-D")),
    (PPE, {**POOLED, "permute_list": np.array([2.0, 0, 1])}, TypeError, ("permute_list",)),
    (KTA, {**KT, "groups": [["z"]]}, ValueError, ("groups[0][0] = 'z'", "not a key")),
    (KTA, {**KT, "lengths": [[2]]}, ValueError, ("lengths[0]", "len(keys[0]) = 2")),
    (KTA, {**KT, "lengths": [[2, 3], [1]]}, ValueError, ("lengths", "len(keys) = 1")),
    (KTA, {**KT, "lengths": [[2, -3]]}, ValueError, ("lengths[0][1] must be >= 0, got -3",)),
    (KTA, {**KT, "lengths": [[2, 2.0]]}, TypeError, ("lengths[0][1]",)),
    (KTA, {**KT, "lengths": [[2, True]]}, TypeError, ("lengths[0][1]",)),
    (KTA, {**KT, "keys": [["a", "a"]]}, ValueError, ("'a'", "twice")),
    (KTA, {**KT, "keys": [["a", 3]]}, TypeError, ("keys[0][1]",)),
    (KTA, {**KT, "groups": ["a"]}, TypeError, ("groups[0]",)),
    (KTA, {**KT, "embs": [1.0]}, TypeError, ("embs",)),
    (KTA, {**KT, "lengths": [[2**31, 0]]}, ValueError, ("2**31 - 1",)),
    (KTA, {**KT, "groups": [[["a"]]]}, TypeError, ("groups[0][0]",)),
    (KTA, {**KT, "groups": np.array([[["a"]]])}, TypeError, ("groups",)),
    (KTA, {**KT, "keys": [[["a"], "b"]]}, TypeError, ("keys[0][0]",)),
    (RKT, {**RG, "pooled_embs": [np.ones((2, 4))]}, ValueError, ("pooled_embs[0]", "sum(lengths[0]) = 5")),
    (RKT, {**RG, "pooled_embs": [np.ones((2, 5)), np.ones((2, 1))]}, ValueError, ("len(keys) = 1",)),
    (RKT, {**RG, "groups": [["b", "q"]]}, ValueError, ("'q'",)),
]


# test_bad_input: tests/test_ops.py runs BAD on every backend


def test_bad_out():
    args = dict(pooled_embs=[np.ones((2, 3))], keys=[["a"]], lengths=[[3]], groups=[["a"], ["a"]])
    with pytest.raises(ValueError, match="out must hold 2 arrays"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3))])
    with pytest.raises(TypeError, match="out\\[1\\] must have dtype float64"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3)), np.empty((2, 3), np.float32)])
    with pytest.raises(ValueError, match="shares memory with the input"):
        embnum.regroup_keyed_tensor(**args, out=[np.empty((2, 3)), args["pooled_embs"][0]])
    with pytest.raises(TypeError, match="unexpected keyword argument .out."):
        embnum.kt_regroup_arguments(None, [["a"]], [[3]], [["a"]], out=[np.empty(1)])


# -- torch bridge: gradients, bfloat16, the training module ----------------------------
torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")
from embnum.modules import PermuteMultiEmbedding  # noqa: E402


@st.composite
def float64_regroup(draw):
    keys, lengths, groups = draw(regroupings())
    B = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return [rng.standard_normal((B, sum(ls))) for ls in lengths], keys, lengths, groups


@settings(max_examples=15)
@given(case=float64_regroup())
def test_gradcheck(case):
    embs, keys, lengths, groups = case
    assume(all(x.size for x in embs) and any(groups))  # gradcheck needs elements on both sides
    xs = tuple(tensor(x).requires_grad_() for x in embs)
    perm, ins, outs, ol = (
        tensor(a) if isinstance(a, np.ndarray) else a for a in embnum.kt_regroup_arguments(None, keys, lengths, groups)
    )
    assert torch.autograd.gradcheck(lambda *v: tb.regroup_keyed_tensor(list(v), keys, lengths, groups), xs)
    assert torch.autograd.gradcheck(lambda *v: tb.permute_multi_embedding(list(v), perm, ins, outs, ol), xs)


def test_gradcheck_permute_pooled_embs():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    lists = [torch.tensor(v) for v in ([0, 2, 5, 6], [2, 0, 1], [0, 1, 3, 6], [1, 2, 0])]
    assert torch.autograd.gradcheck(lambda x: tb.permute_pooled_embs(x, *lists), (x,))


@pytest.mark.parametrize("flavor", ["ref", "cpu", "cuda"])
@settings(max_examples=10)
@given(case=float64_regroup(), dtype=float_dtypes, seed=st.integers(0, 2**32 - 1))
def test_bridge_gradient_is_the_reference_adjoint(flavor, case, dtype, seed):
    """Every backend's autograd gradient == the oracle's backward (duplicates summed, unused keys 0)."""
    if flavor == "cuda" and not embnum._backend.BACKENDS["cuda"].available():
        pytest.skip("cuda backend unavailable")
    embs, keys, lengths, groups = case
    xs = [tensor(x.astype(dtype)).requires_grad_() for x in embs]
    outs = tb.regroup_keyed_tensor(xs, keys, lengths, groups, backend=flavor)
    assume(outs)
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(tuple(o.shape)).astype(dtype) for o in outs]
    torch.autograd.backward(outs, [tensor(g) for g in grads])
    perm, ins, o_shapes, _ = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    want = embnum.permute_multi_embedding_backward(grads, perm, ins, o_shapes, ins.tolist(), backend="ref")
    for x, w in zip(xs, want):
        got = x.grad.numpy() if x.grad is not None else np.zeros_like(w)
        np.testing.assert_array_equal(got, w)


def test_unused_key_gets_zero_gradient():
    x = torch.randn(4, 5, requires_grad=True)
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[2, 3]], [["b"], ["b"]])
    torch.autograd.backward(out, [torch.ones(4, 3), torch.full((4, 3), 2.0)])
    assert (x.grad[:, :2] == 0).all() and (x.grad[:, 2:] == 3).all()


def test_bfloat16_forward_is_bit_exact():
    x = torch.randn(5, 7).to(torch.bfloat16)
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[3, 4]], [["b", "a"], ["a"]])
    assert out[0].dtype == torch.bfloat16
    assert torch.equal(out[0].view(torch.int16), torch.cat([x[:, 3:], x[:, :3]], 1).view(torch.int16))
    x.requires_grad_()
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[3, 4]], [["b", "a"], ["a"]])
    torch.autograd.backward(out, [torch.ones(5, 7, dtype=torch.bfloat16), torch.ones(5, 3, dtype=torch.bfloat16)])
    assert x.grad.dtype == torch.bfloat16 and (x.grad[:, :3] == 2).all() and (x.grad[:, 3:] == 1).all()


def test_bfloat16_backward_rounds_after_every_addition():
    """A key used three times: ((g1 + g2) rounded + g3) rounded, as fbgemm's CPU kernel does."""
    x = torch.zeros(1, 1, dtype=torch.bfloat16, requires_grad=True)
    outs = tb.regroup_keyed_tensor([x], [["a"]], [[1]], [["a"], ["a"], ["a"]])
    g = [torch.tensor([[v]], dtype=torch.bfloat16) for v in (256.0, 1.0, 1.0)]
    torch.autograd.backward(outs, g)
    assert float(x.grad) == 256.0  # 256 + 1 rounds back to 256 twice; summed at once it would be 258
    rng = np.random.default_rng(0)
    keys, lengths, groups = [["a", "b"], ["c"]], [[3, 2], [4]], [["a", "c", "a"], ["b", "a"], ["c"]]
    xs = [torch.tensor(rng.standard_normal((3, sum(ls))), dtype=torch.bfloat16, requires_grad=True) for ls in lengths]
    outs = tb.regroup_keyed_tensor(xs, keys, lengths, groups)
    gs = [torch.tensor(rng.standard_normal(tuple(o.shape)) * 100, dtype=torch.bfloat16) for o in outs]
    torch.autograd.backward(outs, gs)
    perm = embnum.kt_regroup_arguments(None, keys, lengths, groups)[0].tolist()
    want = [torch.zeros_like(x) for x in xs]
    for i, j, a, c, n, _ in perm:  # the spec, literally
        want[i][:, a : a + n] = (want[i][:, a : a + n].float() + gs[j][:, c : c + n].float()).to(torch.bfloat16)
    for x, w in zip(xs, want):
        assert torch.equal(x.grad.view(torch.int16), w.view(torch.int16))


def test_module_caches_arguments_and_never_concatenates(monkeypatch):
    from embnum.examples.keyed_tensor import CLASSIC_GROUPS, CLASSIC_KEYS

    lengths = [[3, 4], [5, 6, 7], [8]]
    m = PermuteMultiEmbedding(CLASSIC_KEYS, lengths, CLASSIC_GROUPS)
    xs = [torch.randn(4, sum(ls), requires_grad=True) for ls in lengths]
    first = m.arguments("cpu")
    assert all(a is b for a, b in zip(first, m.arguments(torch.device("cpu"))))

    def no(*a, **k):
        raise AssertionError("the module must not concatenate its inputs")

    monkeypatch.setattr(torch, "cat", no)
    monkeypatch.setattr(torch, "concat", no)
    outs = m(xs)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    monkeypatch.undo()
    want = embnum.regroup_keyed_tensor(
        [x.detach().numpy() for x in xs], CLASSIC_KEYS, lengths, CLASSIC_GROUPS, backend="ref"
    )
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o.detach().numpy(), w)
    assert (xs[0].grad[:, :3] == 3).all()  # f1 is used three times
    with pytest.raises(ValueError, match="3 tensors"):
        m(xs[:2])


def test_module_compiles_fullgraph():
    lengths = [[3, 4], [5]]
    m = PermuteMultiEmbedding([["a", "b"], ["c"]], lengths, [["c", "a"], ["a", "b", "a"]])
    xs = [torch.randn(3, sum(ls), requires_grad=True) for ls in lengths]
    step = torch.compile(lambda v: sum(o.square().sum() for o in m(v)), backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(step(xs), xs)
    want = torch.autograd.grad(sum(o.square().sum() for o in m(xs)), xs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_module_on_cuda_keeps_arguments_on_the_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = PermuteMultiEmbedding([["a", "b"]], [[2, 3]], [["b", "a"], ["a"]])
    x = torch.randn(4, 5, device="cuda", requires_grad=True)
    outs = m([x])
    assert all(a.device == x.device for a in m.arguments(x.device))
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert (x.grad[:, :2] == 2).all()


# -- the CUDA C kernel's logic, run on the host through g++ (no GPU here) --------------
_DRIVER = r"""
#include "keyed_tensor.cu"
extern "C" void run_copy(unsigned grid, unsigned block, const i64* segs, i64 S, i64 B, const char* const* srcs,
                         const i64* ss, char* const* dsts, const i64* ds, int itemsize) {
    EMBNUM_LAUNCH(grid, block, kt_copy(segs, S, B, srcs, ss, dsts, ds, itemsize));
}
#define RUN_ACC(NAME) \
extern "C" void run_##NAME(unsigned grid, unsigned block, const i64* slots, i64 E, const i64* srcs, i64 B, \
                           const char* const* grads, const i64* gs, char* const* dsts, const i64* ds) { \
    EMBNUM_LAUNCH(grid, block, NAME(slots, E, srcs, B, grads, gs, dsts, ds)); \
}
RUN_ACC(kt_accumulate_f16)
RUN_ACC(kt_accumulate_f32)
RUN_ACC(kt_accumulate_f64)
"""


@pytest.fixture(scope="module")
def cu_on_host(tmp_path_factory):
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("g++") is None:
        pytest.skip("no g++ to run the CUDA C logic on the host")
    kernels = Path(embnum.__file__).parent / "cuda" / "kernels"
    d = tmp_path_factory.mktemp("cu")
    (d / "driver.cpp").write_text(_DRIVER)
    lib = d / "kt.so"
    shim = Path(__file__).with_name("cu_host_shim.h")
    subprocess.run(
        [
            "g++",
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-include",
            str(shim),
            f"-I{kernels}",
            str(d / "driver.cpp"),
            "-o",
            str(lib),
        ],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(lib))


def _ptrs(arrays):
    from embnum._permute_plan import address

    return np.array([address(a) for a in arrays], np.uint64), np.array([a.strides[0] for a in arrays], np.int64)


def _c(a):
    import ctypes

    return ctypes.c_void_p(a.ctypes.data)


def _run_cu_forward(lib, embs, rows, widths, grid, block):
    import ctypes

    from embnum._permute_plan import copy_indexed

    B, dtype = embs[0].shape[0], embs[0].dtype
    outs = [np.full((B, w), 7, dtype=dtype) for w in widths]
    segs = copy_indexed(np.asarray(rows)[:, :5].tolist(), widths)
    sp, ss = _ptrs(embs)
    dp, ds = _ptrs(outs)
    lib.run_copy(
        ctypes.c_uint(grid),
        ctypes.c_uint(block),
        _c(segs),
        ctypes.c_int64(len(segs)),
        ctypes.c_int64(B),
        _c(sp),
        _c(ss),
        _c(dp),
        _c(ds),
        ctypes.c_int(dtype.itemsize),
    )
    return outs


def _run_cu_backward(lib, grads, rows, widths, grid, block):
    import ctypes

    from embnum._permute_plan import backward_indexed

    B, dtype = grads[0].shape[0], grads[0].dtype
    outs = [np.full((B, w), 7, dtype=dtype) for w in widths]
    slots, srcs = backward_indexed(np.asarray(rows, dtype=np.int64), widths)
    gp, gs = _ptrs(grads)
    dp, ds = _ptrs(outs)
    fn = getattr(
        lib, {2: "run_kt_accumulate_f16", 4: "run_kt_accumulate_f32", 8: "run_kt_accumulate_f64"}[dtype.itemsize]
    )
    fn(
        ctypes.c_uint(grid),
        ctypes.c_uint(block),
        _c(slots),
        ctypes.c_int64(len(slots)),
        _c(srcs),
        ctypes.c_int64(B),
        _c(gp),
        _c(gs),
        _c(dp),
        _c(ds),
    )
    return outs


@st.composite
def cu_cases(draw):
    """Drawn regroupings, with inputs offset by one element (unaligned rows) or not, and a
    small or large grid (grid-stride loops)."""
    keys, lengths, groups = draw(regroupings(max_width=11))
    dtype = np.dtype(draw(float_dtypes))
    B = draw(st.sampled_from([0, 1, 3]))
    shift = draw(st.sampled_from([0, 1]))
    embs = []
    for ls in lengths:
        buf = draw(value_arrays(dtype, (B * (sum(ls) + shift) + shift,), special=False))
        embs.append(buf[shift:].reshape(B, sum(ls) + shift)[:, : sum(ls)] if B else np.zeros((0, sum(ls)), dtype))
    grid, block = draw(st.sampled_from([(1, 32), (3, 64), (64, 128)]))
    return embs, keys, lengths, groups, grid, block


@settings(max_examples=25)
@given(case=cu_cases())
def test_cuda_c_kernels_on_the_host(cu_on_host, case):
    embs, keys, lengths, groups, grid, block = case
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    want = embnum.permute_multi_embedding(embs, perm, ins, outs, ol, backend="ref")
    got = _run_cu_forward(cu_on_host, embs, perm, ol, grid, block)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))
    if ol:
        grads = [np.ascontiguousarray(w) for w in want]
        want_b = embnum.permute_multi_embedding_backward(grads, perm, ins, outs, ins.tolist(), backend="ref")
        got_b = _run_cu_backward(cu_on_host, grads, perm, ins.tolist(), grid, block)
        err, ok = embnum.get_op("permute_multi_embedding_backward").check_fn(got_b, want_b, {})
        assert ok, (got_b, want_b)


def test_cuda_c_source_uses_16_byte_vectors():
    from embnum.cuda._rawkernel import nvrtc_missing

    if nvrtc_missing():
        pytest.skip(nvrtc_missing())

    # NVRTC runs in a child process: compiling inside the test process broke later torch.load calls (see
    # test_cuda_sources.py)
    code = (
        "import sys; from embnum.cuda._rawkernel import KERNELS, compile_ptx; "
        "sys.stdout.write(compile_ptx((KERNELS / 'keyed_tensor.cu').read_text(), 'keyed_tensor.cu'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    ptx = run.stdout
    for entry in ("kt_copy", "kt_accumulate_f16", "kt_accumulate_f32", "kt_accumulate_f64"):
        assert f".entry {entry}" in ptx
    assert "ld.v4.u32" in ptx or "ld.global.v4.u32" in ptx
    assert "st.v4.u32" in ptx or "st.global.v4.u32" in ptx


# -- optional differential tier: fbgemm_gpu (tests/test_ops.py runs FBGEMM) -------------
@st.composite
def fbgemm_regroup(draw, kind="forward"):
    """permute_multi_embedding (``kind`` "forward"), its backward ("backward") or
    regroup_keyed_tensor ("regroup") arguments of drawn regroupings with float32/float16
    values (fbgemm has no float64 kernel), B >= 1, finite values."""
    keys, lengths, groups = draw(regroupings())
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    B = draw(st.integers(1, 4))
    embs = [draw(value_arrays(dtype, (B, sum(ls)), special=False)) for ls in lengths]
    if kind == "regroup":
        return dict(pooled_embs=embs, keys=keys, lengths=lengths, groups=groups)
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups, backend="ref")
    if kind == "forward":
        return pme_args(embs, perm, ins, outs, ol)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((B, w)).astype(dtype) for w in ol]
    return pme_args(grads, perm, ins, outs, ins.tolist(), backward=True)


def _regroup_arguments_same(got, want, args):
    """The three int32 tables and the output lengths (fbgemm's tables may be int64)."""
    tables = all(g.dtype == np.int32 and g.tolist() == w.tolist() for g, w in zip(got[:3], want[:3]))
    return tables and list(got[3]) == list(want[3])


def _pme_peer(fb, a):
    tables = [tensor(a[k]) for k in ("permutes", "in_shapes", "out_shapes")]
    return fb.permute_multi_embedding([tensor(e) for e in a["pooled_embs"]], *tables, a["out_lengths"])


def _pme_backward_peer(fb, a):
    """fbgemm's gradient of its forward; the columns of unused keys (fbgemm leaves them
    uninitialised) are set to 0, embnum's value."""
    import torch

    g0 = tensor(a["grad_outputs"][0])
    xs = [torch.zeros((g0.shape[0], w), dtype=g0.dtype, requires_grad=True) for w in a["in_lengths"]]
    tables = [tensor(a[k]) for k in ("permutes", "in_shapes", "out_shapes")]
    out = fb.permute_multi_embedding(xs, *tables, [g.shape[1] for g in a["grad_outputs"]])
    grads = torch.autograd.grad(out, xs, [tensor(g) for g in a["grad_outputs"]], allow_unused=True)
    result = []
    for i, (x, g) in enumerate(zip(xs, grads)):
        g = torch.zeros_like(x).numpy() if g is None else g.numpy().copy()
        used = np.zeros(g.shape[1], bool)
        for r in a["permutes"].tolist():
            if r[0] == i:
                used[r[2] : r[2] + r[4]] = True
        g[:, ~used] = 0
        result.append(g)
    return result


def _pooled_domain(args):
    """float16/float32 (fbgemm: no float64, no integers), B >= 1."""
    x = np.ascontiguousarray(args["pooled_embs"])
    return dict(args, pooled_embs=x) if x.dtype.kind == "f" and x.dtype != np.float64 and x.shape[0] else None


# permute_pooled_embs' arguments drawn inside fbgemm's domain (filtering the general strategy
# into it rejected so many draws that Hypothesis' filter health check failed now and then)
_POOLED_FBGEMM = pooled_args(dtypes=st.sampled_from([np.dtype(np.float16), np.dtype(np.float32)]), min_batch=1)


FBGEMM = [
    Peer(
        "kt_regroup_arguments",
        lambda fb, a: fb.kt_regroup_arguments(tensor(np.zeros(1)), a["keys"], a["lengths"], a["groups"]),
        same=_regroup_arguments_same,
        strategy=regroupings(max_inputs=4, max_keys=4).map(
            lambda c: dict(embs=None, keys=c[0], lengths=c[1], groups=c[2])
        ),
    ),
    Peer("permute_multi_embedding", _pme_peer, strategy=fbgemm_regroup()),
    Peer(
        "regroup_keyed_tensor",
        lambda fb, a: fb.regroup_keyed_tensor(
            [tensor(e) for e in a["pooled_embs"]], a["keys"], a["lengths"], a["groups"]
        ),
        same="values",
        strategy=fbgemm_regroup("regroup"),
    ),
    Peer(
        "permute_multi_embedding_backward",
        _pme_backward_peer,
        # the backward needs a non-empty output
        lambda a: a if any(g.shape[1] for g in a["grad_outputs"]) else None,
        # == treats -0.0 and 0.0 alike (spec: up to the sign of a zero sum)
        same="values",
        strategy=fbgemm_regroup("backward"),
    ),
    Peer(
        "permute_pooled_embs",
        lambda fb, a: fb.permute_pooled_embs_auto_grad(
            tensor(a["pooled_embs"]), *(tensor(a[k].astype(np.int64)) for k in POOLED_LISTS)
        ),
        _pooled_domain,
        strategy=_POOLED_FBGEMM,
    ),
]


@pytest.mark.fbgemm
@settings(max_examples=40)
@given(args=_POOLED_FBGEMM)
def test_fbgemm_permute_pooled_embs_gradient(args):
    """The bridge's gradient of permute_pooled_embs is fbgemm's (the forward is in FBGEMM)."""
    fbgemm()
    args = _pooled_domain(args)
    assume(args is not None and args["pooled_embs"].size)
    x = args["pooled_embs"]
    lists = [tensor(args[k].astype(np.int64)) for k in POOLED_LISTS]
    g = tensor(np.arange(x.size, dtype=x.dtype).reshape(x.shape))
    grads = []
    for fn in (torch.ops.fbgemm.permute_pooled_embs_auto_grad, tb.permute_pooled_embs):
        xt = tensor(x).requires_grad_()
        grads.append(torch.autograd.grad(fn(xt, *lists), xt, g)[0].numpy())
    np.testing.assert_array_equal(grads[1], grads[0])


@pytest.mark.fbgemm
def test_fbgemm_bfloat16_gradient():
    fb = fbgemm()
    rng = np.random.default_rng(1)
    keys, lengths, groups = [["a", "b"], ["c"]], [[3, 2], [4]], [["a", "c", "a"], ["b", "a"], ["c"]]
    perm, ins, outs, ol = (
        tensor(a) if isinstance(a, np.ndarray) else a for a in embnum.kt_regroup_arguments(None, keys, lengths, groups)
    )
    xs = [torch.tensor(rng.standard_normal((5, sum(ls))), dtype=torch.bfloat16, requires_grad=True) for ls in lengths]
    want = fb.permute_multi_embedding(xs, perm, ins, outs, ol)
    got = tb.permute_multi_embedding(xs, perm, ins, outs, ol)
    gs = [torch.tensor(rng.standard_normal(tuple(o.shape)) * 100, dtype=torch.bfloat16) for o in want]
    for w, g in zip(want, got):
        assert torch.equal(w.view(torch.int16), g.view(torch.int16))
    for a, b in zip(torch.autograd.grad(want, xs, gs), torch.autograd.grad(got, xs, gs)):
        assert torch.equal(a, b)


@settings(max_examples=25)
@given(args=handwritten_args(), data=st.data())
def test_cuda_c_kernels_on_the_host_handwritten_rows(cu_on_host, args, data):
    """Partially overlapping input ranges, uncovered columns, rows in any order."""
    grid, block = data.draw(st.sampled_from([(1, 32), (5, 64)]))
    embs, perm, ol = args["pooled_embs"], args["permutes"].astype(np.int64), args["out_lengths"]
    want = embnum.permute_multi_embedding(**args, backend="ref")
    got = _run_cu_forward(cu_on_host, embs, perm, ol, grid, block)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))
    grads = [np.ascontiguousarray(w) for w in want]
    in_lengths = args["in_shapes"].tolist()
    want_b = embnum.permute_multi_embedding_backward(
        grads, args["permutes"], args["in_shapes"], args["out_shapes"], in_lengths, backend="ref"
    )
    got_b = _run_cu_backward(cu_on_host, grads, perm, in_lengths, grid, block)
    assert embnum.get_op("permute_multi_embedding_backward").check_fn(got_b, want_b, {})[1]


# -- the one-pass verdicts, the caches and the small kernels ------------
_ENTRY = st.one_of(st.integers(-3, 12), st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**62, 2**63 - 1]))


@st.composite
def pooled_lists(draw):
    """Valid ``permute_pooled_embs`` lists, then maybe broken: an entry of one list replaced by a
    drawn value (int64 extremes included), or one list shortened or lengthened; int32 or int64."""
    args = draw(pooled_args())
    lists = [np.asarray(args[k], np.int64).copy() for k in _POOLED]
    if draw(st.booleans()):
        k = draw(st.integers(0, 3))
        if draw(st.booleans()) and lists[k].size:
            lists[k][draw(st.integers(0, lists[k].size - 1))] = draw(_ENTRY)
        else:
            extra = np.array(draw(st.lists(_ENTRY, max_size=2)), np.int64)
            lists[k] = np.concatenate([lists[k][: draw(st.integers(0, lists[k].size))], extra])
    fits = all(np.abs(a).max(initial=0) < 2**31 for a in lists)
    lists = [a.astype(draw(index_dtypes)) if fits else a for a in lists]
    return args["pooled_embs"], lists


_POOLED = ("offset_dim_list", "permute_list", "inv_offset_dim_list", "inv_permute_list")


@given(case=pooled_lists())
def test_pooled_lists_verdict_matches_the_exact_rules(case):
    """``_validate_numba.pooled_lists_ok`` (the compiled verdict of permute_pooled_embs's checks)
    accepts exactly what the Python rules accept; a rejection reruns them, so the message is theirs."""
    from embnum import _validate, _validate_numba
    from embnum.ops import keyed_tensor as ops_kt

    x, lists = case
    try:
        ops_kt._pooled_rules(x.shape[1], lists)
        exact = None
    except ValueError as e:
        exact = str(e)
    assert bool(_validate_numba.pooled_lists_ok(*lists, x.shape[1])) == (exact is None)
    try:
        embnum.permute_pooled_embs(x, *lists)
        fast = None
    except ValueError as e:
        fast = str(e)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_validate, "compiled", lambda: None)
        try:
            embnum.permute_pooled_embs(x, *lists)
            slow = None
        except ValueError as e:
            slow = str(e)
    assert fast == slow == exact


@pytest.mark.parametrize("name", FAMILY)
@given(data=st.data())
def test_small_kernels_match_the_parallel_plan(name, data):
    """The small-call kernels (the arrays themselves, the cached indexed plan, one thread) give the
    same bits as the addressed parallel kernels (``SMALL_BYTES = 0`` forces those)."""
    from embnum.cpu import keyed_tensor as cpu_kt

    args = data.draw(STRATEGIES[name])
    small = getattr(embnum, name)(**args)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_kt, "SMALL_BYTES", 0)
        big = getattr(embnum, name)(**args)
    for a, b in zip(
        small if isinstance(small, (list, tuple)) else [small], big if isinstance(big, (list, tuple)) else [big]
    ):
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
        else:
            assert a == b


def test_validated_permutes_changed_in_place_are_checked_again():
    args = pme_args(
        [np.ones((2, 3), np.float32)], *embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b", "a"]])[:3], [3]
    )
    embnum.permute_multi_embedding(**args)
    args["permutes"][0, 4] = 3  # the row now reaches past its input's width
    with pytest.raises(ValueError, match="exceeds the width"):
        embnum.permute_multi_embedding(**args)


@pytest.mark.parametrize("bad", [2.0, True, np.float64(2.0)])
def test_validated_key_lists_do_not_admit_equal_non_ints(bad):
    """A cached verdict on ``[[1, 2]]`` is never reused for ``[[1, 2.0]]`` or ``[[1, True]]``."""
    embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b"]])
    embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 1]], [["b"]])
    with pytest.raises(TypeError, match=r"lengths\[0\]\[1\]"):
        embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, bad]], [["b"]])


@pytest.mark.parametrize("readonly", [(0,), (1,), (0, 1)])
def test_small_kernels_take_read_only_inputs_alike_or_mixed(readonly):
    """The small kernels take a tuple of one Numba type: a mix of read-only and writable inputs
    goes to the addressed kernel, all read-only ones to the small one; the same bits either way."""
    keys, lengths, groups = [["a", "b"], ["c"]], [[1, 2], [2]], [["c", "a"], ["b"]]
    embs = [np.arange(6.0).reshape(2, 3), np.arange(4.0).reshape(2, 2) + 10]
    for i in readonly:
        embs[i].flags.writeable = False
    args = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    got = embnum.permute_multi_embedding(embs, *args)
    want = embnum.permute_multi_embedding(embs, *args, backend="ref")
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    back = embnum.permute_multi_embedding_backward([g.copy() for g in got], *args[:3], [3, 2])
    assert [b.shape for b in back] == [(2, 3), (2, 2)]


@pytest.mark.parametrize("fn", ["permute_multi_embedding", "permute_multi_embedding_backward"])
@pytest.mark.parametrize(
    "change",
    [
        ("permutes", lambda a: a.view(a.dtype.newbyteorder()), TypeError, "permutes"),
        ("permutes", lambda a: a.reshape(-1), ValueError, "permutes"),
        ("in_shapes", lambda a: a.reshape(-1, 1), ValueError, "in_shapes"),
        ("out_shapes", lambda a: a.reshape(1, -1), ValueError, "out_shapes"),
        ("out_shapes", lambda a: a.view(np.uint32 if a.dtype == np.int32 else np.uint64), TypeError, "out_shapes"),
    ],
)
def test_cached_permute_verdict_never_skips_the_array_checks(fn, change):
    """A validated (permutes, in_shapes, out_shapes) is cached by dtype, shape and bytes: arrays
    with the same bytes but another byte order, signedness or shape still fail the array checks,
    with their usual errors (a hit skips those checks, so the key must tell them apart)."""
    name, alter, error, match = change
    args = list(embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b", "a"]]))
    embs = [np.ones((2, 3), np.float32)]
    call = getattr(embnum, fn)
    lengths = [3]
    call(embs, *args[:3], lengths)  # validated and cached
    where = {"permutes": 0, "in_shapes": 1, "out_shapes": 2}[name]
    bad = alter(np.asarray(args[where]))
    assert bad.tobytes() == np.asarray(args[where]).tobytes()
    args[where] = bad
    with pytest.raises(error, match=match):
        call(embs, *args[:3], lengths)
