"""Tour and benchmark inputs of the tbe family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.tbe import (
    TBEOptimizer,
    tbe_backward,
    tbe_backward_sparse,
    tbe_backward_update,
    tbe_forward,
    tbe_grad_per_sample_weights,
    tbe_layout,
)

_SIZES = {
    "small": dict(T=3, rows=50, D=8, B=6, L=4),
    "large": dict(T=8, rows=20_000, D=128, B=512, L=20),  # the benchmark's shape, scaled down
}


def make_batch(rng, T, rows, D, B, L, *, dtype=np.float32, index_dtype=np.int64, feature_table_map=None):
    """A TBE batch like a recsys model's: ``T`` tables of ``rows x D``, bag lengths around ``L``
    (Poisson), ids skewed towards small rows (so duplicates occur). Returns a dict of the
    forward's arguments (``pooling_mode`` left out)."""
    n_tables = T if feature_table_map is None else max(feature_table_map) + 1
    lay = tbe_layout([rows] * n_tables, [D] * n_tables, feature_table_map)
    Tf = lay.weights_offsets.shape[0]
    lengths = rng.poisson(L, size=Tf * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype)
    u = rng.random(int(offsets[-1]))
    indices = np.minimum((u**2 * rows).astype(np.int64), rows - 1).astype(index_dtype)
    weights = (rng.standard_normal(lay.num_weights, dtype=np.float32) * 0.1).astype(dtype)
    return dict(weights=weights, **lay.by_name(), indices=indices, offsets=offsets)


def _label(s, extra=""):
    return f"T={s['T']} {s['rows']}x{s['D']} B={s['B']} L~{s['L']}{extra}"


@example(tbe_forward)
def _(rng, size):
    s = _SIZES[size]
    return Example(dict(make_batch(rng, **s), pooling_mode="sum"), _label(s, " sum"))


def _with_grad(rng, size):
    s = _SIZES[size]
    a = make_batch(rng, **s)
    a["grad_output"] = rng.standard_normal((s["B"], s["T"] * s["D"]), dtype=np.float32)
    return s, a


@example(tbe_backward)
def _(rng, size):
    s, a = _with_grad(rng, size)
    return Example(dict(a, pooling_mode="mean"), _label(s, " mean"))


@example(tbe_backward_sparse)
def _(rng, size):
    s, a = _with_grad(rng, size)
    return Example(dict(a, pooling_mode="sum"), _label(s, " sum"))


@example(tbe_grad_per_sample_weights)
def _(rng, size):
    s, a = _with_grad(rng, size)
    return Example(a, _label(s))


@example(tbe_backward_update)
def _(rng, size):
    s, a = _with_grad(rng, size)
    m1 = np.zeros(int(a["hash_size_cumsum"][-1]), dtype=np.float32)
    opt = TBEOptimizer("rowwise_adagrad", learning_rate=0.05, weight_decay=1e-4, weight_decay_mode="decoupled")
    return Example(dict(a, pooling_mode="sum", optimizer=opt, momentum1=m1), _label(s, " rowwise adagrad"))
