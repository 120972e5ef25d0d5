"""Numba host kernels of the index_select family.

Each function takes the validated arguments of its op (``embnum.ops.index_select``) plus
``out`` and fills it. Values are moved as unsigned integers of their width (bit-exact, few
compiled specialisations). The batch ops run one table per parallel item: tables write
disjoint parts of the result, so the backward adds a row's repeats in the order of
``indices`` whatever the thread count, as the oracle does.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import njit
from ._common import bits, copy_run, int64s, one_thread, round_once, serial_twin


@njit(cache=True, parallel=True)
def _gather_rows(src, idx, out):
    """``out[j] = src[idx[j]]`` for 2-D ``src``/``out`` (rows of the same width)."""
    for j in prange(idx.shape[0]):
        copy_run(out[j], 0, src[idx[j]], 0, out.shape[1])


_gather_rows_serial = serial_twin(_gather_rows)


def group_index_select_dim0(input_group, indices_group, out):
    for a, i, o in zip(input_group, indices_group, out):
        if o.size == 0:
            continue
        width = o.size // o.shape[0]
        src = bits(a).reshape(a.shape[0], width)
        dst = o.view(src.dtype).reshape(o.shape[0], width)
        (_gather_rows_serial if o.size < 65536 else _gather_rows)(src, int64s(i), dst)


@njit(cache=True, parallel=True)
def _batch_gather(src, idx, in_offs, idx_offs, cols, base, step, out):
    for t in prange(cols.shape[0]):
        C, s0, b, st = cols[t], in_offs[t], base[t], step[t]
        k0 = idx_offs[t]
        for j in range(idx_offs[t + 1] - k0):
            s = s0 + np.int64(idx[k0 + j]) * C
            d = b + j * st
            copy_run(out, d, src, s, C)


@njit(cache=True, parallel=True)
def _batch_scatter_add(grad, idx, in_offs, idx_offs, cols, base, step, acc):
    for t in prange(cols.shape[0]):
        C, s0, b, st = cols[t], in_offs[t], base[t], step[t]
        acc[in_offs[t] : in_offs[t + 1]] = 0
        k0 = idx_offs[t]
        for j in range(idx_offs[t + 1] - k0):
            s = s0 + np.int64(idx[k0 + j]) * C
            d = b + j * st
            for c in range(C):
                acc[s + c] += grad[d + c]


_batch_gather_serial = serial_twin(_batch_gather)
_batch_scatter_add_serial = serial_twin(_batch_scatter_add)


def batch_index_select_dim0(inputs, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows, out):
    src = bits(inputs)
    kernel = _batch_gather_serial if one_thread() else _batch_gather
    kernel(src, np.ascontiguousarray(indices), in_offs, idx_offs, cols, base, step, out.view(src.dtype))


def batch_index_select_dim0_backward(grad_output, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows, out):
    half = grad_output.dtype == np.float16
    grad = np.ascontiguousarray(grad_output, np.float32 if half else grad_output.dtype)  # float16 widens exactly
    acc = np.empty(out.shape, np.float32) if half else out
    kernel = _batch_scatter_add_serial if one_thread() else _batch_scatter_add
    kernel(grad, np.ascontiguousarray(indices), in_offs, idx_offs, cols, base, step, acc)
    round_once(acc, out)


@njit(cache=True, parallel=True)
def _jagged_gather(src_rows, starts, dst, out):
    """Selection ``j``: rows ``starts[j]..`` of ``src_rows`` to rows ``dst[j]..dst[j + 1]`` of ``out``
    (the part below ``len(out)``)."""
    n = out.shape[0]
    for j in prange(starts.shape[0]):
        lo = dst[j]
        hi = min(dst[j + 1], n)
        for r in range(lo, hi):
            copy_run(out[r], 0, src_rows[starts[j] + r - lo], 0, out.shape[1])


_jagged_gather_serial = serial_twin(_jagged_gather)


def jagged_index_select_2d(values, src, dst, rows, out):
    if out.size == 0:
        return
    src_rows = bits(values)
    (_jagged_gather_serial if out.size < 65536 else _jagged_gather)(src_rows, src, dst, out.view(src_rows.dtype))
