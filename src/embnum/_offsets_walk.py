"""Walks between dense positions and jagged segments, written once in plain
Python and compiled by both fast paths (``numba.njit`` in ``embnum.cpu``,
``numba.cuda.jit(device=True)`` in ``embnum.cuda``).

The J offsets arrays of a jagged tensor arrive packed: ``offs`` is their
concatenation (int64) and ``starts[k]`` the index of ``offsets[k][0]`` in it.
A *slab* is one position ``(b, i_1, ..., i_{J-1})`` of a dense array's
leading axes, numbered row-major with radices ``(B, lens[0], ..., lens[J-2])``
(``lens`` = the dense lengths ``M_1 .. M_J``).
"""

import numpy as np


def leaf_segment(offs, starts, lens, slab):
    """The segment of ``offsets[J-1]`` that ``slab`` reads, or -1.

    ``r = b``; then for each level ``r = offsets[k][r] + i_{k+1}`` while
    ``i_{k+1}`` lies inside segment ``r`` of ``offsets[k]``.
    """
    J = lens.shape[0]
    slab = np.int64(slab)  # prange indices may arrive unsigned; keep arithmetic signed
    inner = np.int64(1)
    for k in range(J - 1):
        inner *= lens[k]
    r = slab // inner if inner > 0 else np.int64(0)
    rest = slab - r * inner
    for k in range(J - 1):
        inner //= lens[k]
        i = rest // inner
        rest -= i * inner
        start = offs[starts[k] + r]
        if i >= offs[starts[k] + r + 1] - start:
            return np.int64(-1)
        r = start + i
    return r


def slab_of_segment(offs, starts, lens, seg):
    """Inverse of :func:`leaf_segment`: the slab that reads segment ``seg`` of
    ``offsets[J-1]``, or -1 when none does (a parent position is past its
    dense length, or ``seg`` lies in no parent segment)."""
    J = lens.shape[0]
    slab = np.int64(0)
    stride = np.int64(1)
    s = np.int64(seg)
    for k in range(J - 2, -1, -1):
        lo = starts[k]
        hi = starts[k + 1] - 1  # index of offsets[k][-1]
        if s < offs[lo] or s >= offs[hi]:
            return np.int64(-1)
        a = lo  # binary search: the last p with offs[p] <= s
        b = hi
        while b - a > 1:
            mid = (a + b) // 2
            if offs[mid] <= s:
                a = mid
            else:
                b = mid
        i = s - offs[a]
        if i >= lens[k]:
            return np.int64(-1)
        slab += i * stride
        stride *= lens[k]
        s = a - lo
    return s * stride + slab


def segment_of(offs, lo, hi, e):
    """The last ``p`` in ``[lo, hi]`` with ``offs[p] <= e`` (``offs`` non-decreasing and
    ``offs[lo] <= e``): the segment that holds element ``e`` when ``offs`` are segment
    starts, empty segments skipped. A binary search, so a thread can find its segment
    from its element alone (grids over elements, not over segments)."""
    a = np.int64(lo)
    b = np.int64(hi)
    while a < b:
        mid = (a + b + 1) // 2
        if offs[mid] <= e:
            a = mid
        else:
            b = mid - 1
    return a


def packed_dense(dense, offsets, bits, pack_offsets, to_device):
    """``(src, offs, starts, lens, M, D)``: what a dense -> jagged kernel of either fast path takes
    for ``dense [B, M_1..M_J, D]`` (its bits flat, the offsets packed as above, the dense lengths
    ``M_1..M_J`` as int64 on the kernel's side). ``bits``/``pack_offsets``/``to_device`` are the
    fast path's own helpers."""
    src = bits(dense).reshape(-1)
    offs, starts = pack_offsets(offsets)
    lens = to_device(np.asarray(dense.shape[1:-1], dtype=np.int64))
    return src, offs, starts, lens, dense.shape[-2], dense.shape[-1]
