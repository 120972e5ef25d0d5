"""Variable batch per feature on the cuda backend (``embnum._tbe_vbe``): the TBE entry points run
on the padded ``[B_max, total_D]`` form, and one kernel moves rows between it and the flat,
rank-major VBE output (forward: gather; backward: scatter of the gradient into zeros).

One thread per flat element, grid-stride: consecutive threads touch consecutive flat elements
and consecutive columns of a padded row (coalesced); each element is moved once (no atomics);
the map is small host metadata uploaded once per content (``constant``), nothing is read back."""

from __future__ import annotations

from numba import cuda

from .._jit import cuda_kernel
from .._tbe_vbe import entry_points
from ._common import TPB, bits, blocks, constant, launch, xp


@cuda_kernel
def _move(padded, flat, rank_offsets, output_offsets, doff, to_flat):
    """Flat element ``i`` lies in block ``k = r*T + t`` (the last ``k`` with ``output_offsets[k] <= i``,
    by binary search; empty blocks are skipped by it): padded row ``rank_offsets[t, r] + j // D_t``,
    column ``doff[t] + j % D_t`` with ``j = i - output_offsets[k]``."""
    T = rank_offsets.shape[0]
    n_blocks = output_offsets.shape[0] - 1
    total = output_offsets[n_blocks]
    for i in range(cuda.grid(1), total, cuda.gridsize(1)):
        lo = 0
        hi = n_blocks
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if output_offsets[mid] <= i:
                lo = mid
            else:
                hi = mid
        r = lo // T
        t = lo - r * T
        c0 = doff[t]
        D = doff[t + 1] - c0
        j = i - output_offsets[lo]
        b = rank_offsets[t, r] + j // D
        c = c0 + j % D
        if to_flat:
            flat[i] = padded[b, c]
        else:
            padded[b, c] = flat[i]


def _run(padded, flat, vbe, D_offsets, to_flat):
    if vbe.output_size == 0:
        return
    # copies: the map is cached read-only, and the simulator writes every host argument back
    maps = (vbe.rank_offsets.copy(), vbe.output_offsets.copy(), D_offsets.copy())
    args = (*(constant(m) for m in maps), to_flat)
    launch(_move, blocks(vbe.output_size, TPB), TPB, bits(padded), bits(flat), *args)


forward, backward = entry_points(_run, xp)
