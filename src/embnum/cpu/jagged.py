"""Numba host kernels of the jagged family.

Each public function here takes the validated arguments of its op (see
``embnum.ops.jagged``) plus ``out``, an uninitialised C-contiguous array that
it fills completely.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import _offsets_walk
from .._jit import njit
from ._common import (
    bits,
    copy_run,
    float32_result,
    half_table,
    int64s,
    leaf_segment,
    one_thread,
    pack_offsets,
    round_once,
    scalar_bits,
    serial_twin,
    slab_of_segment,
)


# -- cumulative sums -------------------------------------------------------
@njit(cache=True)
def _inclusive(src, dst):
    """``dst[i] = src[0] + ... + src[i]``. Serial: a prefix sum is bound by its
    dependency chain, and a two-pass parallel scan was slower on every size
    measured (benchmarks/RESULTS.md)."""
    acc = np.int64(0)
    for i in range(src.shape[0]):
        acc += src[i]
        dst[i] = acc


@njit(cache=True, parallel=True)
def _complete_rows(src, dst):
    for r in prange(src.shape[0]):
        dst[r, 0] = 0
        _inclusive(src[r], dst[r, 1:])


_complete_rows_serial = serial_twin(_complete_rows)


def complete_cumsum(lengths, out):
    src = np.ascontiguousarray(lengths)
    if src.ndim == 2:
        (_complete_rows_serial if one_thread() else _complete_rows)(src, out)
        return
    out[0] = 0
    _inclusive(src, out[1:])


def exclusive_cumsum(lengths, out):
    if lengths.shape[0]:
        out[0] = 0
        _inclusive(np.ascontiguousarray(lengths[:-1]), out[1:])


def inclusive_cumsum(lengths, out):
    _inclusive(np.ascontiguousarray(lengths), out)


# -- offsets_range ---------------------------------------------------------
@njit(cache=True, parallel=True)
def _offsets_range(offs, range_size, out):
    n = offs.shape[0]
    for k in prange(n):
        start = offs[k]
        end = offs[k + 1] if k + 1 < n else range_size
        seg = out[start:end]
        for j in range(end - start):
            seg[j] = j


_offsets_range_serial = serial_twin(_offsets_range)


def offsets_range(offsets, range_size, out):
    (_offsets_range_serial if one_thread() else _offsets_range)(np.ascontiguousarray(offsets), range_size, out)


# -- segment sums ----------------------------------------------------------
@njit(cache=True, inline="always")
def _run_sum(values, lo, hi, zero):
    """Sum of ``values[lo:hi]`` with 8 independent partial sums (a single
    accumulator would wait on every addition's latency)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    j = lo
    while j + 8 <= hi:
        a0 += values[j]
        a1 += values[j + 1]
        a2 += values[j + 2]
        a3 += values[j + 3]
        a4 += values[j + 4]
        a5 += values[j + 5]
        a6 += values[j + 6]
        a7 += values[j + 7]
        j += 8
    while j < hi:
        a0 += values[j]
        j += 1
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(cache=True, parallel=True)
def _segment_sum(values, bounds, acc_zero, out):
    for i in prange(bounds.shape[0] - 1):
        out[i] = _run_sum(values, bounds[i], bounds[i + 1], acc_zero)


_segment_sum_serial = serial_twin(_segment_sum)


@njit(cache=True, parallel=True)
def _segment_sum_half(values, table, bounds, out):
    """float16 bits widened through ``table`` (exact) and summed in float32 (the ``embnum._half`` rule)."""
    for i in prange(bounds.shape[0] - 1):
        acc = np.float32(0)
        for j in range(bounds[i], bounds[i + 1]):
            acc += table[values[j]]
        out[i] = acc


_segment_sum_half_serial = serial_twin(_segment_sum_half)


def segment_sum_csr(batch_size, csr_seg, values, out):
    bounds = int64s(csr_seg) * batch_size
    vals = np.ascontiguousarray(values)
    serial = one_thread()
    if vals.dtype == np.float16:
        acc = float32_result(out)
        (_segment_sum_half_serial if serial else _segment_sum_half)(vals.view(np.uint16), half_table(), bounds, acc)
        round_once(acc, out)
    else:  # integers wrap like the dtype
        zero = np.float64(0) if vals.dtype.kind == "f" else np.int64(0)
        (_segment_sum_serial if serial else _segment_sum)(vals, bounds, zero, out)


@njit(cache=True, parallel=True)
def _broadcast_runs(grad, bounds, out):
    out[: bounds[0]] = 0
    out[bounds[-1] :] = 0
    for i in prange(bounds.shape[0] - 1):
        out[bounds[i] : bounds[i + 1]] = grad[i]


_broadcast_runs_serial = serial_twin(_broadcast_runs)


def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values, out):
    src = bits(grad_output)
    (_broadcast_runs_serial if one_thread() else _broadcast_runs)(
        src, int64s(csr_seg) * batch_size, out.view(src.dtype)
    )


