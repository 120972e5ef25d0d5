"""Variable batch per feature on the cpu backend (``embnum._tbe_vbe``): the TBE entry points run
on the padded ``[B_max, total_D]`` form, and these kernels move rows between it and the flat,
rank-major VBE output (forward: gather; backward: scatter of the gradient into zeros)."""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from .._jit import njit

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


def gather(padded, out, vbe, D_offsets):
    """``out`` (flat ``[output_size]``) <- the padded ``[B_max, total_D]`` result (same dtype)."""
    _move(_bits(padded), _bits(out), vbe.rank_offsets, vbe.output_offsets, D_offsets, True)


def scatter(grad_output, vbe, D_offsets, B):
    """The flat VBE gradient placed in a zeroed padded ``[B, total_D]`` array of its dtype."""
    padded = np.zeros((B, int(D_offsets[-1])), grad_output.dtype)
    _move(
        _bits(padded), _bits(np.ascontiguousarray(grad_output)), vbe.rank_offsets, vbe.output_offsets, D_offsets, False
    )
    return padded


def forward(entry):
    """``tbe_forward`` with VBE: the entry point fills a padded scratch, then one gather."""

    @functools.wraps(entry)
    def run(weights, output_dtype, out, vbe=None, **lookup):
        if vbe is None:
            return entry(weights, output_dtype, out, **lookup)
        doff = lookup["D_offsets"]
        padded = np.empty((lookup["B"], int(doff[-1])), out.dtype)
        entry(weights, output_dtype, padded, **lookup)
        gather(padded, out, vbe, doff)
        return None

    return run


def backward(entry):
    """A TBE backward entry point with VBE: the flat gradient scattered to the padded form first."""

    @functools.wraps(entry)
    def run(grad_output, *args, vbe=None, **kw):
        if vbe is not None:
            grad_output = scatter(grad_output, vbe, kw["D_offsets"], kw["B"])
        return entry(grad_output, *args, **kw)

    return run
