"""Tour and benchmark inputs of the index_select family (``@example``; see ``embnum.examples``):
TorchRec's shapes, pooled embeddings of ``T`` features reordered over a batch."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.index_select import (
    batch_index_select_dim0,
    batch_index_select_dim0_backward,
    group_index_select_dim0,
    jagged_index_select_2d,
)

_SIZES = {"small": dict(T=3, B=6, D=5), "large": dict(T=26, B=4096, D=128)}


@example(group_index_select_dim0)
def _(rng, size):
    s = _SIZES[size]
    embs = [rng.standard_normal((s["B"], s["D"] + t)).astype(np.float32) for t in range(s["T"])]
    idx = [rng.integers(0, s["B"], s["B"]) for _ in range(s["T"])]
    return Example(dict(input_group=embs, indices_group=idx), f"{s['T']} x [{s['B']}, ~{s['D']}] float32")


def _batch(rng, size):
    s = _SIZES[size]
    T, B = s["T"], s["B"]
    rows = rng.integers(1, B + 1, T)
    cols = np.full(T, s["D"])
    idx = np.concatenate([rng.integers(0, r, B) for r in rows])
    lists = dict(input_num_indices=[B] * T, input_rows=rows.tolist(), input_columns=cols.tolist())
    return idx, lists, int((rows * cols).sum()), T * B * s["D"], f"{T} tables, B = {B}, D = {s['D']}"


@example(batch_index_select_dim0)
def _(rng, size):
    idx, lists, n_in, _, label = _batch(rng, size)
    inputs = rng.standard_normal(n_in).astype(np.float32)
    return Example(dict(inputs=inputs, indices=idx, **lists, permute_output_dim_0_1=True), label)


@example(batch_index_select_dim0_backward)
def _(rng, size):
    idx, lists, _, n_out, label = _batch(rng, size)
    grad = rng.standard_normal(n_out).astype(np.float32)
    return Example(dict(grad_output=grad, indices=idx, **lists, permute_output_dim_0_1=True), label)


@example(jagged_index_select_2d)
def _(rng, size):
    s = _SIZES[size]
    n_seg = s["T"] * s["B"]  # pool rows of T features each, as a KeyedJaggedTensorPool stores them
    ends = np.cumsum(rng.integers(0, 2 * s["D"], n_seg))
    values = rng.integers(0, 2**40, (int(ends[-1]), 1))
    picked = rng.integers(0, n_seg, n_seg)
    lengths = np.diff(ends, prepend=0)[picked]
    args = dict(values=values, indices=picked, input_offsets=ends, output_offsets=np.cumsum(lengths))
    return Example(args, f"{len(picked)} of {n_seg} segments, int64 ids")
