"""The kjt declarations' compiled verdicts on host data (``embnum.ops.kjt`` loads this module on
first use, where Numba is importable). Each returns a verdict (and the sizes the plan needs) and
never raises: on a failing verdict the declaration reruns its exact rules, which name the error.
Overflow-safe: sums are bounded before adding (``y > limit - total``), products by division,
differences only of ordered values.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .._validate_numba import bounded_add, offsets_last, row_total

_jit = njit(cache=True, nogil=True)


@_jit
def permute_totals_2d(permute, lengths, limit, sizes):
    """``(N, M)`` of a 2-D permute (``permute_2d_sparse_data``): ``N`` the exact total of the
    ``[T, B]`` lengths, ``M`` the exact total of the rows ``permute`` selects; ``(-1, -1)`` when a
    length is negative, a total passes ``limit`` or an entry of ``permute`` is outside ``[0, T)``.
    ``sizes``: int64 ``[T]`` scratch for the row totals (allocated by the caller: ``np.empty`` in
    a verdict is a compile of its own)."""
    T = lengths.shape[0]
    N = np.int64(0)
    for t in range(T):
        row = row_total(lengths[t], limit)
        sizes[t] = row
        N = bounded_add(N, row, limit)  # -1 when row is -1
        if N < 0:
            return np.int64(-1), np.int64(-1)
    M = _selected_total(permute, sizes, limit)
    return (N, M) if M >= 0 else (np.int64(-1), np.int64(-1))


@_jit
def permute_totals_1d(permute, lengths, limit):
    """:func:`permute_totals_2d` for a flat list of segments (``lengths`` 1-D ``[S]``)."""
    N = row_total(lengths, limit)
    M = _selected_total(permute, lengths, limit) if N >= 0 else np.int64(-1)
    return (N, M) if M >= 0 else (np.int64(-1), np.int64(-1))


@njit(cache=True, nogil=True, inline="always")
def _selected_total(permute, sizes, limit):
    """The exact total of ``sizes[permute[i]]`` (``sizes`` entries ``>= 0``) when every entry of
    ``permute`` lies in ``[0, len(sizes))`` and the total is at most ``limit``, else -1."""
    M = np.int64(0)
    for i in range(permute.shape[0]):
        p = np.int64(permute[i])
        if p < 0 or p >= sizes.shape[0]:
            return np.int64(-1)
        M = bounded_add(M, np.int64(sizes[p]), limit)
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
        N = bounded_add(N, np.int64(lengths[k]), limit)
        if N < 0 or np.int64(offsets[k + 1]) != N:
            return bad
    for j in range(indices.shape[0]):
        x = np.int64(indices[j])
        if x < 0 or x >= batch_size:
            return bad
    M = np.int64(0)
    for t in range(lengths.shape[0] // batch_size):
        for j in range(indices.shape[0]):
            M = bounded_add(M, np.int64(lengths[t * batch_size + indices[j]]), limit)
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
def _offsets_ok(offs):
    """Whether the offsets start at 0 and never decrease (``offsets_last`` inlined once, called
    three times by :func:`unique_ids_ok`: three inlined copies compiled slower)."""
    return offsets_last(offs, True, -1) >= 0


@_jit
def unique_ids_ok(hsc, hso, offsets, indices, B):
    """Whether every rule of ``jagged_unique_indices`` holds (``T = len(hsc) - 1 >= 1``,
    ``len(hso) = T + 1``, ``len(offsets) = T * B + 1``): the three offsets arrays start at 0 and
    never decrease, ``hso[-1] = T``, ``offsets[-1] = len(indices)``, the features of a table share
    one ``hsc`` entry, ids are ``>= 0`` and below their table's hash size (the last table's: at
    most ``2**63 - 1 - hsc[a]``). No sort: the declaration counts the distinct ids with NumPy's
    (a sort compiled here cost ~0.3 s of the op's first call)."""
    T = hsc.shape[0] - 1
    if not (_offsets_ok(hsc) and _offsets_ok(hso) and _offsets_ok(offsets)):
        return False
    if np.int64(hso[T]) != T or np.int64(offsets[offsets.shape[0] - 1]) != indices.shape[0]:
        return False
    last = T - 1
    while last > 0 and hso[last] >= hso[last + 1]:
        last -= 1
    for g in range(T):
        a, b = np.int64(hso[g]), np.int64(hso[g + 1])
        if a >= b:
            continue
        for f in range(a, b):
            if hsc[f] != hsc[a]:
                return False
        # the last table's ids are unbounded above, but hsc[a] + id must not wrap (hsc[a] >= 0)
        cap = np.int64(9223372036854775807) - np.int64(hsc[a]) if g == last else np.int64(hsc[b]) - np.int64(hsc[a]) - 1
        for r in range(np.int64(offsets[a * B]), np.int64(offsets[b * B])):
            if indices[r] < 0 or np.int64(indices[r]) > cap:
                return False
    return True
