"""Numba host kernels of the KeyedJaggedTensor family.

Each function takes the validated arguments of its op (``embnum.ops.kjt``)
plus ``out`` (a tuple/list of uninitialised arrays, ``None`` where an output
is not requested) and fills every requested output. Values and weights are
moved as unsigned integers of their width (``bits``): bit-exact and few
compiled specialisations. Block bucketize is count -> scan -> scatter over
chunks of whole bags, each bag walked in input order by one thread, so the
order inside a (bucket, bag) group is the input order and the result does
not depend on the thread count.

Performance notes (benchmarks/RESULTS.md): parallel loops run with a small
``numba.parallel_chunksize`` (dynamic scheduling), because on a shared
machine a statically scheduled half-loop waits for a descheduled thread
(bucketize 14-19 ms static, 8 ms dynamic); inner copy loops index bounded
local views (``a[lo:hi]``), which LLVM keeps in registers and vectorises,
where a prange body's by-reference array arguments are reloaded on every
store; per-key constants are loaded once per bag into scalars for the same
reason.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .. import _bucketize
from .._jit import njit
from . import _common, _pool
from ._common import bits, int64s

# The registry allocates this family's outputs with this (large ones reused across calls once
# the caller has dropped them; the rule: embnum.cpu._pool).
empty_output = _pool.empty

bucket_of = njit(cache=True, inline="always")(_bucketize.bucket_of)
uniform_new_id = njit(cache=True, inline="always")(_bucketize.uniform_new_id)


# -- segment gather (both permutes, keyed index select) ------------------------
@njit(cache=True)
def _exclusive_into(sizes, offs):
    """``offs[0] = 0``, ``offs[k+1] = sizes[0] + ... + sizes[k]`` (int64)."""
    acc = np.int64(0)
    offs[0] = 0
    for k in range(sizes.shape[0]):
        acc += sizes[k]
        offs[k + 1] = acc


@njit(cache=True)
def _exclusive_in_place(a):
    """``a[k] = a[0] + ... + a[k-1]`` (the old values), in place."""
    acc = np.int64(0)
    for k in range(a.shape[0]):
        v = a[k]
        a[k] = acc
        acc += v


@njit(cache=True, inline="always")
def _copy_run(dst, src, lo, hi, start):
    """``dst[lo:hi] = src[start:start + hi - lo]`` through bounded views, so the loop vectorises."""
    d = dst[lo:hi]
    s = src[start : start + (hi - lo)]
    for e in range(hi - lo):
        d[e] = s[e]


@njit(cache=True, inline="always")
def _gather(src, wsrc, src_offs, seg, dst_offs, dst, wdst):
    """Output segment ``j`` = source segment ``seg[j]``, of ``src`` into ``dst`` and, when
    ``wdst`` is not empty, of ``wsrc`` into ``wdst`` in the same pass (one walk of the
    offsets for values and weights). Serial: a few big segments (whole keys) move at about
    a plain copy's speed, and many small ones (bags) are bound by the latency of random
    reads; a parallel version with dynamic scheduling was slower in both cases on the
    shared 2-core machine (bags: 4.9 vs 3.6 ms, timed interleaved)."""
    both = wdst.shape[0] != 0
    for j in range(seg.shape[0]):
        lo, hi = dst_offs[j], dst_offs[j + 1]
        start = src_offs[seg[j]]
        _copy_run(dst, src, lo, hi, start)
        if both:
            _copy_run(wdst, wsrc, lo, hi, start)


@njit(cache=True, parallel=True)
def _gather_split(src, wsrc, src_offs, seg, dst_offs, dst, wdst, parts):
    """:func:`_gather` with the output cut into ``parts`` equal ranges of elements (by bytes,
    not by segments: a few whole keys or many bags split alike), one per thread; each range
    starts in the segment that holds its first element (binary search) and walks on."""
    total = dst_offs[dst_offs.shape[0] - 1]
    both = wdst.shape[0] != 0
    for p in prange(parts):
        lo = total * p // parts
        hi = total * (p + 1) // parts
        j = np.searchsorted(dst_offs, lo, side="right") - 1  # dst_offs[j] <= lo < dst_offs[j + 1]
        while lo < hi:
            end = min(dst_offs[j + 1], hi)
            start = src_offs[seg[j]] + (lo - dst_offs[j])
            _copy_run(dst, src, lo, end, start)
            if both:
                _copy_run(wdst, wsrc, lo, end, start)
            lo = end
            j += 1


# Output bytes from which the gather runs on every Numba thread: about twice the measured cost
# of waking a parallel region (6-29 us, bench_tail.py --sweep) in copy time. Below it the call
# is serial (no parallel region at all); _common.SERIAL_OVERRIDE, when set, replaces it.
# SPLIT_SEGMENT_BYTES: the split is taken only when the output's segments average at least this
# many bytes (long copies, bound by bandwidth: permute_2d's whole keys, 1.10 -> 0.85-0.94 ms).
# Short segments (bags of ~20 ids) are bound by the latency of random reads; split across two
# threads they measured slower on the shared machine (permute_1d 26 -> 32 ms, load ~4.5).
SPLIT_BYTES = 1 << 20
SPLIT_SEGMENT_BYTES = 4096


def _gather_segments(data, src_offs, seg, dst_offs, dst, weights=None, wdst=None):
    """``_gather`` of ``data`` into ``dst`` (and of ``weights`` into ``wdst`` when given),
    every array seen as unsigned integers of its width; split across the threads from
    :data:`SPLIT_BYTES` of output in segments of :data:`SPLIT_SEGMENT_BYTES` on average."""
    if dst.shape[0]:
        w, wd = (data[:0], dst[:0]) if weights is None else (weights, wdst)
        args = (bits(data), bits(w), src_offs, seg, dst_offs, dst.view(bits(dst).dtype), wd.view(bits(wd).dtype))
        limit = _common.SERIAL_OVERRIDE if _common.SERIAL_OVERRIDE is not None else SPLIT_BYTES
        threads = numba.get_num_threads()
        long = dst.nbytes + wd.nbytes >= SPLIT_SEGMENT_BYTES * seg.shape[0]
        if threads > 1 and dst.nbytes + wd.nbytes >= limit and (long or _common.SERIAL_OVERRIDE is not None):
            _gather_split(*args, threads)
        else:
            _gather(*args)


def _offsets_of(sizes):
    offs = np.empty(sizes.shape[0] + 1, np.int64)
    _exclusive_into(np.ascontiguousarray(sizes, dtype=np.int64), offs)
    return offs


@njit(cache=True, inline="always")
def _permute_offsets(permute, lengths, out_lengths, src_offs, dst_offs):
    """``out_lengths[j] = lengths[permute[j]]`` (rows of the ``[T, C]`` lengths; a 1-D permute
    passes ``[S, 1]`` views) and the int64 offsets of the source and output segments into
    ``src_offs [T+1]`` and ``dst_offs [len(permute)+1]``, in one pass over the lengths (row sums
    vectorised). ``permute`` is in range and the lengths are ``>= 0`` with an exact total (the
    declaration checked both), so no sum wraps. The caller allocates the offsets: ``np.empty``
    in a kernel is a compile of its own."""
    T, C = lengths.shape
    acc = np.int64(0)
    src_offs[0] = 0
    for t in range(T):
        row = lengths[t]
        for c in range(C):
            acc += row[c]
        src_offs[t + 1] = acc
    dst_offs[0] = 0
    for j in range(permute.shape[0]):
        p = permute[j]
        src, dst = lengths[p], out_lengths[j]
        for c in range(C):
            dst[c] = src[c]
        dst_offs[j + 1] = dst_offs[j] + (src_offs[p + 1] - src_offs[p])


@njit(cache=True)
def _permute_serial(permute, lengths, src, wsrc, out_lengths, dst, wdst, src_offs, dst_offs):
    """A whole small permute in one compiled call (both helpers inlined into it: one compile on
    a cold cache): :func:`_permute_offsets`, then :func:`_gather`."""
    _permute_offsets(permute, lengths, out_lengths, src_offs, dst_offs)
    _gather(src, wsrc, src_offs, permute, dst_offs, dst, wdst)


def _permute(permute, lengths2d, values, weights, total, out, out_lengths2d):
    """Both permutes on ``[T, C]`` lengths (1-D: ``[S, 1]`` views): one compiled call when the
    output is below :data:`SPLIT_BYTES` (the size from which the gather may split across threads)
    and ``SERIAL_OVERRIDE`` is unset; else the lengths pass, then :func:`_gather_segments`."""
    wbytes = 0 if weights is None else weights.itemsize
    offs = np.empty(lengths2d.shape[0] + 1, np.int64), np.empty(permute.shape[0] + 1, np.int64)
    if total * (values.itemsize + wbytes) < SPLIT_BYTES and _common.SERIAL_OVERRIDE is None:
        dst = out[1]
        src = bits(values)
        w, wd = (src[:0], dst[:0]) if weights is None else (bits(weights), out[2])
        _permute_serial(permute, lengths2d, src, w, out_lengths2d, dst.view(src.dtype), wd.view(w.dtype), *offs)
        return
    src_offs, dst_offs = offs
    _permute_offsets(permute, lengths2d, out_lengths2d, src_offs, dst_offs)
    _gather_segments(values, src_offs, permute, dst_offs, out[1], weights, None if weights is None else out[2])


def permute_2d_sparse_data(permute, lengths, values, weights, total, out):
    _permute(permute, lengths, values, weights, total, out, out[0])


def permute_1d_sparse_data(permute, lengths, values, weights, total, out):
    _permute(permute, lengths.reshape(-1, 1), values, weights, total, out, out[0].reshape(-1, 1))


@njit(cache=True, inline="always")
def _select_offsets(lengths, indices, batch_size, out_lengths, seg, dst_offs):
    """Output bag ``t*n + j`` is input bag ``seg[t*n + j] = t*batch_size + indices[j]``: its length
    copied to ``out_lengths``, ``dst_offs`` the output's offsets (``seg`` and ``dst_offs`` int64
    ``[T*n]`` and ``[T*n+1]``, allocated by the caller; ``indices`` in range, lengths checked)."""
    n = indices.shape[0]
    T = lengths.shape[0] // batch_size
    dst_offs[0] = 0
    for t in range(T):
        for j in range(n):
            k = t * n + j
            p = t * batch_size + np.int64(indices[j])
            seg[k] = p
            out_lengths[k] = lengths[p]
            dst_offs[k + 1] = dst_offs[k] + lengths[p]


@njit(cache=True)
def _select_serial(lengths, offsets, indices, batch_size, src, wsrc, out_lengths, dst, wdst, seg, dst_offs):
    """A whole small index select in one compiled call (the helpers inlined): :func:`_select_offsets`,
    then :func:`_gather`."""
    _select_offsets(lengths, indices, batch_size, out_lengths, seg, dst_offs)
    _gather(src, wsrc, offsets, seg, dst_offs, dst, wdst)


def keyed_jagged_index_select_dim1(values, lengths, offsets, indices, batch_size, weights, total, out):
    wbytes = 0 if weights is None else weights.itemsize
    n = lengths.shape[0] // batch_size * indices.shape[0]
    seg, dst_offs = np.empty(n, np.int64), np.empty(n + 1, np.int64)
    if total * (values.itemsize + wbytes) < SPLIT_BYTES and _common.SERIAL_OVERRIDE is None:
        dst = out[0]
        src = bits(values)
        w, wd = (src[:0], dst[:0]) if weights is None else (bits(weights), out[2])
        dst, wd = dst.view(src.dtype), wd.view(w.dtype)
        _select_serial(lengths, offsets, indices, batch_size, src, w, out[1], dst, wd, seg, dst_offs)
        return
    _select_offsets(lengths, indices, batch_size, out[1], seg, dst_offs)
    _gather_segments(values, offsets, seg, dst_offs, out[0], weights, None if weights is None else out[2])


# -- block bucketize -------------------------------------------------------------
BAG_CHUNK = 512  # bags per parallel work item (one scratch array per item)


@njit(cache=True, inline="always")
def _chunk_bags(c, n_bags):
    """Bags ``[k0, k1)`` of parallel work item ``c``."""
    k0 = np.int64(c) * BAG_CHUNK
    return k0, min(k0 + BAG_CHUNK, n_bags)


@njit(cache=True, inline="always")
def _key_row(kc, t):
    """Key ``t``'s ``(block size, G, lb, width, limit)`` from the flat ``_bucketize.key_constants``."""
    return kc[5 * t], kc[5 * t + 1], kc[5 * t + 2], kc[5 * t + 3], kc[5 * t + 4]


