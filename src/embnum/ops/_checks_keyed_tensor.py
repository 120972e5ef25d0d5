"""The keyed_tensor declarations' compiled verdict (``embnum.ops.keyed_tensor`` loads this module
on first use, where Numba is importable): it never raises; a rejection reruns the exact rules,
which name the error.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit

_jit = njit(cache=True, nogil=True)


@_jit
def pooled_lists_ok(offs, perm, inv_offs, inv, D):
    """Whether the four lists of ``permute_pooled_embs`` pass every rule of its declaration
    (``embnum.ops.keyed_tensor``): ``offs [T+1]`` starts at 0, never decreases and ends at ``D``;
    ``perm [T]`` is a permutation of ``0..T-1``; ``inv [T]`` its inverse; ``inv_offs [T+1]`` is 0
    followed by the running sum of the permuted widths. One pass each, no temporaries but a
    ``[T]`` table; never wraps (the widths are >= 0 and sum to ``D``, checked before they are
    added). 1-D int32/int64 arrays of any mix."""
    n = offs.shape[0]
    if n < 1 or offs[0] != 0 or offs[n - 1] != D:
        return False
    for k in range(1, n):
        if offs[k] < offs[k - 1]:
            return False
    T = n - 1
    if perm.shape[0] != T or inv.shape[0] != T or inv_offs.shape[0] != n:
        return False
    seen = np.full(T, -1, np.int64)
    for t in range(T):
        p = np.int64(perm[t])
        if p < 0 or p >= T or seen[p] >= 0:
            return False
        seen[p] = t
    for p in range(T):
        if inv[p] != seen[p]:
            return False
    if inv_offs[0] != 0:
        return False
    acc = np.int64(0)
    for t in range(T):
        p = np.int64(perm[t])
        acc += np.int64(offs[p + 1]) - np.int64(offs[p])
        if inv_offs[t + 1] != acc:
            return False
    return True
