"""The TBE layout's compiled check (``embnum.ops.tbe`` loads this module on first use, where Numba
is importable): every rule of ``embnum.ops.tbe.layout`` in one pass; it never raises, a rejection
takes the exact rules, which name the error.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit

_jit = njit(cache=True, nogil=True)


@_jit
def _stable_order(a):
    """``np.argsort(a, kind="mergesort")`` of int64 ``a``: the identity when ``a`` is already
    non-decreasing (a TBE's tables usually are), else a bottom-up merge sort. Written out, in
    plain loops: Numba's own ``argsort`` costs ~1 s to compile, which every TBE op's first call
    paid, and ``np.arange``, ``min`` and swapping the two buffers' names 0.37 s more."""
    n = a.shape[0]
    order = np.empty(n, np.int64)
    for i in range(n):
        order[i] = i
    j = 1
    while j < n and a[j - 1] <= a[j]:
        j += 1
    if j >= n:
        return order
    merged = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = lo + width
            if mid > n:
                mid = n
            hi = lo + 2 * width
            if hi > n:
                hi = n
            i = lo
            k = mid
            for o in range(lo, hi):
                if k >= hi or (i < mid and a[order[i]] <= a[order[k]]):
                    merged[o] = order[i]
                    i += 1
                else:
                    merged[o] = order[k]
                    k += 1
        for o in range(n):
            order[o] = merged[o]
        width *= 2
    return order


@_jit
def tbe_layout_rows(woff, doff, hcs, W):
    """The rows of every feature (int64 ``[T]``, ``embnum._tbe_bounds.rows_per_feature``) when the
    TBE layout is valid by every rule of ``embnum.ops.tbe.layout``, else an empty array (the
    caller then runs the exact checks, which name the rule). ``woff`` int64 ``[T]`` (T >= 1),
    ``doff``/``hcs`` int64 ``[T+1]``, ``W`` the length of weights (>= 0). Never wraps: entries are
    compared before any difference is taken, and a table's end is tested as
    ``rows > (W - woff) // dims``."""
    T = woff.shape[0]
    bad = np.empty(0, np.int64)
    if doff[0] != 0 or hcs[0] != 0 or hcs[T] <= hcs[T - 1]:
        return bad
    for t in range(T):
        if doff[t + 1] <= doff[t] or hcs[t + 1] < hcs[t]:
            return bad
    rows = np.empty(T, np.int64)
    nxt = hcs[T]
    for t in range(T - 1, -1, -1):  # next strictly larger entry minus this one (>= 0: no wrap)
        if hcs[t + 1] > hcs[t]:
            nxt = hcs[t + 1]
        rows[t] = nxt - hcs[t]
    first = 0  # the first feature of the current table (equal hash_size_cumsum entries are adjacent)
    for t in range(T):
        dims = doff[t + 1] - doff[t]  # >= 1, entries >= 0: no wrap
        if woff[t] < 0 or woff[t] > W or rows[t] > (W - woff[t]) // dims:
            return bad
        if t > 0 and hcs[t] == hcs[first]:
            if woff[t] != woff[first] or dims != doff[first + 1] - doff[first]:
                return bad
        else:
            first = t
    # the tables (first feature of each) in order of weights_offsets: none may reach into the next
    firsts = np.empty(T, np.int64)
    k = 0
    for t in range(T):
        if t == 0 or hcs[t] != hcs[t - 1]:
            firsts[k] = t
            k += 1
    starts = np.empty(k, np.int64)
    for j in range(k):
        starts[j] = woff[firsts[j]]
    order = _stable_order(starts)
    for j in range(k - 1):
        a = firsts[order[j]]
        b = firsts[order[j + 1]]
        if woff[a] + rows[a] * (doff[a + 1] - doff[a]) > woff[b]:  # the end fits in W (checked above)
            return bad
    return rows
