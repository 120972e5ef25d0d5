"""Numba host kernels of the jagged family.

Each public function here takes the validated arguments of its op (see
``embnum.ops.jagged``) plus ``out``, an uninitialised C-contiguous array that
it fills completely.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._common import bits, half_to_float, int64s, leaf_segment, pack_offsets, scalar_bits, slab_of_segment

_PARALLEL_SCAN_MIN = 1 << 16


# -- cumulative sums -------------------------------------------------------
@njit(cache=True)
def _scan_serial(src, dst):
    acc = np.int64(0)
    for i in range(src.shape[0]):
        acc += src[i]
        dst[i] = acc


@njit(cache=True, parallel=True)
def _scan_parallel(src, dst, n_chunks):
    """Inclusive prefix sum in two passes over ``n_chunks`` contiguous chunks."""
    n = src.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    totals = np.zeros(n_chunks + 1, dtype=np.int64)
    for c in prange(n_chunks):
        acc = np.int64(0)
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            acc += src[i]
        totals[c + 1] = acc
    for c in range(n_chunks):
        totals[c + 1] += totals[c]
    for c in prange(n_chunks):
        acc = totals[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            acc += src[i]
            dst[i] = acc


@njit(cache=True, parallel=True)
def _complete_rows(src, dst):
    for r in prange(src.shape[0]):
        acc = np.int64(0)
        dst[r, 0] = 0
        for i in range(src.shape[1]):
            acc += src[r, i]
            dst[r, i + 1] = acc


def _inclusive_into(src, dst):
    """``dst[i] = src[0] + ... + src[i]`` (1-D, same length)."""
    if src.shape[0] >= _PARALLEL_SCAN_MIN:
        import numba

        _scan_parallel(src, dst, 4 * numba.get_num_threads())
    elif src.shape[0]:
        _scan_serial(src, dst)


def complete_cumsum(lengths, out):
    src = np.ascontiguousarray(lengths)
    if src.ndim == 2:
        _complete_rows(src, out)
        return
    out[0] = 0
    _inclusive_into(src, out[1:])


def exclusive_cumsum(lengths, out):
    if lengths.shape[0]:
        out[0] = 0
        _inclusive_into(np.ascontiguousarray(lengths[:-1]), out[1:])


def inclusive_cumsum(lengths, out):
    _inclusive_into(np.ascontiguousarray(lengths), out)


# -- offsets_range ---------------------------------------------------------
@njit(cache=True, parallel=True)
def _offsets_range(offs, range_size, out):
    n = offs.shape[0]
    for k in prange(n):
        start = offs[k]
        end = offs[k + 1] if k + 1 < n else range_size
        for j in range(start, end):
            out[j] = j - start


def offsets_range(offsets, range_size, out):
    _offsets_range(np.ascontiguousarray(offsets), range_size, out)


# -- segment sums ----------------------------------------------------------
@njit(cache=True, parallel=True)
def _segment_sum(values, bounds, acc_zero, out):
    for i in prange(bounds.shape[0] - 1):
        acc = acc_zero
        for j in range(bounds[i], bounds[i + 1]):
            acc += values[j]
        out[i] = acc


@njit(cache=True, parallel=True)
def _segment_sum_half(values, bounds, out):
    for i in prange(bounds.shape[0] - 1):
        acc = 0.0
        for j in range(bounds[i], bounds[i + 1]):
            acc += half_to_float(values[j])
        out[i] = acc


def segment_sum_csr(batch_size, csr_seg, values, out):
    bounds = int64s(csr_seg) * batch_size
    vals = np.ascontiguousarray(values)
    if vals.dtype == np.float16:
        acc = np.empty(out.shape, np.float64)
        _segment_sum_half(vals.view(np.uint16), bounds, acc)
        out[...] = acc  # one rounding to float16
    elif vals.dtype.kind == "f":
        _segment_sum(vals, bounds, np.float64(0), out)
    else:
        _segment_sum(vals, bounds, np.int64(0), out)  # wraps like the dtype


@njit(cache=True, parallel=True)
def _broadcast_runs(grad, bounds, out):
    for i in prange(bounds.shape[0] - 1):
        for j in range(bounds[i], bounds[i + 1]):
            out[j] = grad[i]


def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values, out):
    bounds = int64s(csr_seg) * batch_size
    dst = out.view(bits(out).dtype)
    dst[: bounds[0]] = 0
    dst[bounds[-1] :] = 0
    _broadcast_runs(bits(grad_output), bounds, dst)


# -- jagged <-> dense --------------------------------------------------------
@njit(cache=True, parallel=True)
def _to_dense(values, offs, starts, lens, pad, out):
    """values ``[N, D]``, out ``[n_slabs, M, D]`` (unsigned views)."""
    J = lens.shape[0]
    M, D = out.shape[1], out.shape[2]
    leaf = starts[J - 1]
    for slab in prange(out.shape[0]):
        seg = leaf_segment(offs, starts, lens, slab)
        n = 0
        if seg >= 0:
            start = offs[leaf + seg]
            n = min(offs[leaf + seg + 1] - start, M)
            for i in range(n):
                for d in range(D):
                    out[slab, i, d] = values[start + i, d]
        for i in range(n, M):
            for d in range(D):
                out[slab, i, d] = pad


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value, out):
    if out.size == 0:
        return
    D = values.shape[1] if values.ndim == 2 else 1
    vals = bits(values).reshape(values.shape[0], D)
    M = max_lengths[-1]
    dst = out.view(vals.dtype).reshape(out.size // (M * D), M, D)
    flat, starts = pack_offsets(offsets)
    lens = np.asarray(max_lengths, dtype=np.int64)
    _to_dense(vals, flat, starts, lens, scalar_bits(padding_value, values.dtype), dst)


@njit(cache=True, parallel=True)
def _to_jagged(dense, offs, starts, lens, out):
    """dense ``[n_slabs, M, D]``, out ``[total_L, D]`` (unsigned views)."""
    J = lens.shape[0]
    M, D = dense.shape[1], dense.shape[2]
    leaf, end_leaf = starts[J - 1], starts[J] - 1
    zero = 0
    for r in range(offs[leaf]):
        for d in range(D):
            out[r, d] = zero
    for r in range(offs[end_leaf], out.shape[0]):
        for d in range(D):
            out[r, d] = zero
    for seg in prange(end_leaf - leaf):
        start = offs[leaf + seg]
        end = offs[leaf + seg + 1]
        slab = slab_of_segment(offs, starts, lens, seg)
        n = min(end - start, M) if slab >= 0 else 0
        for i in range(n):
            for d in range(D):
                out[start + i, d] = dense[slab, i, d]
        for r in range(start + n, end):
            for d in range(D):
                out[r, d] = zero


def dense_to_jagged(dense, offsets, total_L, out):
    M, D = dense.shape[-2], dense.shape[-1]
    src = bits(dense).reshape(int(np.prod(dense.shape[:-2])), M, D)
    flat, starts = pack_offsets(offsets)
    lens = np.asarray(dense.shape[1:-1], dtype=np.int64)
    _to_jagged(src, flat, starts, lens, out.view(src.dtype))