@njit(cache=True, inline="always")
def _place(i, start, slot, new, new_idx, want_pos, new_pos, want_dst, dst, want_w, w, new_w):
    """Id ``i`` (of the bag that starts at ``start``) into output ``slot``: its new id ``new``
    and, when asked, its position in the bag, its slot (``dst[i]``) and its weight."""
    new_idx[slot] = new
    if want_pos:
        new_pos[slot] = i - start
    if want_dst:
        dst[i] = slot
    if want_w:
        new_w[slot] = w[i]


@njit(cache=True, parallel=True)
def _bucket_count(offs, uidx, bag_key, kc, mu, pos, has_pos, mask, bucket, counts):
    """Pass 1: ``bucket[i]`` of every id and ``counts[p * n_bags + k]`` = ids of bag ``k`` in bucket ``p``."""
    n_bags = bag_key.shape[0]
    m = np.int64(mu)
    for c in prange((n_bags + BAG_CHUNK - 1) // BAG_CHUNK):
        local = np.zeros(m, np.int64)
        k0, k1 = _chunk_bags(c, n_bags)
        off, keys, ids, bk, cnt = offs[:], bag_key[:], uidx[:], bucket[:], counts[:]
        kcl, posl = kc[:], pos[:]
        for k in range(k0, k1):
            t = keys[k]
            bs, G, lb, width, limit = _key_row(kcl, t)
            local[:] = 0
            for i in range(off[k], off[k + 1]):
                b, _ = bucket_of(np.uint64(ids[i]), bs, G, lb, width, limit, t, mu, posl, has_pos, mask)
                bk[i] = b
                local[b] += 1
            for p in range(m):
                cnt[p * n_bags + k] = local[p]


@njit(cache=True, parallel=True)
def _bucket_scatter(
    offs,
    uidx,
    bag_key,
    kc,
    mu,
    pos,
    has_pos,
    mask,
    keep,
    bucket,
    slots,
    new_idx,
    want_pos,
    new_pos,
    want_dst,
    dst,
    want_w,
    w,
    new_w,
):
    """Pass 2: every id to its slot (``slots`` = bucket-major exclusive offsets), in input order;
    its weight too when ``want_w`` (in the same pass: no slot array written and read back)."""
    n_bags = bag_key.shape[0]
    m = np.int64(mu)
    for c in prange((n_bags + BAG_CHUNK - 1) // BAG_CHUNK):
        cursor = np.empty(m, np.int64)
        k0, k1 = _chunk_bags(c, n_bags)
        off, keys, ids, bk, sl, kp = offs[:], bag_key[:], uidx[:], bucket[:], slots[:], keep[:]
        kcl, posl = kc[:], pos[:]
        out_idx, out_pos, out_dst = new_idx[:], new_pos[:], dst[:]
        w_in, w_out = w[:], new_w[:]
        for k in range(k0, k1):
            t = keys[k]
            bs, G, lb, width, limit = _key_row(kcl, t)
            for p in range(m):
                cursor[p] = sl[p * n_bags + k]
            start = off[k]
            kept = kp[t]
            for i in range(start, off[k + 1]):
                u = np.uint64(ids[i])
                b = bk[i]
                slot = cursor[b]
                cursor[b] = slot + 1
                if kept:
                    new = u
                elif has_pos:
                    new = bucket_of(u, bs, G, lb, width, limit, t, mu, posl, has_pos, mask)[1]
                else:
                    new = uniform_new_id(u, b, G, width, limit)
                _place(i, start, slot, new, out_idx, want_pos, out_pos, want_dst, out_dst, want_w, w_in, w_out)


@njit(cache=True)
def _bucketize_serial(
    lengths,
    batch,
    block_sizes,
    total_num_blocks,
    uidx,
    mu,
    pos,
    has_pos,
    mask,
    keep,
    new_lengths,
    want_map,
    mapping,
    new_idx,
    want_pos,
    new_pos,
    want_dst,
    dst,
    want_w,
    w,
    new_w,
    counts,
    bucket,
    new_id,
):
    """The whole bucketize of a call that runs on one thread, in one compiled call: each key's
    constants (as ``embnum._bucketize.key_constants`` computes them), the count pass (every id's
    bucket and new id into the scratch ``bucket`` and ``new_id``, ``counts[p * n_bags + k]``), the
    lengths and the bucket-major exclusive scan of ``counts``, then the scatter in input order,
    ``counts`` its cursors. The same results as the parallel passes (the same rule functions, the
    same order). One kernel, not four: a cold cache compiles it once (``bucket_of`` inlined once)."""
    n_bags = lengths.shape[0]
    for j in range(counts.shape[0]):
        counts[j] = 0
    k = 0
    i = np.int64(0)
    for t in range(batch.shape[0]):
        bs, G = np.uint64(block_sizes[t]), np.uint64(total_num_blocks[t])
        lb = G // mu
        width, limit = bs * lb, bs * G
        for _ in range(batch[t]):
            for _ in range(lengths[k]):
                b, new = bucket_of(np.uint64(uidx[i]), bs, G, lb, width, limit, t, mu, pos, has_pos, mask)
                bucket[i] = b
                new_id[i] = new
                counts[b * n_bags + k] += 1
                i += 1
            k += 1
    for j in range(counts.shape[0]):
        new_lengths[j] = counts[j]
    if want_map:
        for j in range(bucket.shape[0]):
            mapping[j] = bucket[j]
    acc = np.int64(0)
    for j in range(counts.shape[0]):
        c = counts[j]
        counts[j] = acc
        acc += c
    k = 0
    i = np.int64(0)
    for t in range(batch.shape[0]):
        kept = keep[t]
        for _ in range(batch[t]):
            start = i
            for _ in range(lengths[k]):
                cur = bucket[i] * n_bags + k
                slot = counts[cur]
                counts[cur] = slot + 1
                new = uidx[i] if kept else new_id[i]
                _place(i, start, slot, new, new_idx, want_pos, new_pos, want_dst, dst, want_w, w, new_w)
                i += 1
            k += 1


@njit(cache=True)
def _bucketize_prep(lengths, batch, block_sizes, total_num_blocks, my_size):
    """One compiled pass for what both bucketize passes read: ``(offs [n_bags+1]`` int64 offsets of
    the bags, ``bag_key [n_bags]`` each bag's key, ``kc [T*5]`` the keys' constants as
    ``embnum._bucketize.key_constants`` computes them (uint64, its arithmetic))."""
    n_bags, T = lengths.shape[0], batch.shape[0]
    offs = np.empty(n_bags + 1, np.int64)
    acc = np.int64(0)
    offs[0] = 0
    for i in range(n_bags):
        acc += lengths[i]
        offs[i + 1] = acc
    bag_key = np.empty(n_bags, np.int64)
    k = 0
    for t in range(T):
        for _ in range(batch[t]):
            bag_key[k] = t
            k += 1
    kc = np.empty(T * 5, np.uint64)
    mu = np.uint64(my_size)
    for t in range(T):
        bs, G = np.uint64(block_sizes[t]), np.uint64(total_num_blocks[t])
        lb = G // mu
        kc[5 * t] = bs
        kc[5 * t + 1] = G
        kc[5 * t + 2] = lb
        kc[5 * t + 3] = bs * lb
        kc[5 * t + 4] = bs * G
    return offs, bag_key, kc


_NO_POS = np.zeros(0, np.uint64)


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
    new_lengths, new_indices, new_weights, new_pos, unbucketize = out[:5]
    mapping = out[5] if bucket_mapping else None
    n_bags, N = lengths.shape[0], indices.shape[0]
    if n_bags == 0:
        return
    uidx = bits(indices)
    pos_arr = _NO_POS if pos is None else pos.reshape(-1).astype(np.uint64)
    mask = np.uint64(2 ** (8 * indices.dtype.itemsize) - 1)
    bucket = np.empty(N, np.uint8 if my_size <= 256 else np.int64)  # a byte per id in the common case
    counts = np.empty(my_size * n_bags, np.int64)
    rows = weights is not None and weights.ndim == 2  # rows of weights: moved after the pass, by the slots
    if rows and not sequence:
        unbucketize = np.empty(N, indices.dtype)
    dst = unbucketize if sequence or rows else np.empty(0, np.int64)
    want_w = weights is not None and N > 0 and not rows
    no_w = np.empty(0, uidx.dtype)  # not a slice of the ids: they may be read-only, and new_w is written
    w, new_w = (bits(weights), new_weights.view(bits(new_weights).dtype)) if want_w else (no_w, no_w)
    pos_out = new_pos if bucketize_pos else np.empty(0, indices.dtype)
    if _common.one_thread():
        _bucketize_serial(
            lengths,
            batch,
            block_sizes,
            total_num_blocks,
            uidx,
            np.uint64(my_size),
            pos_arr,
            pos is not None,
            mask,
            keep,
            new_lengths,
            mapping is not None,
            bucket if mapping is None else mapping,
            new_indices.view(uidx.dtype),
            bucketize_pos,
            pos_out,
            sequence or rows,
            dst,
            want_w,
            w,
            new_w,
            counts,
            bucket,
            np.empty(N, np.uint64),
        )
    else:
        offs, bag_key, kc = _bucketize_prep(lengths, batch, block_sizes, total_num_blocks, my_size)
        params = (kc, np.uint64(my_size), pos_arr, pos is not None, mask)
        with numba.parallel_chunksize(2):  # dynamic scheduling: a descheduled thread does not hold up the pass
            _bucket_count(offs, uidx, bag_key, *params, bucket, counts)
        new_lengths[...] = counts
        if mapping is not None:
            mapping[...] = bucket
        _exclusive_in_place(counts)  # counts -> bucket-major slots, no second array to fault in
        args = (offs, uidx, bag_key, *params, keep, bucket, counts, new_indices.view(uidx.dtype))
        args += (bucketize_pos, pos_out, sequence or rows, dst, want_w, w, new_w)
        with numba.parallel_chunksize(2):
            _bucket_scatter(*args)
    if rows:
        new_weights[dst] = weights


# -- small permutation ops ---------------------------------------------------------
@njit(cache=True)
def _expand(permute, io, oo, out):
    """Serial for the same reason as :func:`_gather`."""
    for t in range(permute.shape[0]):
        base = io[permute[t]]
        seg = out[oo[t] : oo[t + 1]]
        for e in range(seg.shape[0]):
            seg[e] = base + e


def expand_into_jagged_permute(permute, input_offset, output_offset, out):
    if permute.shape[0]:
        _expand(int64s(permute), int64s(input_offset), int64s(output_offset), out)


@njit(cache=True)
def _invert(permute, out):
    """Serial: the scatter stays in cache at the sizes of a permutation of keys or bags
    (106,496 entries: 0.09 ms serial against 0.19 ms on two threads, min of 7, load ~4)."""
    for i in range(permute.shape[0]):
        out[permute[i]] = i


def invert_permute(permute, out):
    _invert(np.ascontiguousarray(permute), out)


# -- unique ids per table -----------------------------------------------------------
@njit(cache=True, parallel=True)
def _count_distinct(ids, bounds, order, counts):
    """Distinct ids per table ``g`` (sorted positions ``bounds[g]:bounds[g+1]`` of ``order``)."""
    for g in prange(bounds.shape[0] - 1):
        lo, hi = bounds[g], bounds[g + 1]
        o = order[lo:hi]
        c = 0
        for r in range(hi - lo):
            if r == 0 or ids[o[r]] != ids[o[r - 1]]:
                c += 1
        counts[g] = c


@njit(cache=True, parallel=True)
def _emit_unique(ids, bounds, order, base, unique, reverse):
    for g in prange(bounds.shape[0] - 1):
        lo, hi = bounds[g], bounds[g + 1]
        o = order[lo:hi]
        uq = unique[base[g] : base[g + 1]]  # bounded views (see the module docstring)
        rv = reverse[0 : reverse.shape[0]]
        rank = -1
        for r in range(hi - lo):
            i = o[r]
            if r == 0 or ids[i] != ids[o[r - 1]]:
                rank += 1
                uq[rank] = ids[i]
            rv[i] = base[g] + rank


@njit(cache=True)
def _unique_serial(tables, B, ids, bounds, order, out_lengths, out_offsets, unique, reverse):
    """The whole op in one compiled call (the small case): per table ``g`` (features
    ``tables[g, 0] .. tables[g, 1] - 1``, its ids at the sorted positions ``bounds[g] :
    bounds[g + 1]`` of ``order``) the distinct ids emitted in order, every id's rank among them
    in ``reverse``, the table's count spread over its bags as :func:`jagged_unique_indices`
    spreads it, then the complete cumsum of the lengths."""
    nb = out_lengths.shape[0]
    for i in range(nb):
        out_lengths[i] = 0
    base = np.int64(0)
    for g in range(tables.shape[0]):
        rank = np.int64(-1)
        for r in range(bounds[g], bounds[g + 1]):
            i = order[r]
            if r == bounds[g] or ids[i] != ids[order[r - 1]]:
                rank += 1
                unique[base + rank] = ids[i]
            reverse[i] = base + rank
        c = rank + 1
        a, b = tables[g, 0], tables[g, 1]
        n = (b - a) * B
        for k in range(n):
            out_lengths[a * B + k] = c // n + (1 if k < c % n else 0)
        base += c
    acc = np.int64(0)
    out_offsets[0] = 0
    for i in range(nb):
        acc += out_lengths[i]
        out_offsets[i + 1] = acc


def _id_order(ids):
    """The positions of the 1-D integer ``ids`` in id order (equal ids by position), int64: one
    sort of ``(id - min) * n + position`` where that stays below 2**62, else ``np.argsort``.
    NumPy sorts integers with SIMD but argsorts them with a scalar introsort where the CPU lacks
    AVX-512 (5x slower on the AMD VM: the op ran no faster than its oracle)."""
    n = ids.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    lo = int(ids.min())
    if (int(ids.max()) - lo) >= (1 << 62) // n:
        return np.argsort(ids)
    key = ids.astype(np.int64)  # a copy, then in place
    key -= lo
    key *= n
    key += np.arange(n)
    key.sort()
    np.remainder(key, n, out=key)
    return key


SERIAL_UNIQUE_IDS = 1 << 14  # ids below which one compiled call does it all (no parallel runtime)


def jagged_unique_indices(tables, B, offsets, indices, out):
    out_lengths, out_offsets, unique, reverse = out
    offs = int64s(offsets)
    ids = np.ascontiguousarray(indices)
    bounds = np.array([offs[a * B] for a, _ in tables] + [offs[tables[-1][1] * B]], np.int64)
    # NumPy's sort (SIMD) as the building block, like CuPy's on the device; any order among equal ids will do
    order = np.concatenate(
        [lo + _id_order(ids[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])] + [np.zeros(0, np.int64)]
    )
    if indices.shape[0] < SERIAL_UNIQUE_IDS and _common.SERIAL_OVERRIDE is None:
        _unique_serial(np.array(tables, np.int64).reshape(-1, 2), B, ids, bounds, order, *out)
        return
    counts = np.empty(len(tables), np.int64)
    with numba.parallel_chunksize(1):  # tables differ in size: hand them out one by one
        _count_distinct(ids, bounds, order, counts)
    base = _offsets_of(counts)
    with numba.parallel_chunksize(1):
        _emit_unique(ids, bounds, order, base, unique, reverse)
    lengths = np.zeros(offs.shape[0] - 1, np.int64)
    for g, (a, b) in enumerate(tables):
        n, c = (b - a) * B, int(counts[g])
        if n:
            lengths[a * B : b * B] = c // n + (np.arange(n) < c % n)
    out_lengths[...] = lengths
    out_offsets[...] = _offsets_of(lengths)
