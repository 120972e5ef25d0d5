"""Numba-CUDA kernels of the jagged family.

Same contract as ``embnum.cpu.jagged``: validated arguments plus ``out``,
filled completely. All loops are grid-stride loops with 64-bit indices, and
every reduction has a fixed shape, so results are the same on every run.
Element-wise kernels (offsets_range, the segment-sum backward) run a grid over
output elements: a thread finds its segment by a binary search of the offsets
(``embnum._offsets_walk``), so consecutive lanes write consecutive elements and
no lane idles on a short segment. Jagged <-> dense give a group of lanes (a
warp, or fewer for short rows) to each dense slab or jagged row: the row's
segment is found once, then the lanes copy its contiguous elements with no
division per element. The segment sum is one lane group (a warp) per run with
a fixed butterfly reduction. Nothing here reads device data back.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from .. import _offsets_walk
from .._jit import cuda_kernel
from ._common import (
    LANES,
    TPB,
    bits,
    blocks,
    constant,
    contiguous,
    inclusive_scan,
    int64s,
    launch,
    leaf_segment,
    pack_offsets,
    scalar_bits,
    segment_of,
    shfl_xor,
    slab_of_segment,
    sync_lanes,
    xp,
)


# -- scans -----------------------------------------------------------------
@cuda_kernel
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
@cuda_kernel
def _offsets_range(offs, out):
    """``out[j] = j - offs[k]`` for the last ``k`` with ``offs[k] <= j``: a grid over ``out``."""
    last = offs.shape[0] - 1
    for j in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[j] = j - offs[segment_of(offs, 0, last, j)]


def offsets_range(offsets, range_size, out):
    if range_size:
        launch(_offsets_range, blocks(range_size, TPB), TPB, int64s(offsets), out)


# -- segment sums ----------------------------------------------------------
WARPS = TPB // LANES  # lane groups (warps) per block


def _make_segment_sum(acc_type, exact):
    @cuda_kernel
    def kernel(values, bounds, out):
        """A lane group (a warp on a GPU) per run, ``WARPS`` runs per block at a time: lane ``l`` sums
        elements ``l, l + LANES, ...`` of its run (consecutive lanes read consecutive elements), then the
        ``LANES`` partial sums are combined in a fixed order: lane-pair butterflies at offsets
        ``LANES/2, ..., 1`` (shuffles for floats; ``exact``: the same tree in shared memory, so integer
        sums never pass through a float). The loop is uniform over the block (the simulator's
        exchange is a block barrier)."""
        sh = cuda.shared.array(TPB, acc_type)
        t = cuda.threadIdx.x
        lane = t % LANES
        S = bounds.shape[0] - 1
        for base in range(cuda.blockIdx.x * WARPS, S, cuda.gridDim.x * WARPS):
            i = base + t // LANES
            acc = acc_type(0)
            if i < S:
                for j in range(bounds[i] + lane, bounds[i + 1], LANES):
                    acc += acc_type(values[j])
            step = LANES // 2
            if exact:
                sh[t] = acc
                sync_lanes()
                while step > 0:
                    if lane < step:
                        sh[t] += sh[t + step]
                    sync_lanes()
                    step //= 2
                acc = sh[t]
                sync_lanes()
            else:
                while step > 0:
                    acc += acc_type(shfl_xor(acc, step))  # the simulator exchanges through float64
                    step //= 2
            if lane == 0 and i < S:
                out[i] = acc

    return kernel


_SEGMENT_SUM = {
    "float32": _make_segment_sum(numba.float32, False),
    "float64": _make_segment_sum(numba.float64, False),
    "int64": _make_segment_sum(numba.int64, True),
}


def segment_sum_csr(batch_size, csr_seg, values, out):
    S = out.shape[0]
    if S == 0:
        return
    bounds = int64s(csr_seg) * batch_size
    kind = {"f2": "float32", "f4": "float32", "f8": "float64"}.get(values.dtype.str[1:], "int64")
    acc = out if out.dtype == np.dtype(kind) else xp().empty(S, dtype=kind)
    launch(_SEGMENT_SUM[kind], blocks(S, WARPS), TPB, contiguous(values), bounds, acc)
    if acc is not out:
        out[...] = acc.astype(out.dtype)  # float16: float32 sums rounded once (embnum._half); int32: wraps


@cuda_kernel
def _broadcast_runs(grad, bounds, out):
    """``out[j] = grad[i]`` for ``bounds[i] <= j < bounds[i+1]``, 0 outside every run: a grid over ``out``."""
    last = bounds.shape[0] - 1
    lo, hi = bounds[0], bounds[last]
    for j in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        if j < lo or j >= hi:
            out[j] = 0
        else:
            out[j] = grad[segment_of(bounds, 0, last - 1, j)]


def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values, out):
    if num_values:
        bounds = int64s(csr_seg) * batch_size
        launch(
            _broadcast_runs, blocks(num_values, TPB), TPB, bits(grad_output), bounds, out.view(bits(grad_output).dtype)
        )


# -- jagged <-> dense --------------------------------------------------------
def _group(width):
    """Lanes per row of ``width`` elements: the smallest power of two covering it, at most ``LANES``
    (short rows share a warp, so consecutive lanes still touch consecutive elements)."""
    g = 1
    while g < min(width, LANES):
        g *= 2
    return g


@cuda_kernel
def _to_dense(values, offs, starts, lens, pad, out, M, D, G):
    """values ``[N*D]``, out ``[n_slabs*M*D]``: ``G`` lanes per slab (grid-stride over slabs). The
    slab's leaf segment and its length are found once (:func:`leaf_segment`); then the lanes copy
    the ``M*D`` contiguous elements of the slab, the first ``min(length, M) * D`` from the segment's
    contiguous values and the rest ``pad``: no division per element."""
    J = lens.shape[0]
    leaf = starts[J - 1]
    MD = M * D
    n_slabs = out.shape[0] // MD
    lane = cuda.grid(1) % G
    for slab in range(cuda.grid(1) // G, n_slabs, cuda.gridsize(1) // G):
        seg = leaf_segment(offs, starts, lens, slab)
        src = np.int64(0)
        filled = np.int64(0)
        if seg >= 0:
            start = offs[leaf + seg]
            src = start * D
            filled = min(offs[leaf + seg + 1] - start, M) * D
        base = slab * MD
        w = lane
        while w + 3 * G < filled:  # four independent loads in flight before the first store
            a = values[src + w]
            b = values[src + w + G]
            c = values[src + w + 2 * G]
            d = values[src + w + 3 * G]
            out[base + w] = a
            out[base + w + G] = b
            out[base + w + 2 * G] = c
            out[base + w + 3 * G] = d
            w += 4 * G
        while w < MD:
            out[base + w] = values[src + w] if w < filled else pad
            w += G


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value, out):
    if out.size == 0:
        return
    M = max_lengths[-1]
    D = values.shape[1] if values.ndim == 2 else 1
    src = bits(values).reshape(-1)
    flat, starts = pack_offsets(offsets)
    lens = constant(np.asarray(max_lengths, dtype=np.int64))
    pad = src.dtype.type(scalar_bits(padding_value, values.dtype))
    G = _group(M * D)
    n_slabs = out.size // (M * D)
    dst = out.view(src.dtype).reshape(-1)
    launch(_to_dense, blocks(n_slabs, TPB // G), TPB, src, flat, starts, lens, pad, dst, M, D, G)


@cuda_kernel
def _to_jagged(dense, offs, starts, lens, out, M, D, G):
    """dense ``[n_slabs*M*D]``, out ``[total_L*D]``: ``G`` lanes per jagged row (grid-stride over
    rows). The row's leaf segment (binary search), its position ``i`` in it and the segment's slab
    are found once; then the lanes copy the row's ``D`` contiguous elements from dense row
    ``slab*M + i``, or write 0 where no dense position reaches."""
    J = lens.shape[0]
    leaf = starts[J - 1]
    n_seg = starts[J] - 1 - leaf
    lo = offs[leaf]
    hi = offs[leaf + n_seg]
    lane = cuda.grid(1) % G
    for row in range(cuda.grid(1) // G, out.shape[0] // D, cuda.gridsize(1) // G):
        src = np.int64(-1)
        if row >= lo and row < hi:
            seg = segment_of(offs, leaf, leaf + n_seg - 1, row) - leaf
            i = row - offs[leaf + seg]
            if i < M:
                slab = slab_of_segment(offs, starts, lens, seg)
                if slab >= 0:
                    src = (slab * M + i) * D
        base = row * D
        if src >= 0:
            for d in range(lane, D, G):
                out[base + d] = dense[src + d]
        else:
            for d in range(lane, D, G):
                out[base + d] = 0


def dense_to_jagged(dense, offsets, total_L, out):
    if out.size == 0:
        return
    src, flat, starts, lens, M, D = _offsets_walk.packed_dense(dense, offsets, bits, pack_offsets, constant)
    G = _group(D)
    dst = out.view(src.dtype).reshape(-1)
    launch(_to_jagged, blocks(out.size // D, TPB // G), TPB, src, flat, starts, lens, dst, M, D, G)
