"""Generic one-pass reductions for the data checks, compiled by Numba.

Each NumPy reduction on a small array costs about 1-3 us of Python and dispatch; a
warm Numba call about 0.2 us. The reductions that checks must read the data with (the
summary of an offsets array, the range of ids, an exact bounded sum, a permutation's
flags) therefore run here, each in one pass, when the array is a
NumPy array and Numba is importable (``embnum._validate.compiled`` loads this module on first
use; ``_validate`` keeps its NumPy formulation for CuPy arrays and when Numba is missing).
They only report; the callers raise, with the messages of their exact rules.

A family's compiled verdicts (one pass checking every rule of a declaration) sit beside the
family's declaration, in ``embnum/ops/_checks_<family>.py`` (and ``embnum/_tbe_bounds_numba.py``
beside the TBE lookups rule), built from these reductions. Overflow-safe throughout: sums are
bounded before adding (``y > limit - total``), products by division, differences only of
ordered values.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

_jit = njit(cache=True, nogil=True)
# The helpers the family verdicts call are inlined into them (Numba's IR): a called function is a
# compile of its own, ~0.1-0.3 s of CPU in a verdict's first call on a cold cache; inlined, the
# verdict is one compile. Still callable from Python as they are.
_inline = njit(cache=True, nogil=True, inline="always")


@_jit
def offsets_summary(offs):
    """``(offs[0], the first i with offs[i] < offs[i-1] or 0, offs[-1])`` of a 1-D
    integer array with at least one entry, as int64."""
    n = offs.shape[0]
    prev = offs[0]
    for i in range(1, n):
        x = offs[i]
        if x < prev:
            return np.int64(offs[0]), i, np.int64(offs[n - 1])
        prev = x
    return np.int64(offs[0]), 0, np.int64(offs[n - 1])


@_jit
def min_max(a):
    """``(min, max)`` of an integer array with at least one entry, as int64 (entries
    of uint64 above int64 are not expected: index dtypes are int32/int64). Compared in
    the array's own dtype with selects, not branches, so the loop vectorises: 7 us
    instead of 115 us for 106,496 int32 entries (the branchy int64 loop)."""
    lo = hi = a.flat[0]
    for y in a.flat:
        lo = y if y < lo else lo
        hi = y if y > hi else hi
    return np.int64(lo), np.int64(hi)


@_jit
def bounded_sum(a, limit):
    """The exact sum of the integer array ``a`` when every entry is ``>= 0`` and the
    sum is at most ``limit`` (``0 <= limit < 2**63``); ``-1`` otherwise (the caller then
    finds out which and says so). Never wraps: ``x > limit - total`` is tested before
    adding, with ``0 <= total <= limit``."""
    total = np.int64(0)
    for x in a.flat:
        y = np.int64(x)
        if y < 0 or y > limit - total:
            return np.int64(-1)
        total += y
    return total


@_jit
def sum_summary(a, limit):
    """``(min, total, big)`` of a non-empty integer array: ``big`` is 1 when the entries
    ``>= 0`` sum past ``limit`` (``total`` is then partial); otherwise ``total`` is their
    exact sum. Never wraps (``x > limit - total`` is tested before adding)."""
    mn = np.int64(a.flat[0])
    total = np.int64(0)
    big = 0
    for x in a.flat:
        y = np.int64(x)
        if y < mn:
            mn = y
        if y >= 0 and big == 0:
            if y > limit - total:
                big = 1
            else:
                total += y
    return mn, total, big


@_jit
def permutation_flags(p):
    """``(in_range, once)`` of a 1-D integer array of ``n`` entries: ``in_range`` 1 when every
    entry lies in ``[0, n)``; ``once`` 1 when, in addition, no value repeats (``p`` is then a
    permutation of ``0..n-1``). One pass with a byte per value."""
    n = p.shape[0]
    seen = np.zeros(n, np.uint8)
    once = 1
    for i in range(n):
        x = np.int64(p[i])
        if x < 0 or x >= n:
            return 0, 0
        once &= 1 - seen[x]
        seen[x] = 1
    return 1, once


@_jit
def row_sums(a):
    """int64 sums of the rows of a 2-D integer array (wrapping as NumPy's int64 sum wraps; the
    callers check totals exactly elsewhere). One vectorised pass, no int64 copy."""
    R = a.shape[0]
    out = np.empty(R, np.int64)
    for r in range(R):
        row = a[r]
        acc = np.int64(0)
        for b in range(row.shape[0]):
            acc += row[b]
        out[r] = acc
    return out


@_inline
def offsets_last(offs, first_zero, n_values):
    """``offs[-1]`` (as int64, ``>= 0``) when the 1-D offsets (at least one entry) start at 0
    (``first_zero``) or at ``>= 0``, never decrease and end at ``<= n_values`` (``n_values < 0``: no
    bound); -1 otherwise."""
    first = offs[0]
    if first < 0 or (first_zero and first != 0):
        return np.int64(-1)
    prev = first
    for i in range(1, offs.shape[0]):
        x = offs[i]
        if x < prev:
            return np.int64(-1)
        prev = x
    if n_values >= 0 and np.int64(prev) > n_values:
        return np.int64(-1)
    return np.int64(prev)


@_inline
def bounded_add(total, y, limit):
    """``total + y`` when ``y >= 0`` and the sum stays ``<= limit`` (``0 <= total <= limit``), else -1."""
    if y < 0 or y > limit - total:
        return np.int64(-1)
    return total + y


@_inline
def row_total(row, limit):
    """The exact sum of the 1-D integer array ``row`` when every entry is ``>= 0`` and the sum is at
    most ``limit``, else -1. One vectorised pass (sum, min and max with selects) when ``len(row) *
    max(row)`` cannot pass int64 (every int32 row shorter than 2**32 entries); bounded adds otherwise."""
    n = row.shape[0]
    if n == 0:
        return np.int64(0)
    acc = np.int64(0)
    lo = hi = row[0]
    for i in range(n):  # indexed, with selects: vectorises (an iterator over the row did not, 7x slower)
        x = row[i]
        acc += x
        lo = x if x < lo else lo  # not min()/max(): their overloads are compiles of their own
        hi = x if x > hi else hi
    if lo < 0:
        return np.int64(-1)
    if np.int64(hi) <= np.int64(9223372036854775807) // n:  # n * max < 2**63: the int64 sum is exact
        return acc if acc <= limit else np.int64(-1)
    total = np.int64(0)
    for x in row:
        total = bounded_add(total, np.int64(x), limit)
        if total < 0:
            break
    return total
