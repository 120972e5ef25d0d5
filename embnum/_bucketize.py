"""The bucket rule of ``block_bucketize_sparse_features`` (spec/kjt.md section 3.2)
for one id, written once in plain Python and compiled by both fast paths
(``numba.njit`` in ``embnum.cpu``, ``numba.cuda.jit(device=True)`` in
``embnum.cuda``), so they cannot drift apart.

Every quantity is a ``uint64`` (mixing signed and unsigned 64-bit integers
would make Numba fall back to float64): ``u`` is the id read as an unsigned
``w``-bit integer, ``bs``/``G`` the key's block size and block count, ``mu``
``my_size``, ``mask`` ``2**w - 1``. ``pos`` holds every key's boundaries,
``my_size + 1`` of them from ``base`` on (unused when ``has_pos`` is false).
"""
import numpy as np


def bucket_of(u, bs, G, mu, pos, base, has_pos, mask):
    """``(bucket as int64, new id as uint64)`` of the unsigned id ``u``."""
    zero = np.uint64(0)
    if not has_pos:
        lb = G // mu
        if u < bs * G:
            width = bs * lb
            bucket = u // width
            new = u % width
        else:
            bucket = (u % G) // lb
            new = u // G
        return np.int64(bucket), new
    m = np.int64(mu)
    if bs > zero:
        key = u
    else:
        key = (((u % G) * pos[base + m]) & mask) // G  # wraps at w bits, as fbgemm does
    lo = np.int64(0)  # pos[base] == 0 <= key: find the largest j with pos[base + j] <= key
    hi = m
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pos[base + mid] <= key:
            lo = mid
        else:
            hi = mid - 1
    j = lo
    if j < m:
        bucket = np.int64(j)
    else:
        bucket = np.int64(u % mu)
    if bs == zero:
        new = u // G
    elif j < m:
        new = u - pos[base + j]
    else:
        new = u // mu
    return bucket, new
