"""Host-side planning of pooled-embedding permutes, shared by the fast paths.

A permute becomes a short table of *row segments*: which columns of which
source array go to which columns of which destination array, for every batch
row. Kernels walk the table, so they reach any number of inputs and outputs
without concatenating them. Two forms:

* indexed (``*_indexed``): array numbers and columns, for kernels that take
  the arrays themselves (Numba-CUDA);
* addressed (:func:`copy_segments`, :func:`backward_slots`): byte addresses and
  row strides, for kernels that take raw pointers (the Numba host kernels, the
  CUDA C kernel). Addresses are those of NumPy arrays (``__array_interface__``)
  or CuPy arrays (``.data.ptr``); the caller keeps the arrays alive while the
  kernel runs (``keep``).

Everything here is O(P) Python on small index tables.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ._backend import is_cupy, to_host


def address(a) -> int:
    if type(a) is np.ndarray:  # the per-call case: no CuPy test
        return a.__array_interface__["data"][0]
    return int(a.data.ptr) if is_cupy(a) else int(a.__array_interface__["data"][0])


def rowwise(a, keep: list):
    """``a`` itself when its columns are adjacent in memory, else a C-contiguous copy;
    kept alive in ``keep``."""
    if a.shape[1] > 1 and a.strides[1] != a.itemsize:
        a = a.copy()
    keep.append(a)
    return a


_READ = threading.local()  # host copies the declaration of the current call read: {id(array): (array, copy)}


def remember(pairs) -> None:
    """Keep the host int64 copies ``(array, copy)`` that the op's declaration read (in one copy
    with the call's other device data) for :func:`host_rows` in the same call; replaces what an
    earlier call kept, so at most one call's copies are held."""
    _READ.memo = {id(a): (a, c) for a, c in pairs if type(a) is not np.ndarray}


def host_rows(a) -> np.ndarray:
    """``a`` as host int64: the copy this call's declaration read (taken once: a later call reads
    again, so an array changed in place between calls is never planned from stale data), else
    a device-to-host copy."""
    memo = getattr(_READ, "memo", None)
    if memo:
        found = memo.pop(id(a), None)
        if found is not None and found[0] is a:
            return found[1]
    return to_host(a, np.int64)


# -- indexed plans ------------------------------------------------------------------
def copy_indexed(rows, dst_widths) -> np.ndarray:
    """``rows``: iterable of (src array, dst array, src col, dst col, n). Returns int64
    ``[S, 5]`` (src array or -1 for zeros, src col, dst array, dst col, n), sorted by
    destination, with zero fills for destination columns no row covers and no empty
    segment."""
    segs, covered = [], [[] for _ in dst_widths]
    for i, j, a, c, n in rows:
        if n > 0:
            segs.append((j, c, i, a, n))
            covered[j].append((c, c + n))
    for j, w in enumerate(dst_widths):
        col = 0
        for c0, c1 in sorted(covered[j]) + [(w, w)]:
            if c0 > col:
                segs.append((j, col, -1, 0, c0 - col))
            col = max(col, c1)
    segs.sort()
    return np.array([(i, a, j, c, n) for j, c, i, a, n in segs], dtype=np.int64).reshape(len(segs), 5)


def forward_indexed(rows: np.ndarray, out_widths) -> np.ndarray:
    """Segments of ``permute_multi_embedding`` (rows: host ``[P, 6]``; cached by content)."""
    return _forward_indexed(rows.tobytes(), rows.shape[0], tuple(out_widths))


@functools.lru_cache(maxsize=256)
def _forward_indexed(rows_bytes, P, out_widths):
    rows = np.frombuffer(rows_bytes, dtype=np.int64).reshape(P, 6)
    segs = copy_indexed(rows[:, :5].tolist(), out_widths)
    segs.flags.writeable = False
    return segs


def forward_segments(permutes: np.ndarray, out_widths) -> np.ndarray:
    """:func:`forward_indexed` of a host ``[P, 6]`` int32/int64 array, keyed by its bytes and
    dtype (no int64 copy per call). Cached by content, so an array changed in place between
    calls is planned afresh."""
    return _forward_segments(permutes.tobytes(), permutes.dtype.char, permutes.shape[0], tuple(out_widths))


