"""Numba-CUDA kernels of the index_select family.

Same contract as ``embnum.cpu.index_select``. The forward grids run over output elements
(each thread finds its table by a binary search of the selection offsets,
``embnum._offsets_walk.segment_of``), so consecutive lanes move consecutive elements. The
batch backward adds without atomics and in a fixed order: one stable library sort of the
selections by the input row they read, then a grid over input elements in which each thread
adds its row's gradients in ascending position of ``indices`` (the oracle's order), so the
result is the same on every run and equal to the oracle's.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._jit import cuda_kernel
from ._common import TPB, bits, blocks, constant, int64s, launch, round_once, segment_of, stable_argsort, xp


@cuda_kernel
def _gather_rows(src, idx, width, out):
    """``out[e] = src[idx[e // width] * width + e % width]``: one thread per output element."""
    for e in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        j = e // width
        out[e] = src[idx[j] * width + e - j * width]


def group_index_select_dim0(input_group, indices_group, out):
    for a, i, o in zip(input_group, indices_group, out):
        if o.size == 0:
            continue
        width = o.size // o.shape[0]
        src = bits(a).reshape(-1)
        dst = o.reshape(-1).view(src.dtype)
        launch(_gather_rows, blocks(dst.shape[0], TPB), TPB, src, int64s(i), np.int64(width), dst)


@cuda_kernel
def _batch_gather(src, idx, in_offs, idx_offs, sel_offs, cols, base, step, out):
    """Selection element ``q`` (table ``t``, selected row ``j``, column ``c``) to ``base[t] + j * step[t] + c``."""
    last = cols.shape[0] - 1
    for q in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        t = segment_of(sel_offs, 0, last, q)
        C = cols[t]
        local = q - sel_offs[t]
        j = local // C
        c = local - j * C
        out[base[t] + j * step[t] + c] = src[in_offs[t] + idx[idx_offs[t] + j] * C + c]


def batch_index_select_dim0(inputs, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows, out):
    n = out.shape[0]
    if n == 0:
        return
    src = bits(inputs)
    tables = [constant(a) for a in (in_offs, idx_offs, sel_offs, cols, base, step)]
    launch(_batch_gather, blocks(n, TPB), TPB, src, int64s(indices), *tables, out.view(src.dtype))


@cuda.jit(device=True)
def _first_at_least(a, x):
    """The first position ``p`` with ``a[p] >= x`` in the sorted ``a`` (``len(a)`` if none)."""
    lo = np.int64(0)
    hi = np.int64(a.shape[0])
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda_kernel
def _batch_add_rows(grad, sorted_rows, order, row_offs, in_offs, idx_offs, cols, base, step, zero, acc):
    """Input element ``p`` (table ``t``, row ``r``, column ``c``): the sum, in the order of
    ``indices``, of the gradients of every selection of global row ``row_offs[t] + r``."""
    last = cols.shape[0] - 1
    for p in range(cuda.grid(1), acc.shape[0], cuda.gridsize(1)):
        t = segment_of(in_offs, 0, last, p)
        C = cols[t]
        local = p - in_offs[t]
        r = local // C
        c = local - r * C
        row = row_offs[t] + r
        s = zero
        q = _first_at_least(sorted_rows, row)
        while q < sorted_rows.shape[0] and sorted_rows[q] == row:
            j = order[q] - idx_offs[t]
            s += grad[base[t] + j * step[t] + c]
            q += 1
        acc[p] = s


def batch_index_select_dim0_backward(grad_output, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows, out):
    m = xp()
    n_in = out.shape[0]
    if n_in == 0:
        return
    half = grad_output.dtype == np.float16
    wide = np.float32 if half else grad_output.dtype.type
    grad = m.ascontiguousarray(grad_output, dtype=wide)  # float16 widens exactly
    acc = m.empty(n_in, np.float32) if half else out
    row_offs = np.cumsum(np.concatenate([[0], rows]), dtype=np.int64)
    # each selection's global input row (table start + its index): sorted stably, repeats keep their order
    table = np.repeat(np.arange(cols.shape[0], dtype=np.int64), np.diff(idx_offs))
    global_rows = m.asarray(row_offs[table]) + int64s(indices)
    order = stable_argsort(global_rows)
    sorted_rows = m.ascontiguousarray(global_rows[order])
    tables = [constant(a) for a in (row_offs, in_offs, idx_offs, cols, base, step)]
    launch(_batch_add_rows, blocks(n_in, TPB), TPB, grad, sorted_rows, order, *tables, wide(0), acc)
    round_once(acc, out)


@cuda_kernel
def _jagged_gather(src_rows, starts, dst, width, out):
    """Output element ``e`` (row ``r``, column ``c``): row ``r - dst[j]`` of selection ``j``,
    the segment that holds ``r`` (a binary search of ``dst``)."""
    last = starts.shape[0] - 1
    for e in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        r = e // width
        c = e - r * width
        j = segment_of(dst, 0, last, r)
        out[e] = src_rows[(starts[j] + r - dst[j]) * width + c]


def jagged_index_select_2d(values, src, dst, rows, out):
    n = out.size
    if n == 0:
        return
    src_rows = bits(values).reshape(-1)
    width = np.int64(values.shape[1])
    dst_flat = out.reshape(-1).view(src_rows.dtype)
    launch(_jagged_gather, blocks(n, TPB), TPB, src_rows, int64s(src), int64s(dst), width, dst_flat)
