"""Numba host kernel of the quantized TBE lookup.

Validated, bounds-checked arguments (``embnum.ops.tbe_quantized``) plus
``out``. One bag per ``prange`` iteration; each row element is dequantized
exactly (``scale * q + bias`` in float64, rounded once to float32) and
accumulated in float32 in index order, so results do not depend on threads.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import _qrow
from .._jit import njit
from .._tbe import MEAN, NONE
from ._common import bits_to_float32, float32_result, half_bits_to_float32, one_thread, round_once, serial_twin

# The float16 decode is a function call of its own, not inlined into the element's three calls
# (Numba copies an inlined body per call site: the serial lookup compiled 2.0 s against 1.3 s on
# a cold cache; LLVM inlines it later all the same, the steady cost unchanged).
_f16 = njit(cache=True)(half_bits_to_float32.py_func)
_element = njit(inline="always")(_qrow.make_tbe_element(_f16, bits_to_float32))  # float32 element c


@njit(cache=True, parallel=True)
def _pooled(weights, layout, indices, offsets, B, mean, psw, has_psw, out):
    T = layout.shape[0]
    for bag in prange(T * B):
        t = bag // B
        b = bag - t * B
        start, code, col, D, R = layout[t, 0], layout[t, 1], layout[t, 2], layout[t, 3], layout[t, 4]
        o = out[b, col : col + D]
        for c in range(D):
            o[c] = 0
        lo, hi = offsets[bag], offsets[bag + 1]
        for p in range(lo, hi):
            i = np.int64(indices[p])
            if i == -1:
                continue  # pruned row
            w = psw[p] if has_psw else np.float32(1.0)
            row = start + i * R
            for c in range(D):
                o[c] += np.float32(w * _element(weights, row, code, c))
        if mean and hi > lo:
            n = np.float32(hi - lo)
            for c in range(D):
                o[c] = o[c] / n


@njit(cache=True, parallel=True)
def _rows(weights, layout, indices, offsets, B, out):
    T = layout.shape[0]
    N = indices.shape[0]
    D = out.shape[1]
    first, last = offsets[0], offsets[T * B]
    for p in prange(N):
        o = out[p]
        for c in range(D):
            o[c] = 0
        if p < first or p >= last:
            continue  # in no bag
        i = np.int64(indices[p])
        if i == -1:
            continue
        t = np.searchsorted(offsets, p, side="right") - 1  # the bag holding p, then its feature
        t = t // B
        start, code, R = layout[t, 0], layout[t, 1], layout[t, 4]
        for c in range(D):
            o[c] = _element(weights, start + i * R, code, c)


# serial twins for calls that run on one thread (the same code, prange as range): a cold first call
# then compiles no parallel region, about half the compile
_POOLED = (_pooled, serial_twin(_pooled))
_ROWS = (_rows, serial_twin(_rows))


def tbe_forward_quantized(weights, layout, indices, offsets, B, pooling, per_sample_weights, output_dtype, out):
    target = float32_result(out)
    w = np.ascontiguousarray(weights)
    idx = np.ascontiguousarray(indices)
    offs = np.ascontiguousarray(offsets, dtype=np.int64)
    if pooling == NONE:
        if target.size:
            _ROWS[one_thread()](w, layout, idx, offs, B, target)
    else:
        has = per_sample_weights is not None
        psw = np.ascontiguousarray(per_sample_weights) if has else np.zeros(0, np.float32)
        if target.size:
            _POOLED[one_thread()](w, layout, idx, offs, B, pooling == MEAN, psw, has, target)
    round_once(target, out)