@functools.lru_cache(maxsize=256)
def _forward_segments(rows_bytes, char, P, out_widths):
    rows = np.frombuffer(rows_bytes, dtype=np.dtype(char)).reshape(P, 6).astype(np.int64)
    return _forward_indexed(rows.tobytes(), P, out_widths)


def backward_plan(permutes: np.ndarray, in_widths):
    """:func:`backward_indexed` of a host ``[P, 6]`` int32/int64 array (cached by content)."""
    return _backward_plan(permutes.tobytes(), permutes.dtype.char, permutes.shape[0], tuple(in_widths))


@functools.lru_cache(maxsize=256)
def _backward_plan(rows_bytes, char, P, in_widths):
    rows = np.frombuffer(rows_bytes, dtype=np.dtype(char)).reshape(P, 6).astype(np.int64)
    return _backward_indexed(rows.tobytes(), P, in_widths)


def pooled_indexed(offset_dim_list, permute_list, inv_offset_dim_list, width) -> np.ndarray:
    """Segments of ``permute_pooled_embs`` (one source and one destination array)."""
    offs, perm, inv = (host_rows(a) for a in (offset_dim_list, permute_list, inv_offset_dim_list))
    rows = [(0, 0, int(offs[p]), int(inv[t]), int(offs[p + 1] - offs[p])) for t, p in enumerate(perm.tolist())]
    return copy_indexed(rows, [width])


