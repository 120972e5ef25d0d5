"""Numba-CUDA kernels of the KeyedJaggedTensor family.

Same contract as ``embnum.cpu.kjt``. The gathers' grids are sized by the work
(output elements), never by the number of keys or bags: output offsets come from one
library scan, then each thread takes output elements in a grid-stride loop and
finds its segment by a binary search of those offsets
(``embnum._offsets_walk.segment_of``), so consecutive lanes write consecutive
elements (coalesced) and read consecutive ones inside a segment, with no idle
lanes on short segments. Block bucketize is count -> scan -> scatter, with no
sort: a warp owns runs of consecutive bags and walks their ids ``LANES`` at a
time; lanes holding the same (bucket, bag) find each other by a lane match, so
pass 1 counts every group without atomics and pass 2 gives every id the slot
``first slot of its group + earlier ids of the group``, the input order kept
inside every (bucket, bag) group, identical on every run (fbgemm's CUDA kernel
gives up that order when ``sequence=False``). Index bounds were checked by
the declaration, so no kernel reads out of range. No op here reads device data back to the host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _bucketize
from .._jit import cuda_kernel
from ._common import (
    LANES,
    SIMULATED,
    TPB,
    bits,
    blocks,
    constant,
    contiguous,
    inclusive_scan,
    int64s,
    launch,
    peers,
    segment_of,
    stable_argsort,
    sync_lanes,
    xp,
)

bucket_of = cuda.jit(device=True)(_bucketize.bucket_of)
uniform_new_id = cuda.jit(device=True)(_bucketize.uniform_new_id)


def _complete(sizes):
    """int64 ``[n + 1]`` offsets (leading 0) of the device array ``sizes``."""
    m = xp()
    offs = m.zeros(sizes.shape[0] + 1, dtype=np.int64)
    if sizes.shape[0]:
        offs[1:] = inclusive_scan(int64s(sizes))
    return offs


# -- segment gathers ---------------------------------------------------------------
@cuda_kernel
def _gather(src, src_offs, seg, dst_offs, dst):
    """Element ``e`` of output segment ``j`` (``dst_offs[j] <= e < dst_offs[j+1]``) is element
    ``e - dst_offs[j]`` of source segment ``seg[j]``: a grid over output elements."""
    last = seg.shape[0] - 1
    for e in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        j = segment_of(dst_offs, 0, last, e)
        dst[e] = src[src_offs[seg[j]] + e - dst_offs[j]]


def _gather_segments(data, src_offs, seg, dst_offs, dst):
    n = dst.shape[0]
    if n and seg.shape[0]:
        launch(_gather, blocks(n, TPB), TPB, bits(data), src_offs, seg, dst_offs, dst.view(bits(dst).dtype))


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
def _bags_per_warp(N, n_bags):
    """Consecutive bags one warp owns: about four passes of ``LANES`` ids at the mean bag length
    (host shapes only), so short bags share a warp and a long one has it alone."""
    mean = max(1, -(-N // n_bags))
    return max(1, min(4 * LANES, 4 * LANES // mean))


@cuda.jit(device=True)
def _key_of(offs, key_offs, k0, k1, i):
    """``(bag k, its key t)`` of id ``i`` among bags ``[k0, k1)`` (binary searches)."""
    k = segment_of(offs, k0, k1 - 1, i)
    return k, segment_of(key_offs, 0, key_offs.shape[0] - 2, k)


@cuda_kernel
def _bucket_count(offs, uidx, key_offs, kc, mu, pos, has_pos, mask, per_warp, bucket, counts):
    """Pass 1, a warp per ``per_warp`` consecutive bags (which no other warp touches), ``LANES``
    consecutive ids at a time: ``bucket[i]`` of every id, and ``counts[b * n_bags + k]`` (zeroed)
    += the lanes holding bag ``k``'s ids of bucket ``b``, added by the last of those lanes (a lane
    match, no atomics: one writer per entry, and the warp's passes in order)."""
    n_bags = offs.shape[0] - 1
    lane = cuda.threadIdx.x % LANES
    n_groups = (n_bags + per_warp - 1) // per_warp
    for g in range(cuda.grid(1) // LANES, n_groups, cuda.gridsize(1) // LANES):
        k0 = g * per_warp
        k1 = min(k0 + per_warp, n_bags)
        end = offs[k1]
        for c in range(offs[k0], end, LANES):
            i = c + lane
            key = np.int64(-1)
            if i < end:
                k, t = _key_of(offs, key_offs, k0, k1, i)
                kt = 5 * t
                u = np.uint64(uidx[i])
                b, _ = bucket_of(u, kc[kt], kc[kt + 1], kc[kt + 2], kc[kt + 3], kc[kt + 4], t, mu, pos, has_pos, mask)
                bucket[i] = b
                key = b * n_bags + k
            same = peers(key)
            if i < end and (same >> (lane + 1)) == 0:
                counts[key] += cuda.popc(same)
            sync_lanes()


@cuda_kernel
def _bucket_scatter(
    offs, uidx, key_offs, kc, mu, pos, has_pos, mask, keep, per_warp, bucket, cursor, new_idx, want_pos, new_pos,
    want_dst, dst, want_w, w, new_w,
):  # fmt: skip
    """Pass 2, the warps and passes of pass 1: ``cursor[b * n_bags + k]`` starts at the first
    output slot of bag ``k``'s ids of bucket ``b`` (bucket-major exclusive scan of the counts); an
    id's slot is that cursor plus the lower lanes of its pass with the same (bucket, bag), so ids
    keep their input order inside every group; the last such lane moves the cursor on. The id's
    new id, position in its bag, slot (``dst``) and weight go out in the same pass."""
    n_bags = offs.shape[0] - 1
    lane = cuda.threadIdx.x % LANES
    below = (np.int64(1) << lane) - 1
    n_groups = (n_bags + per_warp - 1) // per_warp
    for g in range(cuda.grid(1) // LANES, n_groups, cuda.gridsize(1) // LANES):
        k0 = g * per_warp
        k1 = min(k0 + per_warp, n_bags)
        end = offs[k1]
        for c in range(offs[k0], end, LANES):
            i = c + lane
            key = np.int64(-1)
            k = t = b = slot = np.int64(0)
            if i < end:
                k, t = _key_of(offs, key_offs, k0, k1, i)
                b = np.int64(bucket[i])
                key = b * n_bags + k
            same = peers(key)
            if i < end:
                slot = cursor[key] + cuda.popc(same & below)
            sync_lanes()  # every lane has read its cursor before one moves it
            if i < end:
                if (same >> (lane + 1)) == 0:
                    cursor[key] = slot + 1
                u = np.uint64(uidx[i])
                kt = 5 * t
                if keep[t]:
                    new_idx[slot] = u
                elif has_pos:
                    new_idx[slot] = bucket_of(
                        u, kc[kt], kc[kt + 1], kc[kt + 2], kc[kt + 3], kc[kt + 4], t, mu, pos, has_pos, mask
                    )[1]
                else:
                    new_idx[slot] = uniform_new_id(u, b, kc[kt + 1], kc[kt + 3], kc[kt + 4])
                if want_pos:
                    new_pos[slot] = i - offs[k]
                if want_dst:
                    dst[i] = slot
                if want_w:
                    new_w[slot] = w[i]
            sync_lanes()


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
    out,
):
    m = xp()
    new_lengths, new_indices, new_weights, new_pos, unbucketize = out[:5]
    mapping = out[5] if bucket_mapping else None
    n_bags, N = lengths.shape[0], indices.shape[0]
    if n_bags == 0:
        return  # every output is empty
    if N == 0:
        new_lengths[...] = 0
        return
    offs = _complete(lengths)
    uidx = bits(indices)
    params = (
        constant(np.concatenate([[0], np.cumsum(batch)]).astype(np.int64)),
        constant(_bucketize.key_constants(block_sizes, total_num_blocks, my_size).reshape(-1)),
        np.uint64(my_size),
        constant(np.zeros(1, np.uint64) if pos is None else pos.reshape(-1).astype(np.uint64)),
        pos is not None,
        np.uint64(2 ** (8 * indices.dtype.itemsize) - 1),
    )
    per_warp = _bags_per_warp(N, n_bags)
    tpb = LANES if SIMULATED else TPB  # simulated lane syncs are block barriers: a block is one warp there
    grid = blocks(-(-n_bags // per_warp), tpb // LANES)
    bucket = m.empty(N, np.uint8 if my_size <= 256 else np.int64)  # a byte per id in the common case
    counts = m.zeros(my_size * n_bags, np.int64)
    launch(_bucket_count, grid, tpb, offs, uidx, *params, per_warp, bucket, counts)
    new_lengths[...] = counts  # integer counts: exact, no float atomics
    if mapping is not None:
        mapping[...] = bucket
    cursor = inclusive_scan(counts)
    cursor -= counts  # bucket-major exclusive scan: each (bucket, bag) group's first slot
    rows = weights is not None and weights.ndim == 2  # rows of weights: moved after the pass, by the slots
    if sequence:
        dst = unbucketize
    else:
        dst = m.empty(N if rows else 0, indices.dtype)
    want_w = weights is not None and not rows
    none = m.empty(0, uidx.dtype)
    w, new_w = (bits(weights), new_weights.view(bits(new_weights).dtype)) if want_w else (none, none)
    pos_out = new_pos if bucketize_pos else m.empty(0, indices.dtype)
    keep_t = constant(keep.astype(np.uint8))
    args = (offs, uidx, *params, keep_t, per_warp, bucket, cursor, new_indices.view(uidx.dtype))
    args += (bucketize_pos, pos_out, sequence or rows, dst, want_w, w, new_w)
    launch(_bucket_scatter, grid, tpb, *args)
    if rows:
        new_weights[dst] = weights


# -- small permutation ops ---------------------------------------------------------------
@cuda_kernel
def _expand(permute, io, oo, out):
    """A grid over output elements: element ``e`` of output segment ``t`` is ``io[permute[t]] + e - oo[t]``."""
    last = permute.shape[0] - 1
    for e in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        t = segment_of(oo, 0, last, e)
        out[e] = io[permute[t]] + e - oo[t]


def expand_into_jagged_permute(permute, input_offset, output_offset, out):
    if permute.shape[0] and out.shape[0]:
        launch(
            _expand, blocks(out.shape[0], TPB), TPB, int64s(permute), int64s(input_offset), int64s(output_offset), out
        )


@cuda_kernel
def _invert(permute, out):
    for i in range(cuda.grid(1), permute.shape[0], cuda.gridsize(1)):
        out[permute[i]] = i


def invert_permute(permute, out):
    if permute.shape[0]:
        launch(_invert, blocks(permute.shape[0], TPB), TPB, contiguous(permute), out)


# -- unique ids per table -------------------------------------------------------------------
@cuda_kernel
def _mark_new(ids, group, order, flags):
    """``flags[r] = 1`` where sorted position ``r`` starts a new (table, id) pair."""
    for r in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
        i = order[r]
        if r == 0:
            flags[r] = 1
        else:
            p = order[r - 1]
            flags[r] = 1 if (group[i] != group[p] or ids[i] != ids[p]) else 0


@cuda_kernel
def _emit_unique(ids, order, flags, rank, unique, reverse):
    for r in range(cuda.grid(1), order.shape[0], cuda.gridsize(1)):
        i = order[r]
        reverse[i] = rank[r] - 1
        if flags[r]:
            unique[rank[r] - 1] = ids[i]


def jagged_unique_indices(tables, B, offsets, indices, out):
    """Two stable library sorts (by id, then by table) order the ids by (table, id); mark ->
    scan -> emit numbers the distinct pairs. Table ``g``'s ids are the contiguous run
    ``offsets[a*B] : offsets[b*B]``, so its distinct count is the scan at the run's end. The
    per-bag lengths spread each table's count over its bags on the device: nothing is read back."""
    m = xp()
    out_lengths, out_offsets, unique, reverse = out
    ids = contiguous(indices)
    N, nb = ids.shape[0], offsets.shape[0] - 1
    G = len(tables)
    first_feature = np.array([a for a, _ in tables], np.int64)
    n_features = np.array([b - a for a, b in tables], np.int64)
    group_of_feature = np.repeat(np.arange(G, dtype=np.int64), n_features)  # tables cover every feature
    offs = int64s(offsets)
    counts = m.zeros(G, np.int64)
    if N:
        bag = m.searchsorted(offs, m.arange(N, dtype=np.int64), side="right") - 1
        group = constant(group_of_feature)[bag // B]
        order = stable_argsort(ids)
        order = order[stable_argsort(group[order])]
        flags = m.empty(N, np.int64)
        g = blocks(N, TPB)
        launch(_mark_new, g, TPB, ids, group, order, flags)
        rank = inclusive_scan(flags)
        launch(_emit_unique, g, TPB, ids, order, flags, rank, unique, reverse)
        ends = offs[constant((first_feature + n_features) * B)]  # each table's end in the ids
        upto = m.where(ends > 0, rank[m.maximum(ends - 1, 0)], 0)  # distinct pairs up to that end
        counts[0] = upto[0]
        counts[1:] = upto[1:] - upto[:-1]
    q = m.arange(nb, dtype=np.int64)
    gq = constant(group_of_feature)[q // B]
    n = constant(n_features * B)[gq]
    p = q - constant(first_feature * B)[gq]
    c = counts[gq]
    lengths = c // n + (p < c % n)
    out_lengths[...] = lengths
    out_offsets[0] = 0
    out_offsets[1:] = inclusive_scan(lengths)
