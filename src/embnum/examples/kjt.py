"""Tour and benchmark inputs of the kjt family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.kjt import (
    block_bucketize_sparse_features,
    block_bucketize_sparse_features_2d_weights,
    block_bucketize_sparse_features_inference,
    expand_into_jagged_permute,
    invert_permute,
    jagged_unique_indices,
    keyed_jagged_index_select_dim1,
    permute_1d_sparse_data,
    permute_2d_sparse_data,
)


def _kjt(rng, T, B, mean_len, dtype=np.int64, id_range=10_000, lengths_dtype=np.int32):
    lengths = rng.poisson(mean_len, T * B).astype(lengths_dtype)
    n = int(lengths.sum())
    return lengths, rng.integers(0, id_range, n).astype(dtype)


def _size(size, small, large):
    return small if size == "small" else large


def _permuted(rng, size, small_T, segments):
    """A weighted KJT and a permutation of its ``T`` features (``lengths [T, B]``) or, with
    ``segments``, of its ``T * B`` segments (``lengths [T * B]``)."""
    T, B = _size(size, (small_T, 3), (26, 4096))
    lengths, values = _kjt(rng, T, B, _size(size, 2, 20))
    w = rng.random(values.shape[0], dtype=np.float32)
    if segments:
        permute, label = rng.permutation(T * B), f"S={T * B} weights"
    else:
        permute, lengths, label = rng.permutation(T), lengths.reshape(T, B), f"T={T} B={B} weights"
    return Example(dict(permute=permute, lengths=lengths, values=values, weights=w), label)


example(permute_2d_sparse_data)(lambda rng, size: _permuted(rng, size, 4, segments=False))
example(permute_1d_sparse_data)(lambda rng, size: _permuted(rng, size, 3, segments=True))


@example(block_bucketize_sparse_features)
def _bucketize(rng, size):
    T, B, my_size = _size(size, (3, 4, 3), (26, 4096, 8))
    lengths, ids = _kjt(rng, T, B, _size(size, 3, 20), id_range=_size(size, 40, 1_200_000))
    bs = rng.integers(_size(size, 5, 100_000), _size(size, 12, 150_000), T).astype(np.int64)
    w = rng.random(ids.shape[0], dtype=np.float32)
    args = dict(
        lengths=lengths, indices=ids, bucketize_pos=True, sequence=True, block_sizes=bs, my_size=my_size, weights=w
    )
    return Example(args, f"T={T} B={B} my_size={my_size} seq")


@example(block_bucketize_sparse_features_2d_weights)
def _(rng, size):
    ex = _bucketize(rng, size)
    n, D = ex.args["indices"].shape[0], 4
    w = rng.random((n, D), dtype=np.float32)
    return Example(dict(ex.args, weights=w, weights_dim=D), ex.label + f" weights [N, {D}]")


@example(block_bucketize_sparse_features_inference)
def _(rng, size):
    ex = _bucketize(rng, size)
    return Example(dict(ex.args, return_bucket_mapping=True), ex.label + " bucket_mapping")


@example(keyed_jagged_index_select_dim1)
def _(rng, size):
    T, B = _size(size, (3, 4), (26, 1024))
    lengths, values = _kjt(rng, T, B, _size(size, 2, 20))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    indices = rng.integers(0, B, _size(size, 3, 512))
    w = rng.random(values.shape[0], dtype=np.float32)
    args = dict(
        values=values, lengths=lengths.astype(np.int64), offsets=offsets, indices=indices, batch_size=B, weights=w
    )
    return Example(args, f"T={T} B={B} n={indices.shape[0]}")


@example(expand_into_jagged_permute)
def _(rng, size):
    T = _size(size, 6, 26 * 4096)
    sizes = rng.poisson(_size(size, 2, 20), T)
    perm = rng.permutation(T)
    inp = np.concatenate([[0], np.cumsum(sizes)])
    outp = np.concatenate([[0], np.cumsum(sizes[perm])])
    return Example(dict(permute=perm, input_offset=inp, output_offset=outp, output_size=int(outp[-1])), f"T={T}")


@example(invert_permute)
def _(rng, size):
    n = _size(size, 10, 1_000_000)
    return Example(dict(permute=rng.permutation(n)), f"n={n}")


@example(jagged_unique_indices)
def _(rng, size):
    T, B = _size(size, (3, 2), (26, 4096))
    hs = rng.integers(_size(size, 5, 1000), _size(size, 10, 100_000), T)
    hsc = np.concatenate([[0], np.cumsum(hs)])
    lengths = rng.poisson(_size(size, 2, 20), T * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    feat = np.repeat(np.repeat(np.arange(T), B), lengths)
    ids = (rng.random(feat.shape[0]) * hs[feat]).astype(np.int64)
    args = dict(hash_size_cumsum=hsc, hash_size_offsets=np.arange(T + 1), offsets=offsets, indices=ids)
    return Example(args, f"T={T} B={B}")
