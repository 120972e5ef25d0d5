"""Numba-CUDA kernels of the KeyedJaggedTensor family.

Same contract as ``embnum.cpu.kjt``. Every grid is sized by the work (output
elements), never by the number of keys or bags: output offsets come from one
library scan, then each thread takes output elements in a grid-stride loop and
finds its segment by a binary search of those offsets
(``embnum._offsets_walk.segment_of``), so consecutive lanes write consecutive
elements (coalesced) and read consecutive ones inside a segment, with no idle
lanes on short segments. Block bucketize computes every id's (bucket, bag) key
on a grid over ids, then one stable library sort by that key gives the
bucket-major order with the input order kept inside every (bucket, bag) group,
so results are identical on every run (fbgemm's CUDA kernel gives up that order
when ``sequence=False``). Index bounds were checked by the declaration, so no
kernel reads out of range. No op here reads device data back to the host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _bucketize
from .._jit import cuda_kernel
from ._common import (
    TPB,
    bits,
    blocks,
    constant,
    contiguous,
    inclusive_scan,
    int64s,
    launch,
    segment_of,
    stable_argsort,
    xp,
)

bucket_of = cuda.jit(device=True)(_bucketize.bucket_of)


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
@cuda_kernel
def _bucket_keys(offs, uidx, key_offs, kc, mu, pos, has_pos, mask, keep, key, new_id, in_bag):
    """For every id ``i`` (a grid over ids): its bag ``k`` and that bag's key ``t`` (binary
    searches), then ``key[i] = bucket * n_bags + k``, its new id and its position in the bag."""
    n_bags = offs.shape[0] - 1
    last_key = key_offs.shape[0] - 2
    for i in range(cuda.grid(1), uidx.shape[0], cuda.gridsize(1)):
        k = segment_of(offs, 0, n_bags - 1, i)
        t = segment_of(key_offs, 0, last_key, k)
        u = np.uint64(uidx[i])
        b, nw = bucket_of(
            u, kc[5 * t], kc[5 * t + 1], kc[5 * t + 2], kc[5 * t + 3], kc[5 * t + 4], t, mu, pos, has_pos, mask
        )
        key[i] = b * n_bags + k
        new_id[i] = u if keep[t] else nw
        in_bag[i] = i - offs[k]


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
    key_offs = constant(np.concatenate([[0], np.cumsum(batch)]).astype(np.int64))
    uidx = bits(indices)
    key = m.empty(N, np.int64)
    new_id = m.empty(N, uidx.dtype)
    in_bag = m.empty(N, np.int64)
    launch(
        _bucket_keys,
        blocks(N, TPB),
        TPB,
        offs,
        uidx,
        key_offs,
        constant(_bucketize.key_constants(block_sizes, total_num_blocks, my_size).reshape(-1)),
        np.uint64(my_size),
        constant(np.zeros(1, np.uint64) if pos is None else pos.reshape(-1).astype(np.uint64)),
        pos is not None,
        np.uint64(2 ** (8 * indices.dtype.itemsize) - 1),
        constant(keep.astype(np.uint8)),
        key,
        new_id,
        in_bag,
    )
    new_lengths[...] = m.bincount(key, minlength=my_size * n_bags)  # integer counts: exact, no float atomics
    order = stable_argsort(key)  # bucket-major, bag-minor, input order inside a group
    m.take(new_id, order, out=new_indices.view(uidx.dtype))
    if bucketize_pos:
        new_pos[...] = m.take(in_bag, order)
    if weights is not None and weights.ndim == 2:  # a row of weights per id
        new_weights[...] = m.take(weights, order, axis=0)
    elif weights is not None:
        m.take(bits(weights), order, out=new_weights.view(bits(new_weights).dtype))
    if mapping is not None:
        mapping[...] = key // n_bags
    if sequence:
        unbucketize[order] = m.arange(N, dtype=unbucketize.dtype)


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
