"""The jagged declarations' compiled verdicts (``embnum.ops.jagged`` loads this module on first use,
where Numba is importable). Each returns a verdict and never raises: on a failing one the
declaration runs its exact rules, which name the error. Never wraps: sums are bounded before
adding, products tested by division.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .._validate_numba import min_max, offsets_last

_jit = njit(cache=True, nogil=True)
_I32_MAX = np.int64(2**31 - 1)
_I32_MIN = np.int64(-(2**31))


@_jit
def csr_ok(csr, batch_size, n_values):
    """1 when ``csr`` (1-D, at least one entry) is valid offsets (``>= 0``, non-decreasing) and
    ``csr[-1] * batch_size <= n_values`` (tested as ``csr[-1] <= n_values // batch_size``), else 0."""
    last = offsets_last(csr, False, -1)
    if last < 0 or (batch_size > 0 and last > n_values // batch_size):
        return 0
    return 1


@_jit
def int32_prefix_fits(a, drop_last):
    """Whether every running sum of each row of the int32 array ``a`` (1-D: one row; 2-D: along
    the last axis; a row's last entry left out when ``drop_last``) lies in int32: the verdict of
    ``ops.jagged._cumsum_fits_int32``'s exact rule, in one call. First the bound of one
    vectorised min/max pass (``max * n <= INT32_MAX`` and ``min * n >= -INT32_MAX``, compared
    by division: never wraps); only when it fails, the exact row sums, in int64 and stopped at
    the first one outside int32 (each step adds at most 2**31 in magnitude: never wraps)."""
    n = a.shape[-1]
    if a.size == 0 or n == 0 or (drop_last and n < 2):
        return True
    lo, hi = min_max(a)
    n64 = np.int64(n)
    if (hi <= 0 or hi <= _I32_MAX // n64) and (lo >= 0 or -lo <= _I32_MAX // n64):
        return True
    rows = np.atleast_2d(a)
    m = n - 1 if drop_last else n
    for r in range(rows.shape[0]):
        acc = np.int64(0)
        for j in range(m):
            acc += np.int64(rows[r, j])
            if acc > _I32_MAX or acc < _I32_MIN:
                return False
    return True
