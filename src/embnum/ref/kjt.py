"""NumPy oracle of the KeyedJaggedTensor family (``docs/families/kjt.md``).

Arguments arrive validated (``embnum.ops.kjt``). Plain and obviously right:
segments are cut with int64 offsets and concatenated; bucketization applies
the bucket rule of ``docs/families/kjt.md`` to every id, vectorised per key.
"""

from __future__ import annotations

import numpy as np


def _offsets(sizes):
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def _gather_segments(data, offs, seg, dtype):
    """Segments ``seg[0], seg[1], ...`` of ``data`` (cut at ``offs``), concatenated."""
    parts = [data[offs[s] : offs[s + 1]] for s in seg]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _permute(permute, lengths, values, weights, total, sizes):
    offs = _offsets(sizes)
    out_lengths = lengths[permute].copy()
    out_values = _gather_segments(values, offs, permute, values.dtype)
    out_weights = None if weights is None else _gather_segments(weights, offs, permute, weights.dtype)
    return out_lengths, out_values, out_weights


def permute_2d_sparse_data(permute, lengths, values, weights, total):
    return _permute(permute, lengths, values, weights, total, lengths.sum(axis=1, dtype=np.int64))


def permute_1d_sparse_data(permute, lengths, values, weights, total):
    return _permute(permute, lengths, values, weights, total, lengths)


# -- block bucketize --------------------------------------------------------
def _bucket_and_id(u, bs, G, my_size, pos, w):
    """The bucket rule (docs/families/kjt.md) for the unsigned ids ``u`` (uint64) of one key; returns
    ``(bucket, new)`` as uint64 arrays."""
    bs, G, m = np.uint64(bs), np.uint64(G), np.uint64(my_size)
    Lb = G // m
    if pos is None:
        inside = u < bs * G
        width = max(bs * Lb, np.uint64(1))  # only used where inside (bs > 0 there)
        bucket = np.where(inside, u // width, (u % G) // Lb)
        new = np.where(inside, u % width, u // G)
        return bucket, new
    p = pos.astype(np.uint64)
    if bs > 0:
        key = u
    else:
        mask = np.uint64(2**w - 1)
        key = (((u % G) * p[my_size]) & mask) // G  # wraps at w bits, as fbgemm
    j = np.searchsorted(p, key, side="right").astype(np.int64) - 1
    inb = j < my_size
    jj = np.minimum(j, my_size - 1)
    bucket = np.where(inb, j.astype(np.uint64), u % m)
    if bs == 0:
        new = u // G
    else:
        new = np.where(inb, u - p[jj], u // m)
    return bucket, new


def block_bucketize_sparse_features(
    lengths,
    indices,
    weights,
    block_sizes,
    my_size,
    batch,
    total_num_blocks,
    pos,
    keep,
    bucketize_pos,
    sequence,
    bucket_mapping,
):
    N, n_bags = indices.shape[0], lengths.shape[0]
    w = 8 * indices.dtype.itemsize
    unsigned = np.uint32 if w == 32 else np.uint64
    offs = _offsets(lengths)
    bag_key = np.repeat(np.arange(len(batch)), batch)
    elem_bag = np.repeat(np.arange(n_bags), lengths)
    elem_key = bag_key[elem_bag] if N else np.zeros(0, np.int64)
    u = np.ascontiguousarray(indices).view(unsigned).astype(np.uint64)
    bucket = np.zeros(N, np.int64)
    new = np.zeros(N, indices.dtype)
    with np.errstate(over="ignore"):
        for t in range(len(batch)):
            sel = elem_key == t
            if not sel.any():
                continue
            b, nw = _bucket_and_id(
                u[sel], block_sizes[t], total_num_blocks[t], my_size, None if pos is None else pos[t], w
            )
            bucket[sel] = b.astype(np.int64)
            new[sel] = indices[sel] if keep[t] else nw.astype(unsigned).view(indices.dtype)
    # stable order: bucket, then bag, then input position
    order = np.lexsort((np.arange(N), elem_bag, bucket))
    counts = np.zeros((my_size, n_bags), np.int64)
    np.add.at(counts, (bucket, elem_bag), 1)
    new_lengths = counts.reshape(-1).astype(lengths.dtype)
    new_indices = new[order]
    new_weights = None if weights is None else weights[order]  # [N] or [N, weights_dim] rows
    new_pos = (np.arange(N) - offs[elem_bag])[order].astype(indices.dtype) if bucketize_pos else None
    unbucketize = None
    if sequence:
        unbucketize = np.empty(N, indices.dtype)
        unbucketize[order] = np.arange(N)
    result = (new_lengths, new_indices, new_weights, new_pos, unbucketize)
    if bucket_mapping is None:  # the five results of block_bucketize_sparse_features
        return result
    return result + (bucket.astype(indices.dtype) if bucket_mapping else None,)


# -- keyed index select ----------------------------------------------------------
def _selected_bags(n_bags, batch_size, indices):
    T = n_bags // batch_size
    return (np.arange(T)[:, None] * batch_size + indices[None, :].astype(np.int64)).reshape(-1)


def keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size, weights, total):
    seg = _selected_bags(lengths.shape[0], batch_size, indices)
    offs = offsets.astype(np.int64)
    out = [_gather_segments(values, offs, seg, values.dtype), lengths[seg].copy()]
    if weights is not None:
        out.append(_gather_segments(weights, offs, seg, weights.dtype))
    return out


def expand_into_jagged_permute(permute, input_offset, output_offset):
    parts = [
        np.arange(int(input_offset[p]), int(input_offset[p]) + int(output_offset[t + 1] - output_offset[t]))
        for t, p in enumerate(permute)
    ]
    return np.concatenate(parts).astype(input_offset.dtype) if parts else np.zeros(0, input_offset.dtype)


def invert_permute(permute):
    out = np.empty_like(permute)
    out[permute] = np.arange(permute.shape[0], dtype=permute.dtype)
    return out


def jagged_unique_indices(tables, B, offsets, indices):
    offs = offsets.astype(np.int64)
    nb = offs.shape[0] - 1
    lengths = np.zeros(nb, np.int64)
    uniques, reverse = [], np.zeros(indices.shape[0], np.int64)
    base = 0
    for a, b in tables:
        lo, hi = offs[a * B], offs[b * B]
        u, inv = np.unique(indices[lo:hi], return_inverse=True)
        uniques.append(u)
        reverse[lo:hi] = base + inv.reshape(-1)
        base += u.shape[0]
        n, c = (b - a) * B, u.shape[0]
        if n:
            lengths[a * B : b * B] = c // n + (np.arange(n) < c % n)
    unique = np.concatenate(uniques).astype(indices.dtype) if uniques else np.zeros(0, indices.dtype)
    out_lengths = lengths.astype(offsets.dtype)
    return out_lengths, _offsets(lengths).astype(offsets.dtype), unique, reverse
