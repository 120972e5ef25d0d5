"""One-pass data checks for :mod:`embnum._validate` on NumPy arrays, compiled by Numba.

Each NumPy reduction on a small array costs about 1-3 us of Python and dispatch; a
warm Numba call about 0.2 us. The checks that must read the data (offsets monotone,
the range of ids, an exact bounded sum) therefore run here, each in one pass, when
the array is a NumPy array and Numba is importable (``_validate`` loads this module
on first use and keeps its NumPy formulation for CuPy arrays and when Numba is
missing). The functions only report; ``_validate`` raises, with the same messages.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

_jit = njit(cache=True, nogil=True)


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
    order = np.argsort(starts, kind="mergesort")
    for j in range(k - 1):
        a = firsts[order[j]]
        b = firsts[order[j + 1]]
        if woff[a] + rows[a] * (doff[a + 1] - doff[a]) > woff[b]:  # the end fits in W (checked above)
            return bad
    return rows


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


# ---------------------------------------------------------------------------------------------
# One-pass verdicts of the jagged, kjt and quant declarations on host data.
# Each returns a verdict (and the sizes the plan needs) and never raises: on a failing verdict the
# declaration reruns its exact Python rules, which name the error. Overflow-safe: sums are bounded
# before adding (``y > limit - total``), products by division, differences only of ordered values.
# ---------------------------------------------------------------------------------------------


@_jit
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


@_jit
def csr_ok(csr, batch_size, n_values):
    """1 when ``csr`` (1-D, at least one entry) is valid offsets (``>= 0``, non-decreasing) and
    ``csr[-1] * batch_size <= n_values`` (tested as ``csr[-1] <= n_values // batch_size``), else 0."""
    last = offsets_last(csr, False, -1)
    if last < 0 or (batch_size > 0 and last > n_values // batch_size):
        return 0
    return 1


@_jit
def _bounded_add(total, y, limit):
    """``total + y`` when ``y >= 0`` and the sum stays ``<= limit`` (``0 <= total <= limit``), else -1."""
    if y < 0 or y > limit - total:
        return np.int64(-1)
    return total + y


@_jit
def _row_total(row, limit):
    """The exact sum of the 1-D integer array ``row`` when every entry is ``>= 0`` and the sum is at
    most ``limit``, else -1. One vectorised pass (sum, min and max with selects) when ``len(row) *
    max(row)`` cannot pass int64 (every int32 row shorter than 2**32 entries); bounded adds otherwise."""
    n = row.shape[0]
    if n == 0:
        return np.int64(0)
    acc = np.int64(0)
    lo = hi = row[0]
    for i in range(n):  # indexed, with min/max: vectorises (an iterator over the row did not, 7x slower)
        x = row[i]
        acc += x
        lo = min(lo, x)
        hi = max(hi, x)
    if lo < 0:
        return np.int64(-1)
    if np.int64(hi) <= np.int64(9223372036854775807) // n:  # n * max < 2**63: the int64 sum is exact
        return acc if acc <= limit else np.int64(-1)
    total = np.int64(0)
    for x in row:
        total = _bounded_add(total, np.int64(x), limit)
        if total < 0:
            break
    return total


@_jit
def permute_totals_2d(permute, lengths, limit):
    """``(N, M)`` of a 2-D permute (``permute_2d_sparse_data``): ``N`` the exact total of the
    ``[T, B]`` lengths, ``M`` the exact total of the rows ``permute`` selects; ``(-1, -1)`` when a
    length is negative, a total passes ``limit`` or an entry of ``permute`` is outside ``[0, T)``."""
    T = lengths.shape[0]
    sizes = np.empty(T, np.int64)
    N = np.int64(0)
    for t in range(T):
        row = _row_total(lengths[t], limit)
        sizes[t] = row
        N = _bounded_add(N, row, limit)  # -1 when row is -1
        if N < 0:
            return np.int64(-1), np.int64(-1)
    M = _selected_total(permute, sizes, limit)
    return (N, M) if M >= 0 else (np.int64(-1), np.int64(-1))


@_jit
def permute_totals_1d(permute, lengths, limit):
    """:func:`permute_totals_2d` for a flat list of segments (``lengths`` 1-D ``[S]``)."""
    N = _row_total(lengths, limit)
    M = _selected_total(permute, lengths, limit) if N >= 0 else np.int64(-1)
    return (N, M) if M >= 0 else (np.int64(-1), np.int64(-1))


@_jit
def _selected_total(permute, sizes, limit):
    """The exact total of ``sizes[permute[i]]`` (``sizes`` entries ``>= 0``) when every entry of
    ``permute`` lies in ``[0, len(sizes))`` and the total is at most ``limit``, else -1."""
    M = np.int64(0)
    for i in range(permute.shape[0]):
        p = np.int64(permute[i])
        if p < 0 or p >= sizes.shape[0]:
            return np.int64(-1)
        M = _bounded_add(M, np.int64(sizes[p]), limit)
        if M < 0:
            return np.int64(-1)
    return M


@_jit
def index_select_totals(lengths, offsets, indices, batch_size, limit):
    """``(N, M)`` of ``keyed_jagged_index_select_dim1`` (``batch_size >= 1`` divides ``len(lengths)``,
    ``len(offsets) == len(lengths) + 1``): ``N`` the exact total of the lengths, ``M`` that of the
    bags ``indices`` selects from every key; ``(-1, -1)`` when a length is negative, a total passes
    ``limit``, ``offsets`` is not the complete cumsum of ``lengths`` or an index is outside
    ``[0, batch_size)``."""
    bad = (np.int64(-1), np.int64(-1))
    if offsets[0] != 0:
        return bad
    N = np.int64(0)
    for k in range(lengths.shape[0]):
        N = _bounded_add(N, np.int64(lengths[k]), limit)
        if N < 0 or np.int64(offsets[k + 1]) != N:
            return bad
    for j in range(indices.shape[0]):
        x = np.int64(indices[j])
        if x < 0 or x >= batch_size:
            return bad
    M = np.int64(0)
    for t in range(lengths.shape[0] // batch_size):
        for j in range(indices.shape[0]):
            M = _bounded_add(M, np.int64(lengths[t * batch_size + indices[j]]), limit)
            if M < 0:
                return bad
    return N, M


@_jit
def expand_permute_ok(permute, input_offset, output_offset, output_size):
    """1 when the arguments of ``expand_into_jagged_permute`` (``len(permute) = T``, both offsets
    ``T + 1`` entries) pass every rule: both offsets start at 0 and never decrease,
    ``output_offset[-1] == output_size``, ``permute`` in ``[0, T)`` and output segment ``t`` as long
    as input segment ``permute[t]``; else 0."""
    T = permute.shape[0]
    if offsets_last(input_offset, True, -1) < 0 or offsets_last(output_offset, True, -1) < 0:
        return 0
    if np.int64(output_offset[T]) != output_size:
        return 0
    for t in range(T):
        p = np.int64(permute[t])
        if p < 0 or p >= T:
            return 0
    for t in range(T):
        p = permute[t]
        # both arrays are non-decreasing from 0: the differences are >= 0 and cannot wrap
        if np.int64(output_offset[t + 1]) - np.int64(output_offset[t]) != np.int64(input_offset[p + 1]) - np.int64(
            input_offset[p]
        ):
            return 0
    return 1


@_jit
def bucketize_plain(lengths, block_sizes, my_size, keep, limit, id_max):
    """The host arrays ``block_bucketize_sparse_features`` hands its kernel in the plain case (no
    per-key batch sizes, block counts, boundaries or keep flags): ``(N, block_sizes as int64,
    batch [T], total_num_blocks [T], keep [T])``, ``N`` the exact total of the lengths; ``N = -1``
    when a length or a block size is negative, the total passes ``limit``, ``len(lengths)`` is not a
    multiple of ``T = len(block_sizes)`` (or not 0 when ``T = 0``) or a block size times ``my_size``
    (``>= 1``) passes ``id_max`` (tested as ``block_size > id_max // my_size``)."""
    T = block_sizes.shape[0]
    n_bags = lengths.shape[0]
    bs = np.empty(T, np.int64)
    batch = np.empty(T, np.int64)
    blocks = np.empty(T, np.int64)
    flags = np.empty(T, np.bool_)
    N = np.int64(0)
    if (T == 0 and n_bags != 0) or (T > 0 and n_bags % T != 0):
        N = np.int64(-1)
    for t in range(T):
        x = np.int64(block_sizes[t])
        if x < 0 or x > id_max // my_size:
            N = np.int64(-1)
        bs[t] = x
        batch[t] = n_bags // T
        blocks[t] = my_size
        flags[t] = keep
    if N == 0:
        N = _row_total(lengths, limit)
    return N, bs, batch, blocks, flags


@_jit
def unique_count(hsc, hso, offsets, indices, B):
    """The output size ``K`` of ``jagged_unique_indices`` (``T = len(hsc) - 1 >= 1``,
    ``len(hso) = T + 1``, ``len(offsets) = T * B + 1``) when every rule holds: the three offsets
    arrays start at 0 and never decrease, ``hso[-1] = T``, ``offsets[-1] = len(indices)``, the
    features of a table share one ``hsc`` entry, ids are ``>= 0`` and below their table's hash size
    (the last table's: at most ``2**63 - 1 - hsc[a]``); else -1. ``K`` counts the distinct ids per
    table (a sorted copy of each table's ids)."""
    T = hsc.shape[0] - 1
    if offsets_last(hsc, True, -1) < 0 or offsets_last(hso, True, -1) < 0 or offsets_last(offsets, True, -1) < 0:
        return np.int64(-1)
    if np.int64(hso[T]) != T or np.int64(offsets[offsets.shape[0] - 1]) != indices.shape[0]:
        return np.int64(-1)
    for i in range(indices.shape[0]):
        if indices[i] < 0:
            return np.int64(-1)
    K = np.int64(0)
    last = T - 1
    while last > 0 and hso[last] >= hso[last + 1]:
        last -= 1
    for g in range(T):
        a, b = np.int64(hso[g]), np.int64(hso[g + 1])
        if a >= b:
            continue
        for f in range(a, b):
            if hsc[f] != hsc[a]:
                return np.int64(-1)
        # the last table's ids are unbounded above, but hsc[a] + id must not wrap (hsc[a] >= 0)
        cap = np.int64(9223372036854775807) - np.int64(hsc[a]) if g == last else np.int64(hsc[b]) - np.int64(hsc[a]) - 1
        ids = np.sort(indices[offsets[a * B] : offsets[b * B]])
        n = ids.shape[0]
        if n:
            if np.int64(ids[n - 1]) > cap:
                return np.int64(-1)
            K += 1
            for r in range(1, n):
                if ids[r] != ids[r - 1]:
                    K += 1
    return K


# -- keyed_tensor and TBE verdicts ------------------------------------------------------
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
    for i in range(1, n):
        if offsets[i] < offsets[i - 1]:
            return False
    for t in range(rows.shape[0]):
        E = rows[t]
        for p in range(offsets[t * B], offsets[(t + 1) * B]):
            x = np.int64(indices[p])
            if (x < 0 or x >= E) and not (pruned_ok and x == -1):
                return False
    return True


# -- the common call path: int32 prefix sums ---------------------------------------------------
_I32_MAX = np.int64(2**31 - 1)
_I32_MIN = np.int64(-(2**31))


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


# -- in-place ops' alias check --------------------------------------------------------------------
_SPAN_LIMIT = np.int64(2**62)


@_jit
def array_span(a):
    """``(first byte, one past the last byte)`` that the NumPy array ``a`` can touch, as
    int64: the extents ``np.may_share_memory`` compares by default (a zero-length axis: an
    empty span). ``(0, 0)`` also when the bounds are not plainly representable (data pointer
    or an extent beyond 2**62, or a first byte below address 0, where NumPy's unsigned sums
    would wrap): the caller treats ``lo >= hi`` as "ask the exact rule". Each extent is
    compared by division before it is added: never wraps."""
    ptr = np.int64(a.ctypes.data)
    if ptr < 0 or ptr >= _SPAN_LIMIT:
        return np.int64(0), np.int64(0)
    used = np.int64(0)  # the sum of |stride| * (n - 1) so far, <= _SPAN_LIMIT
    lo = ptr
    hi = ptr
    for k in range(a.ndim):
        if a.shape[k] == 0:
            return np.int64(0), np.int64(0)
    for k in range(a.ndim):
        m = np.int64(a.shape[k]) - 1
        st = np.int64(a.strides[k])
        if m == 0 or st == 0:
            continue
        if st < -_SPAN_LIMIT or st > _SPAN_LIMIT:
            return np.int64(0), np.int64(0)
        size = st if st > 0 else -st
        if m > (_SPAN_LIMIT - used) // size:
            return np.int64(0), np.int64(0)
        used += m * size
        if st > 0:
            hi += m * size
        else:
            lo -= m * size
    if lo < 0:
        return np.int64(0), np.int64(0)
    return lo, hi + np.int64(a.itemsize)
