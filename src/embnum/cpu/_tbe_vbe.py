"""Variable batch per feature on the cpu backend (``embnum._tbe_vbe``): the TBE entry points run
on the padded ``[B_max, total_D]`` form, and these kernels move rows between it and the flat,
rank-major VBE output (forward: gather; backward: scatter of the gradient into zeros)."""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import njit
from .._tbe_vbe import entry_points

_BITS = {2: np.uint16, 4: np.uint32}  # rows are copied as bits: float16 and float32 alike


@njit(cache=True, parallel=True, nogil=True)
def _move(padded, flat, rank_offsets, output_offsets, doff, to_flat):
    """Block ``(r, t)`` (at ``k = r*T + t``): its ``B[t, r]`` rows of ``D_t`` elements, from padded
    row ``rank_offsets[t, r] + j``, columns ``doff[t]:doff[t+1]``, to ``flat[output_offsets[k]:]``
    (or back when not ``to_flat``). Each element is moved once."""
    T = rank_offsets.shape[0]
    R = rank_offsets.shape[1] - 1
    for k in prange(R * T):
        r = k // T
        t = k - r * T
        c0 = doff[t]
        D = doff[t + 1] - c0
        b0 = rank_offsets[t, r]
        n = rank_offsets[t, r + 1] - b0
        o = output_offsets[k]
        for j in range(n):
            for d in range(D):
                if to_flat:
                    flat[o + j * D + d] = padded[b0 + j, c0 + d]
                else:
                    padded[b0 + j, c0 + d] = flat[o + j * D + d]


def _bits(a):
    return a.view(_BITS[a.dtype.itemsize])


def _run(padded, flat, vbe, D_offsets, to_flat):
    """Rows between the padded ``[B_max, total_D]`` array and the flat ``[output_size]`` one (same
    dtype): to ``flat`` when ``to_flat``, else into ``padded``."""
    flat = flat if to_flat else np.ascontiguousarray(flat)
    _move(_bits(padded), _bits(flat), vbe.rank_offsets, vbe.output_offsets, D_offsets, to_flat)


forward, backward = entry_points(_run, lambda: np)