def backward_indexed(rows: np.ndarray, in_widths):
    """Plan of ``permute_multi_embedding_backward`` (cached by content): see :func:`_backward_indexed`."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return _backward_indexed(rows.tobytes(), rows.shape[0], tuple(in_widths))


@functools.lru_cache(maxsize=256)
def _backward_indexed(rows_bytes, P, in_widths):
    """Plan of ``permute_multi_embedding_backward``.

    The columns of each input gradient are cut at every row's boundaries into
    elementary *slots*; a slot's sources are the rows covering it, in row order.
    Returns ``slots [E, 5]`` (gradient array, col, n, first source, end source) and
    ``srcs [K, 2]`` (grad_outputs array, col), int64. A slot without sources is 0.
    """
    rows = np.frombuffer(rows_bytes, dtype=np.int64).reshape(P, 6)
    live = rows[rows[:, 4] > 0]
    slots, srcs = [], []
    for i, w in enumerate(in_widths):
        mine = live[live[:, 0] == i]
        cuts = np.unique(np.concatenate([[0, w], mine[:, 2], mine[:, 2] + mine[:, 4]]))
        sources = [[] for _ in range(len(cuts) - 1)]
        for _i, j, a, c, n, _next in mine.tolist():
            for e in range(int(np.searchsorted(cuts, a)), int(np.searchsorted(cuts, a + n))):
                sources[e].append((j, c + int(cuts[e]) - a))
        for e in range(len(cuts) - 1):
            x0, x1 = int(cuts[e]), int(cuts[e + 1])
            if x1 > x0:
                slots.append((i, x0, x1 - x0, len(srcs), len(srcs) + len(sources[e])))
                srcs.extend(sources[e])
    slots = np.array(slots, dtype=np.int64).reshape(len(slots), 5)
    srcs = np.array(srcs, dtype=np.int64).reshape(len(srcs), 2)
    slots.flags.writeable = srcs.flags.writeable = False
    return slots, srcs


# -- addressed plans ----------------------------------------------------------------
def _table(arrays):
    """Addresses and row strides of ``arrays`` as int64 arrays (0 appended for index -1)."""
    return (
        np.array([address(a) for a in arrays] + [0], dtype=np.int64),
        np.array([a.strides[0] for a in arrays] + [0], dtype=np.int64),
    )


def copy_segments(segs: np.ndarray, srcs, dsts, keep) -> np.ndarray:
    """An indexed copy plan as ``[S, 5]`` int64 (src address or 0 for zeros, src row
    stride, dst address, dst row stride, bytes)."""
    srcs = [rowwise(a, keep) for a in srcs]
    isz = dsts[0].itemsize if dsts else 0
    (s_addr, s_stride), (d_addr, d_stride) = _table(srcs), _table(dsts)
    i, a, j, c, n = segs.T
    zero = i < 0
    out = np.empty((segs.shape[0], 5), dtype=np.int64)
    out[:, 0] = np.where(zero, 0, s_addr[i] + a * isz)
    out[:, 1] = s_stride[i]
    out[:, 2] = d_addr[j] + c * isz
    out[:, 3] = d_stride[j]
    out[:, 4] = n * isz
    return out


def backward_slots(grads, rows: np.ndarray, outs, keep):
    """:func:`backward_indexed` with addresses: ``slots [E, 5]`` (dst address, dst row
    stride, elements, first source, end source), ``srcs [K, 2]`` (address, row stride)."""
    slots, srcs = backward_indexed(rows, [o.shape[1] for o in outs])
    grads = [rowwise(g, keep) for g in grads]
    isz = outs[0].itemsize if outs else 0
    (o_addr, o_stride), (g_addr, g_stride) = _table(outs), _table(grads)
    a_slots = slots.copy()
    a_slots[:, 0] = o_addr[slots[:, 0]] + slots[:, 1] * isz
    a_slots[:, 1] = o_stride[slots[:, 0]]
    a_srcs = np.empty_like(srcs)
    a_srcs[:, 0] = g_addr[srcs[:, 0]] + srcs[:, 1] * isz
    a_srcs[:, 1] = g_stride[srcs[:, 0]]
    return a_slots, a_srcs


def regroup_arguments(keys, lengths, groups):
    """``kt_regroup_arguments`` on the host (validated arguments): fresh arrays (copies of the
    result cached by the key lists, which are the whole input: it cannot go stale)."""
    permutes, in_shapes, out_shapes = _regroup_arguments(
        tuple(map(tuple, keys)), tuple(map(tuple, lengths)), tuple(map(tuple, groups))
    )
    return permutes.copy(), in_shapes.copy(), out_shapes.copy(), out_shapes.tolist()


@functools.lru_cache(maxsize=256)
def _regroup_arguments(keys, lengths, groups):
    """The rows in one pass over the flattened groups, ``next`` filled by a backward pass that
    remembers each key's following occurrence; read-only arrays."""
    where = {}
    for i, (ks, ls) in enumerate(zip(keys, lengths)):
        start = 0
        for k, n in zip(ks, ls):
            where[k] = (i, start, n)
            start += n
    flat = [(j, k) for j, g in enumerate(groups) for k in g]
    P = len(flat)
    rows, out_widths = [], [0] * len(groups)  # Python lists, one array each at the end
    for j, k in flat:
        i, a, n = where[k]
        rows.append([i, j, a, out_widths[j], n, 0])
        out_widths[j] += n
    first = {}  # each key's first row, once the backward pass is done
    for r in range(P - 1, -1, -1):
        k = flat[r][1]
        nxt = first.get(k)
        rows[r][5] = -(P if nxt is None else nxt)
        first[k] = r
    for r in first.values():
        nxt = -rows[r][5]
        rows[r][5] = 0 if nxt == P else nxt  # the head: 0 when used once, else its next row
    permutes = np.array(rows, dtype=np.int32).reshape(P, 6)
    out_shapes = np.array(out_widths, dtype=np.int32)
    in_shapes = np.array([sum(ls) for ls in lengths], dtype=np.int32)
    for a in (permutes, in_shapes, out_shapes):
        a.flags.writeable = False
    return permutes, in_shapes, out_shapes


def regroup_rows(keys, lengths, groups) -> np.ndarray:
    """The permutes rows of a regrouping as read-only host int64, cached by the key lists."""
    return _regroup_rows(tuple(map(tuple, keys)), tuple(map(tuple, lengths)), tuple(map(tuple, groups)))


def regroup_segments(keys, lengths, groups) -> np.ndarray:
    """:func:`forward_indexed` of a regrouping (validated key lists), cached by the key lists."""
    return _regroup_segments(tuple(map(tuple, keys)), tuple(map(tuple, lengths)), tuple(map(tuple, groups)))


@functools.lru_cache(maxsize=256)
def _regroup_segments(keys, lengths, groups):
    rows = _regroup_rows(keys, lengths, groups)
    widths = [0] * len(groups)
    for j, n in zip(rows[:, 1].tolist(), rows[:, 4].tolist()):
        widths[j] += n
    return _forward_indexed(rows.tobytes(), rows.shape[0], tuple(widths))


@functools.lru_cache(maxsize=256)
def _regroup_rows(keys, lengths, groups):
    rows = _regroup_arguments(keys, lengths, groups)[0].astype(np.int64)
    rows.flags.writeable = False
    return rows
