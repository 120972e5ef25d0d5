"""The bucket rule of ``block_bucketize_sparse_features`` (``docs/families/kjt.md``, the bucket rule)
for one id, written once in plain Python and compiled by both fast paths
(``numba.njit`` in ``embnum.cpu``, ``numba.cuda.jit(device=True)`` in
``embnum.cuda``), so they cannot drift apart.

Every quantity is a ``uint64`` (mixing signed and unsigned 64-bit integers
would make Numba fall back to float64): ``u`` is the id read as an unsigned
``w``-bit integer; ``mask`` is ``2**w - 1``. A key's constants come from
:func:`key_constants`, computed once per key on the host: ``bs`` (block size),
``G`` (blocks in the table), ``lb = G // my_size`` (blocks per bucket),
``width = bs * lb`` (ids per bucket) and ``limit = bs * G``. ``pos`` holds
every key's boundaries, ``my_size + 1`` of them from ``base`` on (unused when
``has_pos`` is false).
"""

import numpy as np


def key_constants(block_sizes, total_num_blocks, my_size):
    """``[T, 5]`` uint64 rows ``(bs, G, lb, width, limit)`` (host NumPy)."""
    bs = np.asarray(block_sizes, dtype=np.uint64)
    G = np.asarray(total_num_blocks, dtype=np.uint64)
    lb = G // np.uint64(my_size)
    return np.ascontiguousarray(np.stack([bs, G, lb, bs * lb, bs * G], axis=1).reshape(-1, 5))


def bucket_of(u, bs, G, lb, width, limit, t, mu, pos, has_pos, mask):
    """``(bucket as int64, new id as uint64)`` of the unsigned id ``u`` of key ``t``
    (the key's constants passed as scalars, loaded once per bag by the caller)."""
    if not has_pos:
        if u < limit:
            q = u // width
            return np.int64(q), u - q * width
        return np.int64((u % G) // lb), u // G
    m = np.int64(mu)
    base = t * (m + 1)
    if bs > np.uint64(0):
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
    if bs == np.uint64(0):
        new = u // G
    elif j < m:
        new = u - pos[base + j]
    else:
        new = u // mu
    return bucket, new


def uniform_new_id(u, bucket, G, width, limit):
    """The new id of ``u`` under uniform blocks when its ``bucket`` is already known
    (a multiply instead of a second division in the common row-wise case)."""
    if u < limit:
        return u - np.uint64(bucket) * width
    return u // G
