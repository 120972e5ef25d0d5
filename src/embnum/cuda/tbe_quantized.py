"""Numba-CUDA kernel of the quantized TBE lookup.

Same contract as ``embnum.cpu.tbe_quantized``. One lane group (a warp on a
GPU) per bag for the pooled modes, lanes over the feature's columns (each lane
sums its columns in index order, in float32, so results are the same on every
run), one lane group per position for ``"none"``. The ops layer has bounds-checked every index already except in
bounds mode ``"none"`` on a device; there the kernels clamp each bag into
``[0, N]`` and skip an id whose row would end past ``weights``, so no thread
reads outside ``weights`` or ``indices``. A float16 output is computed in float32
and rounded once (``._common.round_once``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _qrow
from .._jit import cuda_kernel
from ._common import (
    LANES,
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


def _groups(n_items: int) -> int:
    """Blocks for ``n_items`` lane-group work items."""
    return blocks(n_items, TPB // LANES)


@cuda_kernel
def _pooled(weights, layout, indices, offsets, B, mean, psw, has_psw, out):
    """out ``[B, total_D]``: one lane group per bag ``(t, b)``, lanes over the feature's columns
    (each lane sums its columns in lookup order, float32; the group's loads of a row are adjacent
    bytes, and its scale and bias one broadcast load)."""
    lane = cuda.threadIdx.x % LANES
    T = layout.shape[0]
    N = indices.shape[0]
    n_bytes = weights.shape[0]
    one = np.float32(1.0)
    for bag in range(cuda.grid(1) // LANES, T * B, cuda.gridsize(1) // LANES):
        t = bag // B
        b = bag - t * B
        start, code, col0, D, R = layout[t, 0], layout[t, 1], layout[t, 2], layout[t, 3], layout[t, 4]
        lo = min(max(offsets[bag], 0), N)  # clamped: the identity on checked offsets
        hi = min(max(offsets[bag + 1], lo), N)
        for c in range(lane, D, LANES):
            acc = np.float32(0.0)
            for p in range(lo, hi):
                i = np.int64(indices[p])
                if i >= 0 and start + (i + 1) * R <= n_bytes:  # -1 (pruned) adds nothing
                    w = psw[p] if has_psw else one
                    acc += np.float32(w * _element(weights, start + i * R, code, c))
            if mean and hi > lo:
                acc = np.float32(acc / np.float32(hi - lo))
            out[b, col0 + c] = acc


@cuda_kernel
def _rows(weights, layout, feature_of_pos, indices, out):
    """out ``[N, D]`` (pooling ``"none"``): one lane group per position, lanes over the columns."""
    N, D = out.shape
    lane = cuda.threadIdx.x % LANES
    for p in range(cuda.grid(1) // LANES, N, cuda.gridsize(1) // LANES):
        t = feature_of_pos[p]
        i = np.int64(indices[p])
        skip = t < 0 or i < 0
        if not skip:
            skip = layout[t, 0] + (i + 1) * layout[t, 4] > weights.shape[0]
        for c in range(lane, D, LANES):
            if skip:
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
            launch(_rows, _groups(N), TPB, contiguous(weights), lay, feature, contiguous(indices), target)
        else:
            has = per_sample_weights is not None
            psw = contiguous(per_sample_weights) if has else m.zeros(1, np.float32)
            args = (contiguous(weights), lay, contiguous(indices), offs, B, pooling == 1, psw, has, target)
            launch(_pooled, _groups(T * B), TPB, *args)
    round_once(target, out)
