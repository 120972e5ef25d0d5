"""Numba-CUDA kernel of the quantized TBE lookup.

Same contract as ``embnum.cpu.tbe_quantized``. One thread per (bag, output
column) for the pooled modes (each sums its bag in index order, in float32,
so results are the same on every run), one per (index, column) for
``"none"``. The ops layer has bounds-checked every index already except in
bounds mode ``"none"`` on a device; there the kernels clamp each bag into
``[0, N]`` and skip an id whose row would end past ``weights``, so no thread
reads outside ``weights`` or ``indices``. A float16 output is computed in float32
and rounded once (``._common.round_once``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _qrow
from ._common import (
    TPB,
    bits_to_float32,
    blocks,
    contiguous,
    float32_result,
    half_bits_to_float,
    int64s,
    launch,
    round_once,
    xp,
)

_element = cuda.jit(device=True)(_qrow.make_tbe_element(half_bits_to_float, bits_to_float32))


@cuda.jit(cache=True)
def _pooled(weights, layout, feature_of_col, indices, offsets, B, mean, psw, has_psw, out):
    total_D = out.shape[1]
    N = indices.shape[0]
    n_bytes = weights.shape[0]
    for e in range(cuda.grid(1), B * total_D, cuda.gridsize(1)):
        b = e // total_D
        col = e - b * total_D
        t = feature_of_col[col]
        start, code, c = layout[t, 0], layout[t, 1], col - layout[t, 2]
        R = layout[t, 4]
        bag = t * B + b
        lo = min(max(offsets[bag], 0), N)  # clamped: the identity on checked offsets
        hi = min(max(offsets[bag + 1], lo), N)
        acc = np.float32(0.0)
        for p in range(lo, hi):
            i = np.int64(indices[p])
            if i >= 0 and start + (i + 1) * R <= n_bytes:  # -1 (pruned) adds nothing
                w = psw[p] if has_psw else np.float32(1.0)
                acc += np.float32(w * _element(weights, start + i * R, code, c))
        if mean and hi > lo:
            acc = np.float32(acc / np.float32(hi - lo))
        out[b, col] = acc


@cuda.jit(cache=True)
def _rows(weights, layout, feature_of_pos, indices, out):
    N, D = out.shape
    for e in range(cuda.grid(1), N * D, cuda.gridsize(1)):
        p = e // D
        c = e - p * D
        t = feature_of_pos[p]
        i = np.int64(indices[p])
        if t < 0 or i < 0 or layout[t, 0] + (i + 1) * layout[t, 4] > weights.shape[0]:
            out[p, c] = np.float32(0.0)
        else:
            out[p, c] = _element(weights, layout[t, 0] + i * layout[t, 4], layout[t, 1], c)


def tbe_forward_quantized(weights, layout, indices, offsets, B, pooling, per_sample_weights, output_dtype, out):
    m = xp()
    target = float32_result(out)
    lay = int64s(layout)
    offs = int64s(offsets)
    T = int(lay.shape[0])
    if target.size:
        if pooling == 2:
            N = int(indices.shape[0])
            pos = m.arange(N)
            k = m.searchsorted(offs, pos, side="right") - 1  # the bag holding each position
            inside = (pos >= offs[0]) & (pos < offs[T * B]) if B else m.zeros(N, bool)
            inside &= (k >= 0) & (k < T * B)  # always, unless the offsets were not checked ("none")
            feature = m.where(inside, k // max(B, 1), -1).astype(np.int64)
            launch(_rows, blocks(target.size, TPB), TPB, contiguous(weights), lay, feature, contiguous(indices), target)
        else:
            # the feature of each output column, on the device (no read of the layout back)
            firsts = lay[:, 2]
            feature_of_col = (m.searchsorted(firsts, m.arange(target.shape[1]), side="right") - 1).astype(np.int64)
            has = per_sample_weights is not None
            psw = contiguous(per_sample_weights) if has else m.zeros(1, np.float32)
            launch(
                _pooled,
                blocks(target.size, TPB),
                TPB,
                contiguous(weights),
                lay,
                feature_of_col,
                contiguous(indices),
                offs,
                B,
                pooling == 1,
                psw,
                has,
                target,
            )
    round_once(target, out)
