"""A written-out sort of int64 keys for host kernels and compiled verdicts (Numba).

``np.sort`` / ``np.argsort`` inside a Numba function compile Numba's own quicksort: ~1.1-1.5 s of
CPU on a cold cache, paid by the first call of every op that sorts in compiled code
(``jagged_unique_indices`` paid it twice: in its verdict and in its kernel). :func:`sort_keys`
is plain loops: insertion sort up to :data:`SMALL` keys, else a least-significant-digit radix
sort on bytes that skips every byte all keys share (ids below 2**20 take three passes), faster
than the quicksort it replaces. One compiled function serves every caller in a process.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

SMALL = 64  # keys up to which an insertion sort beats the radix passes' 256-entry histograms


@njit(cache=True, nogil=True)
def sort_keys(keys, scratch):
    """Sort the int64 array ``keys [n]`` (C-contiguous) ascending, in place (negative keys too).
    ``scratch``: int64, at least ``n + 256`` entries, overwritten (the caller allocates it:
    ``np.empty`` here would be a compile of its own)."""
    n = keys.shape[0]
    if n <= SMALL:
        for i in range(1, n):
            k = keys[i]
            j = i - 1
            while j >= 0 and keys[j] > k:
                keys[j + 1] = keys[j]
                j -= 1
            keys[j + 1] = k
        return
    ones = np.int64(0)  # bits set in some key
    zeros = np.int64(0)  # bits clear in some key
    for i in range(n):
        ones |= keys[i]
        zeros |= ~keys[i]
    varying = ones & zeros
    counts = scratch[n : n + 256]
    src, dst = keys, scratch[:n]
    in_scratch = False  # whether the last pass wrote the scratch array
    for shift in range(0, 64, 8):
        if (varying >> shift) & 0xFF == 0:
            continue
        flip = 0x80 if shift == 56 else 0  # the sign bit: negative keys first
        for d in range(256):
            counts[d] = 0
        for i in range(n):
            counts[((src[i] >> shift) & 0xFF) ^ flip] += 1
        acc = np.int64(0)
        for d in range(256):
            c = counts[d]
            counts[d] = acc
            acc += c
        for i in range(n):
            x = src[i]
            d = ((x >> shift) & 0xFF) ^ flip
            dst[counts[d]] = x
            counts[d] += 1
        src, dst = dst, src
        in_scratch = not in_scratch
    if in_scratch:
        for i in range(n):
            keys[i] = src[i]
