"""Numba-CUDA kernels of the jagged family.

Same contract as ``embnum.cpu.jagged``: validated arguments plus ``out``,
filled completely. All loops are grid-stride loops with 64-bit indices, and
every reduction has a fixed shape, so results are the same on every run.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from ._common import (
    TPB,
    bits,
    blocks,
    contiguous,
    inclusive_scan,
    int64s,
    launch,
    leaf_segment,
    pack_offsets,
    scalar_bits,
    slab_of_segment,
    xp,
)


# -- scans -----------------------------------------------------------------
@cuda.jit(cache=True)
def _emit_rows(incl, out, N, first):
    """``out[r, j] = incl[r*N + j - first] - (sum of rows before r)``, 0 where ``j < first``."""
    R, W = out.shape[0], out.shape[1]
    start = cuda.grid(1)
    for e in range(start, R * W, cuda.gridsize(1)):
        r = e // W
        j = e - r * W
        k = j - first
        if k < 0:
            out[r, j] = 0
        else:
            base = incl[r * N - 1] if r > 0 else 0
            out[r, j] = incl[r * N + k] - base


def _cumsum(lengths, out, first):
    src = contiguous(lengths).reshape(-1)
    N = lengths.shape[-1]
    dst = out if out.ndim == 2 else out[None, :]
    if dst.size:
        launch(_emit_rows, blocks(dst.size, TPB), TPB, inclusive_scan(src), dst, N, first)


def complete_cumsum(lengths, out):
    _cumsum(lengths, out, 1)


def exclusive_cumsum(lengths, out):
    _cumsum(lengths, out, 1)


def inclusive_cumsum(lengths, out):
    _cumsum(lengths, out, 0)


# -- offsets_range ---------------------------------------------------------
@cuda.jit(cache=True)
def _offsets_range(offs, range_size, out):
    n = offs.shape[0]
    for k in range(cuda.blockIdx.x, n, cuda.gridDim.x):
        start = offs[k]
        end = offs[k + 1] if k + 1 < n else range_size
        for j in range(start + cuda.threadIdx.x, end, cuda.blockDim.x):
            out[j] = j - start


def offsets_range(offsets, range_size, out):
    if range_size:
        launch(_offsets_range, blocks(offsets.shape[0]), TPB, int64s(offsets), range_size, out)


# -- segment sums ----------------------------------------------------------
def _make_segment_sum(acc_type):
    @cuda.jit(cache=True)
    def kernel(values, bounds, out):
        """One block per run: strided partial sums, then a fixed tree reduction."""
        sh = cuda.shared.array(TPB, acc_type)
        t = cuda.threadIdx.x
        for i in range(cuda.blockIdx.x, bounds.shape[0] - 1, cuda.gridDim.x):
            acc = acc_type(0)
            for j in range(bounds[i] + t, bounds[i + 1], TPB):
                acc += acc_type(values[j])
            sh[t] = acc
            cuda.syncthreads()
            step = TPB // 2
            while step > 0:
                if t < step:
                    sh[t] += sh[t + step]
                cuda.syncthreads()
                step //= 2
            if t == 0:
                out[i] = sh[0]
            cuda.syncthreads()

    return kernel


_SEGMENT_SUM = {
    "float32": _make_segment_sum(numba.float32),
    "float64": _make_segment_sum(numba.float64),
    "int64": _make_segment_sum(numba.int64),
}


def segment_sum_csr(batch_size, csr_seg, values, out):
    S = out.shape[0]
    if S == 0:
        return
    bounds = int64s(csr_seg) * batch_size
    kind = {"f2": "float32", "f4": "float32", "f8": "float64"}.get(values.dtype.str[1:], "int64")
    acc = out if out.dtype == np.dtype(kind) else xp().empty(S, dtype=kind)
    launch(_SEGMENT_SUM[kind], blocks(S), TPB, contiguous(values), bounds, acc)
    if acc is not out:
        out[...] = acc.astype(out.dtype)  # float16: float32 sums rounded once (embnum._half); int32: wraps


@cuda.jit(cache=True)
def _broadcast_runs(grad, bounds, out):
    n = out.shape[0]
    lo, hi = bounds[0], bounds[bounds.shape[0] - 1]
    for j in range(cuda.grid(1), n, cuda.gridsize(1)):
        if j < lo or j >= hi:
            out[j] = 0
    for i in range(cuda.blockIdx.x, bounds.shape[0] - 1, cuda.gridDim.x):
        g = grad[i]
        for j in range(bounds[i] + cuda.threadIdx.x, bounds[i + 1], cuda.blockDim.x):
            out[j] = g


def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values, out):
    if num_values:
        bounds = int64s(csr_seg) * batch_size
        n_work = max(num_values // TPB, int(csr_seg.shape[0]))
        launch(_broadcast_runs, blocks(n_work), TPB, bits(grad_output), bounds, out.view(bits(grad_output).dtype))


# -- jagged <-> dense --------------------------------------------------------
@cuda.jit(cache=True)
def _to_dense(values, offs, starts, lens, pad, out, M, D):
    """values ``[N*D]``, out ``[n_slabs*M*D]``: one block per slab (grid-stride)."""
    J = lens.shape[0]
    leaf = starts[J - 1]
    n_slabs = out.shape[0] // (M * D)
    for slab in range(cuda.blockIdx.x, n_slabs, cuda.gridDim.x):
        seg = leaf_segment(offs, starts, lens, slab)
        start = 0
        n = 0
        if seg >= 0:
            start = offs[leaf + seg]
            n = min(offs[leaf + seg + 1] - start, M)
        base = slab * M * D
        for e in range(cuda.threadIdx.x, M * D, cuda.blockDim.x):
            i = e // D
            out[base + e] = values[start * D + e] if i < n else pad


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value, out):
    if out.size == 0:
        return
    M = max_lengths[-1]
    D = values.shape[1] if values.ndim == 2 else 1
    src = bits(values).reshape(-1)
    flat, starts = pack_offsets(offsets)
    lens = xp().asarray(np.asarray(max_lengths, dtype=np.int64))
    pad = src.dtype.type(scalar_bits(padding_value, values.dtype))
    n_slabs = out.size // (M * D)
    launch(_to_dense, blocks(n_slabs), TPB, src, flat, starts, lens, pad, out.view(src.dtype).reshape(-1), M, D)


@cuda.jit(cache=True)
def _to_jagged(dense, offs, starts, lens, out, M, D):
    """dense ``[n_slabs*M*D]``, out ``[total_L*D]``: one block per leaf segment, plus
    zeros on the rows before the first and after the last segment."""
    J = lens.shape[0]
    leaf = starts[J - 1]
    n_seg = starts[J] - 1 - leaf
    lo = offs[leaf] * D
    hi = offs[leaf + n_seg] * D
    for e in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        if e < lo or e >= hi:
            out[e] = 0
    for seg in range(cuda.blockIdx.x, n_seg, cuda.gridDim.x):
        start = offs[leaf + seg]
        end = offs[leaf + seg + 1]
        slab = slab_of_segment(offs, starts, lens, seg)
        n = min(end - start, M) if slab >= 0 else 0
        for e in range(cuda.threadIdx.x, (end - start) * D, cuda.blockDim.x):
            i = e // D
            out[start * D + e] = dense[slab * M * D + e] if i < n else 0


def dense_to_jagged(dense, offsets, total_L, out):
    if out.size == 0:
        return
    M, D = dense.shape[-2], dense.shape[-1]
    src = bits(dense).reshape(-1)
    flat, starts = pack_offsets(offsets)
    lens = xp().asarray(np.asarray(dense.shape[1:-1], dtype=np.int64))
    n_seg = int(offsets[-1].shape[0]) - 1
    n_work = max(n_seg, total_L * D // TPB)
    launch(_to_jagged, blocks(n_work), TPB, src, flat, starts, lens, out.view(src.dtype).reshape(-1), M, D)
