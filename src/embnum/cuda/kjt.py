"""Numba-CUDA kernels of the KeyedJaggedTensor family.

Same contract as ``embnum.cpu.kjt``. Segment gathers run one block per
output segment (grid-stride), threads striding over its elements. Block
bucketize is count -> scan -> scatter: one thread per bag counts its ids per
bucket, a device scan turns the bucket-major counts into slots, and the same
thread walks its bag again in input order, so the order inside every
(bucket, bag) group is the input order and results are identical on every
run (fbgemm's CUDA kernel gives up that order when ``sequence=False``).
Index bounds were checked by the declaration, so no kernel reads out of range.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _bucketize
from ._common import TPB, bits, blocks, contiguous, inclusive_scan, int64s, launch, to_host, xp

bucket_of = cuda.jit(device=True)(_bucketize.bucket_of)


def _complete(sizes):
    """int64 ``[n + 1]`` offsets (leading 0) of the device array ``sizes``."""
    m = xp()
    offs = m.zeros(sizes.shape[0] + 1, dtype=np.int64)
    if sizes.shape[0]:
        offs[1:] = inclusive_scan(int64s(sizes))
    return offs


# -- segment gathers ---------------------------------------------------------------
@cuda.jit(cache=True)
def _gather(src, src_offs, seg, dst_offs, dst):
    for j in range(cuda.blockIdx.x, seg.shape[0], cuda.gridDim.x):
        base = src_offs[seg[j]]
        lo = dst_offs[j]
        for e in range(lo + cuda.threadIdx.x, dst_offs[j + 1], cuda.blockDim.x):
            dst[e] = src[base + e - lo]


def _gather_segments(data, src_offs, seg, dst_offs, dst):
    if dst.shape[0] and seg.shape[0]:
        launch(_gather, blocks(seg.shape[0]), TPB, bits(data), src_offs, seg, dst_offs, dst.view(bits(dst).dtype))


def _permute(permute, values, weights, sizes, out):
    seg = int64s(permute)
    src_offs = _complete(sizes)
    dst_offs = _complete(sizes[seg])
    _gather_segments(values, src_offs, seg, dst_offs, out[1])
    if weights is not None:
        _gather_segments(weights, src_offs, seg, dst_offs, out[2])


def permute_2d_sparse_data(permute, lengths, values, weights, total, out):
    out[0][...] = xp().take(lengths, int64s(permute), axis=0)
    _permute(permute, values, weights, lengths.sum(axis=1, dtype=np.int64), out)


def permute_1d_sparse_data(permute, lengths, values, weights, total, out):
    out[0][...] = xp().take(lengths, int64s(permute))
    _permute(permute, values, weights, int64s(lengths), out)


def keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size, weights, total, out):
    m = xp()
    T = lengths.shape[0] // batch_size
    seg = (m.arange(T, dtype=np.int64)[:, None] * batch_size + int64s(indices)[None, :]).reshape(-1)
    out[1][...] = m.take(lengths, seg)
    src_offs = int64s(offsets)
    dst_offs = _complete(out[1])
    _gather_segments(values, src_offs, seg, dst_offs, out[0])
    if weights is not None:
        _gather_segments(weights, src_offs, seg, dst_offs, out[2])


# -- block bucketize -------------------------------------------------------------------
@cuda.jit(cache=True)
def _bucket_count(offs, uidx, bag_key, kc, mu, pos, has_pos, mask, counts):
    n_bags = bag_key.shape[0]
    m = np.int64(mu)
    for k in range(cuda.grid(1), n_bags, cuda.gridsize(1)):
        t = bag_key[k]
        bs, G, lb, width, limit = kc[5 * t], kc[5 * t + 1], kc[5 * t + 2], kc[5 * t + 3], kc[5 * t + 4]
        for p in range(m):
            counts[p * n_bags + k] = 0
        for i in range(offs[k], offs[k + 1]):
            b, nw = bucket_of(np.uint64(uidx[i]), bs, G, lb, width, limit, t, mu, pos, has_pos, mask)
            counts[b * n_bags + k] += 1


@cuda.jit(cache=True)
def _bucket_scatter(
    offs, uidx, bag_key, kc, mu, pos, has_pos, mask, keep, cursor, new_idx, want_pos, new_pos, want_dst, dst
):
    n_bags = bag_key.shape[0]
    for k in range(cuda.grid(1), n_bags, cuda.gridsize(1)):
        t = bag_key[k]
        bs, G, lb, width, limit = kc[5 * t], kc[5 * t + 1], kc[5 * t + 2], kc[5 * t + 3], kc[5 * t + 4]
        start = offs[k]
        for i in range(start, offs[k + 1]):
            u = np.uint64(uidx[i])
            b, nw = bucket_of(u, bs, G, lb, width, limit, t, mu, pos, has_pos, mask)
            slot = cursor[b * n_bags + k]
            cursor[b * n_bags + k] = slot + 1
            new_idx[slot] = u if keep[t] else nw
            if want_pos:
                new_pos[slot] = i - start
            if want_dst:
                dst[i] = slot


@cuda.jit(cache=True)
def _scatter_to(src, dst_index, dst):
    for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[dst_index[i]] = src[i]


def block_bucketize_sparse_features(
    lengths, indices, weights, block_sizes, my_size, batch, total_num_blocks, pos, keep, bucketize_pos, sequence, out
):
    m = xp()
    new_lengths, new_indices, new_weights, new_pos, unbucketize = out
    n_bags, N = lengths.shape[0], indices.shape[0]
    if n_bags == 0:
        return  # every output is empty
    offs = _complete(lengths)
    bag_key = m.asarray(np.repeat(np.arange(batch.shape[0], dtype=np.int64), batch))
    uidx = bits(indices)
    params = (
        m.asarray(_bucketize.key_constants(block_sizes, total_num_blocks, my_size).reshape(-1)),
        np.uint64(my_size),
        m.asarray(np.zeros(1, np.uint64) if pos is None else pos.reshape(-1).astype(np.uint64)),
        pos is not None,
        np.uint64(2 ** (8 * indices.dtype.itemsize) - 1),
    )
    counts = m.empty(my_size * n_bags, np.int64)
    grid = blocks(n_bags, TPB)
    launch(_bucket_count, grid, TPB, offs, uidx, bag_key, *params, counts)
    new_lengths[...] = counts
    cursor = _complete(counts)  # the scan: bucket-major slots
    want_dst = sequence or weights is not None
    dst = m.empty(max(N, 1) if want_dst else 1, np.int64)
    pos_out = new_pos if bucketize_pos else m.empty(1, indices.dtype)
    keep_d = m.asarray(keep.astype(np.uint8))
    launch(
        _bucket_scatter,
        grid,
        TPB,
        offs,
        uidx,
        bag_key,
        *params,
        keep_d,
        cursor,
        new_indices.view(uidx.dtype),
        bucketize_pos,
        pos_out,
        want_dst,
        dst,
    )
    if weights is not None and N:
        launch(_scatter_to, blocks(N, TPB), TPB, bits(weights), dst, new_weights.view(bits(new_weights).dtype))
    if sequence:
        unbucketize[...] = dst[:N]


# -- small permutation ops ---------------------------------------------------------------
@cuda.jit(cache=True)
def _expand(permute, io, oo, out):
    for t in range(cuda.blockIdx.x, permute.shape[0], cuda.gridDim.x):
        base = io[permute[t]]
        lo = oo[t]
        for e in range(lo + cuda.threadIdx.x, oo[t + 1], cuda.blockDim.x):
            out[e] = base + e - lo


def expand_into_jagged_permute(permute, input_offset, output_offset, out):
    if permute.shape[0] and out.shape[0]:
        launch(
            _expand, blocks(permute.shape[0]), TPB, int64s(permute), int64s(input_offset), int64s(output_offset), out
        )


@cuda.jit(cache=True)
def _invert(permute, out):
    for i in range(cuda.grid(1), permute.shape[0], cuda.gridsize(1)):
        out[permute[i]] = i


def invert_permute(permute, out):
    if permute.shape[0]:
        launch(_invert, blocks(permute.shape[0], TPB), TPB, contiguous(permute), out)


# -- unique ids per table -------------------------------------------------------------------
@cuda.jit(cache=True)
def _mark_new(ids, order, first, flags):
    """``flags[r] = 1`` where sorted position ``r`` starts a new distinct id (or a table)."""
    for r in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
        flags[r] = 1 if (first[r] or ids[order[r]] != ids[order[r - 1]]) else 0


@cuda.jit(cache=True)
def _emit_unique(ids, order, flags, rank, unique, reverse):
    for r in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
        i = order[r]
        reverse[i] = rank[r] - 1
        if flags[r]:
            unique[rank[r] - 1] = ids[i]


def jagged_unique_indices(tables, B, offsets, indices, out):
    m = xp()
    out_lengths, out_offsets, unique, reverse = out
    offs = to_host(offsets, np.int64)
    ids = contiguous(indices)
    N = ids.shape[0]
    bounds = [int(offs[a * B]) for a, _ in tables] + [int(offs[tables[-1][1] * B])]
    counts = np.zeros(len(tables), np.int64)
    if N:
        # a library sort per table (CuPy on the device), then mark -> scan -> emit; the order among
        # equal ids does not matter
        order = m.concatenate([lo + m.argsort(ids[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])])
        first = np.zeros(N, np.uint8)
        first[[b for b in bounds[:-1] if b < N]] = 1
        flags = m.empty(N, np.int64)
        g = blocks(N, TPB)
        launch(_mark_new, g, TPB, ids, order, m.asarray(first), flags)
        rank = inclusive_scan(flags)
        launch(_emit_unique, g, TPB, ids, order, flags, rank, unique, reverse)
        ends = [int(rank[hi - 1]) if hi else 0 for hi in bounds[1:]]  # distinct ids up to each table's end
        counts = np.diff(np.array([0] + ends, np.int64))
    lengths = np.zeros(offs.shape[0] - 1, np.int64)
    for gi, (a, b) in enumerate(tables):
        n, c = (b - a) * B, int(counts[gi])
        if n:
            lengths[a * B : b * B] = c // n + (np.arange(n) < c % n)
    out_lengths[...] = m.asarray(lengths)
    out_offsets[...] = m.asarray(np.concatenate([[0], np.cumsum(lengths)]))
