"""Numba host kernels of the KeyedJaggedTensor family.

Each function takes the validated arguments of its op (``embnum.ops.kjt``)
plus ``out`` (a tuple/list of uninitialised arrays, ``None`` where an output
is not requested) and fills every requested output. Values and weights are
moved as unsigned integers of their width (``bits``): bit-exact and few
compiled specialisations. Block bucketize is count -> scan -> scatter, one
bag per parallel iteration, so the order inside a (bucket, bag) group is the
input order and the result does not depend on the thread count.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import _bucketize
from ._common import bits, int64s

bucket_of = njit(cache=True, inline="always")(_bucketize.bucket_of)
CHUNK = 1 << 15  # output elements per parallel work item of a segment gather


# -- segment gather (both permutes, keyed index select) ------------------------
@njit(cache=True)
def _exclusive_into(sizes, offs):
    """``offs[0] = 0``, ``offs[k+1] = sizes[0] + ... + sizes[k]`` (int64)."""
    acc = np.int64(0)
    offs[0] = 0
    for k in range(sizes.shape[0]):
        acc += sizes[k]
        offs[k + 1] = acc


@njit(cache=True, parallel=True)
def _gather(src, src_offs, seg, dst_offs, dst):
    """Output segment ``j`` = source segment ``seg[j]``. Work is split into
    equal chunks of the output, so a few huge or many tiny segments balance."""
    total = dst.shape[0]
    n_seg = seg.shape[0]
    for c in prange((total + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        hi = min(lo + CHUNK, total)
        a, b = 0, n_seg  # the last j with dst_offs[j] <= lo
        while b - a > 1:
            mid = (a + b) // 2
            if dst_offs[mid] <= lo:
                a = mid
            else:
                b = mid
        j = a
        pos = lo
        while pos < hi:
            while dst_offs[j + 1] <= pos:
                j += 1
            end = min(dst_offs[j + 1], hi)
            shift = src_offs[seg[j]] - dst_offs[j]
            for e in range(pos, end):
                dst[e] = src[e + shift]
            pos = end


def _gather_segments(data, src_offs, seg, dst_offs, dst):
    if dst.shape[0]:
        _gather(bits(data), src_offs, seg, dst_offs, dst.view(bits(dst).dtype))


def _offsets_of(sizes):
    offs = np.empty(sizes.shape[0] + 1, np.int64)
    _exclusive_into(np.ascontiguousarray(sizes, dtype=np.int64), offs)
    return offs


def _permute(permute, values, weights, sizes, out):
    seg = int64s(permute)
    src_offs = _offsets_of(sizes)
    dst_offs = _offsets_of(sizes[seg])
    _gather_segments(values, src_offs, seg, dst_offs, out[1])
    if weights is not None:
        _gather_segments(weights, src_offs, seg, dst_offs, out[2])


def permute_2d_sparse_data(permute, lengths, values, weights, total, out):
    np.take(lengths, permute, axis=0, out=out[0])
    _permute(permute, values, weights, lengths.sum(axis=1, dtype=np.int64), out)


def permute_1d_sparse_data(permute, lengths, values, weights, total, out):
    np.take(lengths, permute, out=out[0])
    _permute(permute, values, weights, int64s(lengths), out)


def keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size, weights, total, out):
    T = lengths.shape[0] // batch_size
    seg = (np.arange(T, dtype=np.int64)[:, None] * batch_size + int64s(indices)[None, :]).reshape(-1)
    np.take(lengths, seg, out=out[1])
    src_offs = int64s(offsets)
    dst_offs = _offsets_of(out[1])
    _gather_segments(values, src_offs, seg, dst_offs, out[0])
    if weights is not None:
        _gather_segments(weights, src_offs, seg, dst_offs, out[2])


# -- block bucketize -------------------------------------------------------------
@njit(cache=True, parallel=True)
def _bucket_count(offs, uidx, bag_key, bs, G, mu, pos, has_pos, mask, counts):
    """``counts[p * n_bags + k]`` = ids of bag ``k`` that go to bucket ``p``."""
    n_bags = bag_key.shape[0]
    m = np.int64(mu)
    stride = m + 1
    for k in prange(n_bags):
        t = bag_key[k]
        for p in range(m):
            counts[p * n_bags + k] = 0
        for i in range(offs[k], offs[k + 1]):
            b, _ = bucket_of(np.uint64(uidx[i]), bs[t], G[t], mu, pos, t * stride, has_pos, mask)
            counts[b * n_bags + k] += 1


@njit(cache=True, parallel=True)
def _bucket_scatter(offs, uidx, bag_key, bs, G, mu, pos, has_pos, mask, keep, cursor, new_idx, want_pos, new_pos, want_dst, dst):
    """Second pass: every id to its slot ``cursor[bucket * n_bags + bag]++``, in input order."""
    n_bags = bag_key.shape[0]
    stride = np.int64(mu) + 1
    for k in prange(n_bags):
        t = bag_key[k]
        start = offs[k]
        for i in range(start, offs[k + 1]):
            u = np.uint64(uidx[i])
            b, nw = bucket_of(u, bs[t], G[t], mu, pos, t * stride, has_pos, mask)
            slot = cursor[b * n_bags + k]
            cursor[b * n_bags + k] = slot + 1
            new_idx[slot] = u if keep[t] else nw
            if want_pos:
                new_pos[slot] = i - start
            if want_dst:
                dst[i] = slot


@njit(cache=True, parallel=True)
def _scatter_to(src, dst_index, dst):
    for i in prange(src.shape[0]):
        dst[dst_index[i]] = src[i]


def block_bucketize_sparse_features(
    lengths, indices, weights, block_sizes, my_size, batch, total_num_blocks, pos, keep, bucketize_pos, sequence, out
):
    new_lengths, new_indices, new_weights, new_pos, unbucketize = out
    n_bags, N = lengths.shape[0], indices.shape[0]
    offs = _offsets_of(lengths)
    bag_key = np.repeat(np.arange(batch.shape[0], dtype=np.int64), batch)
    uidx = bits(indices)
    mask = np.uint64(2 ** (8 * indices.dtype.itemsize) - 1)
    params = (
        block_sizes.astype(np.uint64),
        total_num_blocks.astype(np.uint64),
        np.uint64(my_size),
        np.zeros(0, np.uint64) if pos is None else pos.reshape(-1).astype(np.uint64),
        pos is not None,
        mask,
    )
    cursor = np.empty(my_size * n_bags, np.int64)
    if n_bags:
        _bucket_count(offs, uidx, bag_key, *params, cursor)
    new_lengths[...] = cursor
    cursor = _offsets_of(cursor)[:-1]
    want_dst = sequence or weights is not None
    dst = np.empty(N if want_dst else 0, np.int64)
    pos_out = new_pos if bucketize_pos else np.empty(0, indices.dtype)
    if n_bags:
        _bucket_scatter(offs, uidx, bag_key, *params, keep, cursor, new_indices.view(uidx.dtype), bucketize_pos, pos_out, want_dst, dst)
    if weights is not None and N:
        _scatter_to(bits(weights), dst, new_weights.view(bits(new_weights).dtype))
    if sequence:
        unbucketize[...] = dst


# -- small permutation ops ---------------------------------------------------------
@njit(cache=True, parallel=True)
def _expand(permute, io, oo, out):
    for t in prange(permute.shape[0]):
        base = io[permute[t]]
        o = oo[t]
        for i in range(oo[t + 1] - o):
            out[o + i] = base + i


def expand_into_jagged_permute(permute, input_offset, output_offset, out):
    if permute.shape[0]:
        _expand(int64s(permute), int64s(input_offset), int64s(output_offset), out)


@njit(cache=True, parallel=True)
def _invert(permute, out):
    for i in prange(permute.shape[0]):
        out[permute[i]] = i


def invert_permute(permute, out):
    _invert(np.ascontiguousarray(permute), out)


# -- unique ids per table -----------------------------------------------------------
@njit(cache=True, parallel=True)
def _sort_tables(ids, bounds, order, counts):
    """Per table ``g`` (ids ``bounds[g]:bounds[g+1]``): a stable sort order and the
    number of distinct ids."""
    for g in prange(bounds.shape[0] - 1):
        lo, hi = bounds[g], bounds[g + 1]
        o = np.argsort(ids[lo:hi], kind="mergesort")
        c = 0
        for r in range(hi - lo):
            order[lo + r] = lo + o[r]
            if r == 0 or ids[lo + o[r]] != ids[lo + o[r - 1]]:
                c += 1
        counts[g] = c


@njit(cache=True, parallel=True)
def _emit_unique(ids, bounds, order, base, unique, reverse):
    for g in prange(bounds.shape[0] - 1):
        lo, hi = bounds[g], bounds[g + 1]
        rank = base[g] - 1
        for r in range(hi - lo):
            i = order[lo + r]
            if r == 0 or ids[i] != ids[order[lo + r - 1]]:
                rank += 1
                unique[rank] = ids[i]
            reverse[i] = rank


def jagged_unique_indices(tables, B, offsets, indices, out):
    out_lengths, out_offsets, unique, reverse = out
    offs = int64s(offsets)
    ids = np.ascontiguousarray(indices)
    bounds = np.array([offs[a * B] for a, _ in tables] + [offs[tables[-1][1] * B]], np.int64)
    order = np.empty(ids.shape[0], np.int64)
    counts = np.empty(len(tables), np.int64)
    _sort_tables(ids, bounds, order, counts)
    base = _offsets_of(counts)
    _emit_unique(ids, bounds, order, base, unique, reverse)
    lengths = np.zeros(offs.shape[0] - 1, np.int64)
    for g, (a, b) in enumerate(tables):
        n, c = (b - a) * B, int(counts[g])
        if n:
            lengths[a * B : b * B] = c // n + (np.arange(n) < c % n)
    out_lengths[...] = lengths
    out_offsets[...] = _offsets_of(lengths)