# -- jagged <-> dense --------------------------------------------------------
# Slice assignments below are deliberate: Numba turns them into vectorised
# copies, while an element loop with computed (possibly negative) indices is
# not vectorised and runs 4x slower.
@njit(cache=True, parallel=True)
def _to_dense(values, offs, starts, lens, pad, out, M, D):
    """values ``[N*D]``, out ``[n_slabs*M*D]`` (flat unsigned views): each slab copies its
    segment's first ``min(len, M)`` rows and pads the rest."""
    J = lens.shape[0]
    leaf = starts[J - 1]
    MD = M * D
    for p in prange(out.shape[0] // MD):
        slab = np.int64(p)  # prange indices may arrive unsigned
        seg = slab if J == 1 else leaf_segment(offs, starts, lens, slab)
        base = slab * MD
        n = 0
        if seg >= 0:
            start = offs[leaf + seg]
            n = min(offs[leaf + seg + 1] - start, M) * D
            copy_run(out, base, values, start * D, n)
        out[base + n : base + MD] = pad


_to_dense_serial = serial_twin(_to_dense)


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value, out):
    if out.size == 0:
        return
    D = values.shape[1] if values.ndim == 2 else 1
    src = bits(values).reshape(-1)
    flat, starts = (
        (int64s(offsets[0]), np.array((0, offsets[0].shape[0]), np.int64))
        if len(offsets) == 1
        else pack_offsets(offsets)
    )
    lens = np.asarray(max_lengths, dtype=np.int64)
    pad = scalar_bits(padding_value, values.dtype)
    (_to_dense_serial if one_thread() else _to_dense)(
        src, flat, starts, lens, pad, out.view(src.dtype).reshape(-1), max_lengths[-1], D
    )


@njit(cache=True, parallel=True)
def _to_jagged(dense, offs, starts, lens, out, M, D):
    """dense ``[n_slabs*M*D]``, out ``[total_L*D]`` (flat unsigned views): each leaf
    segment takes the first ``min(len, M)`` rows of its slab; every other row is 0."""
    J = lens.shape[0]
    leaf, last = starts[J - 1], starts[J] - 1
    MD = M * D
    out[: offs[leaf] * D] = 0
    out[offs[last] * D :] = 0
    for p in prange(last - leaf):
        seg = np.int64(p)
        start = offs[leaf + seg] * D
        end = offs[leaf + seg + 1] * D
        slab = seg if J == 1 else slab_of_segment(offs, starts, lens, seg)
        n = min(end - start, MD) if slab >= 0 else 0
        if n:
            copy_run(out, start, dense, slab * MD, n)
        out[start + n : end] = 0


_to_jagged_serial = serial_twin(_to_jagged)


def dense_to_jagged(dense, offsets, total_L, out):
    if out.size == 0:
        return
    src, flat, starts, lens, M, D = _offsets_walk.packed_dense(dense, offsets, bits, pack_offsets, np.asarray)
    (_to_jagged_serial if one_thread() else _to_jagged)(src, flat, starts, lens, out.view(src.dtype).reshape(-1), M, D)
