"""The TBE lookups rule's compiled checks (``embnum._tbe_bounds`` loads this module on first use,
where Numba is importable): comparisons only, so nothing wraps; they never raise, a rejection takes
the exact rules of ``_tbe_bounds``, which name the error or repair.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

_jit = njit(cache=True, nogil=True)


@_jit
def first_bad_feature(indices, offsets, B, rows):
    """The first feature ``t`` with an index outside ``[0, rows[t])`` in its bags
    ``offsets[t*B] .. offsets[(t+1)*B]``, or -1 (``offsets`` already valid: non-decreasing
    within ``[0, len(indices)]``)."""
    for t in range(rows.shape[0]):
        E = rows[t]
        for p in range(offsets[t * B], offsets[(t + 1) * B]):
            x = np.int64(indices[p])
            if x < 0 or x >= E:
                return t
    return -1


@_jit
def tbe_lookups_ok(indices, offsets, B, rows, pruned_ok):
    """Whether ``embnum._tbe_bounds.check`` accepts the lookups as they are (no error, no repair):
    ``offsets [T*B+1]`` starts at >= 0, never decreases and ends at ``N = len(indices)``; every
    index in a bag of feature ``t`` (``offsets[t*B] .. offsets[(t+1)*B]``) lies in ``[0, rows[t])``,
    or is ``-1`` when ``pruned_ok``. One pass over the offsets, one over the bags' indices;
    comparisons only (no arithmetic on entries), so nothing wraps."""
    n = offsets.shape[0]
    N = indices.shape[0]
    if n < 1 or offsets[0] < 0 or offsets[n - 1] != N:
        return False
    down = False
    for i in range(1, n):
        down |= offsets[i] < offsets[i - 1]
    if down:
        return False
    # (each loop below ORs its comparisons with no early exit, so LLVM vectorises it: a branch
    # per index kept the check scalar, ~1.7 ns an index)
    for t in range(rows.shape[0]):
        E = rows[t]
        bad = False
        for p in range(offsets[t * B], offsets[(t + 1) * B]):
            x = np.int64(indices[p])
            bad |= (x < 0) & ~(pruned_ok & (x == -1)) | (x >= E)
        if bad:
            return False
    return True
