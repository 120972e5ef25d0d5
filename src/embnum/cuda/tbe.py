"""Numba-CUDA kernels of the TBE family.

Same contract as ``embnum.cpu.tbe``. The declarations have already checked (or
repaired a copy of) every index, and the kernels still skip any row id outside
its table, so no id can make a kernel read or write out of bounds.

Shapes (``LANES`` = 32 on a GPU, one warp; ``_common.LANES`` under the simulator):

* forward: a sub-group of ``G`` lanes per bag and ``4 G``-column chunk (``G`` the
  fewest lanes, a power of two up to a warp, whose 4 columns each cover the widest
  dim: two bags per warp at dims up to 64, four up to 32). The sub-group reads its
  bag's ids ``G`` at a time, one coalesced load of one id per lane, and broadcasts
  each by a warp shuffle (``shfl.sync.idx``); every lane of a warp runs the same
  number of shuffles (the longest bag of the warp; masked loads past a bag's end).
  When every table's rows start on 4-element boundaries (weights pointer, offsets
  and dims, checked on the host) one kernel reads each row with one vector load
  per lane (``_vector.load4``: 16 bytes of float32), lane ``l`` owning columns
  ``4 l .. 4 l + 3``, two rows in flight; otherwise another kernel makes ``COLS``
  one-element loads per lane (columns ``lane, lane + G, ...``), one row at a time;
  both at 64 registers. Each lane sums
  its columns in lookup order (float32), as the oracle does; float16 weights are
  converted by the hardware (``cvt.f32.f16``), and a float16 output is written
  rounded to nearest even (``cvt.rn.f16.f32``) by the same kernel.
* ``"none"`` pooling: one lane group per bag copies its rows, coalesced.
* backward: the lookups are sorted by ``(linear row id, position)`` with one
  stable CuPy radix sort of the ids in the narrowest unsigned type that holds the
  row count (:func:`sort_key`); a CuPy scan numbers the runs; one lane group per
  run reduces the run's gradient in position order, walking the run once per
  ``LANES * COLS`` columns (lane ``l`` keeps the sums of columns ``4 l .. 4 l + 3`` in
  registers; each lookup's slice of ``grad_output`` read with one 16-byte vector load
  when every slice starts on a 4-element boundary, checked on the host, four scalar
  loads otherwise), and writes the row once. No float atomics:
  identical results from run to run. The number of runs
  stays on the device (the grid is sized by the lookups), so ``tbe_backward``
  and ``tbe_backward_update`` read nothing back; ``tbe_backward_sparse`` reads the
  run count once (its output's size).
* ``tbe_grad_per_sample_weights``: one lane group per lookup, a dot product over
  the columns reduced in shared memory in a fixed tree order.
* the fused optimizer step: one lane group per touched row (lanes over the columns, coalesced
  weight and state updates). SGD/Adagrad/row-wise Adagrad/Adam reduce straight from the sorted
  lookups (``_apply``: one walk of the run per 128 columns, two for row-wise Adagrad, its row sum
  by a shuffle butterfly; launch bounds hold it to 64 registers);
  LAMB, partial row-wise Adam/LAMB, LARS-SGD and ``max_norm`` take the
  row-wise gradient at the fixed size ``max_rows = N`` (no read) and ``_apply_rows`` (row sums by
  xor-shuffle butterflies, the new row written once). No float atomics; nothing read back.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda

from .. import _tbe_rows
from .._jit import cuda_kernel
from .._tbe import (
    ADAGRAD,
    ADAM,
    DECAY_L2,
    KIND_CODES,
    LAMB,
    LARS_SGD,
    MEAN,
    NONE,
    PARTIAL_ROWWISE_ADAM,
    PARTIAL_ROWWISE_LAMB,
    ROWWISE_ADAGRAD,
    SGD,
    LookupArgs,
    TBESparseGrad,
)
from . import _tbe_vbe as vbe
from ._common import (
    LANES,
    MAX_BLOCKS,
    TPB,
    blocks,
    constant,
    contiguous,
    launch,
    loop_bound,
    shfl_idx,
    shfl_xor,
    stable_argsort,
    to_host,
    xp,
)
from ._vector import load4

COLS = 4  # columns per lane per chunk: a lane group covers LANES * COLS columns per pass
# launch bounds of the kernels held to 64 registers: blocks of TPB threads, 1,024 of them resident
# per SM (half its 2,048), so ptxas fits each thread in 65,536 / 1,024 = 64 registers (4 blocks of 256)
HALF_SM = (TPB, 1024 // TPB)


class Lookups(NamedTuple):
    """Device arrays every TBE kernel takes, prepared once per call: the layout (int64, cached
    per device), the rows of each feature's table, and the lookups themselves."""

    woff: object
    doff: object
    hcs: object
    rows: object
    indices: object
    offsets: object
    B: int
    T: int
    n_rows: int  # hash_size_cumsum[T]: total rows, also the sort key of positions outside every bag
    D_offsets: object  # the host copy (the declaration's)
    dims4: bool | None = None  # every dim of D_offsets a multiple of 4, where the caller knows it


def _prepare(a: LookupArgs) -> Lookups:
    offsets = a.offsets
    if offsets.dtype != a.indices.dtype:  # one index type per call (offsets are the small array)
        offsets = offsets.astype(a.indices.dtype)
    return Lookups(
        constant(a.weights_offsets),
        constant(a.D_offsets),
        constant(a.hash_size_cumsum),
        constant(a.rows),
        contiguous(a.indices),
        contiguous(offsets),
        a.B,
        int(a.weights_offsets.shape[0]),
        int(a.hash_size_cumsum[-1]),
        a.D_offsets,
    )


def _groups(n_items: int, log_g: int | None = None) -> int:
    """Blocks for ``n_items`` work items of a lane group each (of ``2**log_g`` lanes when given)."""
    return blocks(n_items, TPB // LANES if log_g is None else TPB >> log_g)


@cuda.jit(device=True)
def _bag(offsets, k, N):
    """Positions ``[s, e)`` of bag ``k``, clamped into ``[0, N]`` with ``e >= s``: the identity on
    checked offsets, and no read outside ``indices`` on unchecked ones (bounds mode "none" on a
    device)."""
    s = min(max(offsets[k], 0), N)
    return s, min(max(offsets[k + 1], s), N)


# -- forward ------------------------------------------------------------------------------
@cuda.jit(device=True)
def _load(w, i, D, d0, st, vec):
    """Elements ``i + j st`` (``j`` = 0..3) of ``w`` whose columns ``d0 + j st`` lie below ``D``
    (0 for the others): one aligned vector load when ``vec`` (``st`` = 1, all four in range)."""
    if vec:
        return load4(w, i)
    z = np.float32(0.0)
    x0 = np.float32(w[i]) if d0 < D else z
    x1 = np.float32(w[i + st]) if d0 + st < D else z
    x2 = np.float32(w[i + 2 * st]) if d0 + 2 * st < D else z
    x3 = np.float32(w[i + 3 * st]) if d0 + 3 * st < D else z
    return x0, x1, x2, x3


@cuda.jit(device=True)
def _pooled(w, base, D, d0, st, vec, E, indices, s, e, n_max, first, G, psw, has_psw):
    """Columns ``d0 + j st`` (``j`` = 0..3; those at or past ``D`` give 0) of the pooled bag
    ``[s, e)``, float32 sums in lookup order. The sub-group of ``G`` lanes (the first at warp lane
    ``first``) reads its bag's next ``G`` ids with one coalesced load, one per lane, and broadcasts
    them with shuffles; with ``vec`` (vector loads) two rows in flight (both rows' loads, then the
    two sums in position order). ``n_max``: the longest bag of the warp (every lane runs the same
    shuffles). Ids outside ``[0, E)`` add nothing."""
    lane = (cuda.threadIdx.x & (LANES - 1)) - first
    live = d0 < D
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for p0 in range(0, n_max, G):
        mine = np.int64(indices[s + p0 + lane]) if s + p0 + lane < e else np.int64(-1)
        for j in range(0, min(G, n_max - p0), 2 if vec else 1):
            r0 = shfl_idx(mine, first + j)
            r1 = np.int64(-1)
            if vec:
                r1 = shfl_idx(mine, first + min(j + 1, G - 1))
                r1 = r1 if j + 1 < G else np.int64(-1)  # -1: past the bag's end
            ok0 = live and r0 >= 0 and r0 < E
            ok1 = live and r1 >= 0 and r1 < E
            x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = np.float32(0.0)
            if ok0:
                x0, x1, x2, x3 = _load(w, base + r0 * D + d0, D, d0, st, vec)
            if ok1:
                y0, y1, y2, y3 = _load(w, base + r1 * D + d0, D, d0, st, vec)
            if ok0:
                f = psw[s + p0 + j] if has_psw else np.float32(1.0)
                a0, a1, a2, a3 = (
                    a0 + f * np.float32(x0),
                    a1 + f * np.float32(x1),
                    a2 + f * np.float32(x2),
                    a3 + f * np.float32(x3),
                )
            if ok1:
                f = psw[s + p0 + j + 1] if has_psw else np.float32(1.0)
                a0, a1, a2, a3 = (
                    a0 + f * np.float32(y0),
                    a1 + f * np.float32(y1),
                    a2 + f * np.float32(y2),
                    a3 + f * np.float32(y3),
                )
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _put_pooled(out, b, at, d0, D, st, n, a0, a1, a2, a3):
    """``out[b, at + d0 + j st] = a_j / n`` for the columns ``d0 + j st`` below ``D`` (no division when
    ``n`` is 1: the same values)."""
    if n != np.float32(1.0):
        a0, a1, a2, a3 = a0 / n, a1 / n, a2 / n, a3 / n
    if d0 < D:
        out[b, at + d0] = a0
    if d0 + st < D:
        out[b, at + d0 + st] = a1
    if d0 + 2 * st < D:
        out[b, at + d0 + 2 * st] = a2
    if d0 + 3 * st < D:
        out[b, at + d0 + 3 * st] = a3


def _make_forward_pooled(vec):
    """The pooled forward with vector loads (``vec``: every table's rows start on 4-element
    boundaries) or with one-element loads; two kernels, so that each fits in 64 registers."""

    @cuda_kernel(launch_bounds=HALF_SM)
    def kernel(w, woff, doff, rows, indices, offsets, B, mean, psw, has_psw, log_g, chunks, out):
        """out ``[B, total_D]`` (float32 or float16): a sub-group of ``G = 2**log_g`` lanes per bag and
        ``G * COLS``-column chunk (``chunks`` per bag, from the widest dim: ``LANES // G`` bags per
        warp when dims are small), :func:`_pooled`. With vector loads lane ``l`` owns the 4
        consecutive columns ``4 l .. 4 l + 3`` of the chunk, else the columns ``l, l + G, ...``. The
        loops over work items and lookups are block-uniform (the shuffles need every lane)."""
        tid = cuda.threadIdx.x
        G = 1 << log_g
        lane = tid & (G - 1)
        per_block = cuda.blockDim.x >> log_g
        n_items = woff.shape[0] * B * chunks
        for i0 in range(cuda.blockIdx.x * per_block, n_items, cuda.gridDim.x * per_block):
            i = min(i0 + (tid >> log_g), n_items - 1)
            k = i // chunks
            t = k // B
            s, e = _bag(offsets, k, indices.shape[0])
            D = doff[t + 1] - doff[t] if i0 + (tid >> log_g) < n_items else doff[0]  # 0: past the last item
            d0 = (i - k * chunks) * G * COLS + (COLS * lane if vec else lane)
            if D == 0:  # past the last item: no lookups (a lane past its dim still reads its share of the ids)
                e = s
            st = 1 if vec else G
            n_max = loop_bound(e - s)
            a0, a1, a2, a3 = _pooled(
                w, woff[t], D, d0, st, vec, rows[t], indices, s, e, n_max, (tid & (LANES - 1)) - lane, G, psw, has_psw
            )
            n = np.float32(e - s) if mean and e > s else np.float32(1.0)
            _put_pooled(out, k - t * B, doff[t], d0, D, st, n, a0, a1, a2, a3)

    return kernel


_FORWARD_POOLED = {"vector": _make_forward_pooled(True), "element": _make_forward_pooled(False)}


@cuda_kernel
def _forward_none(w, woff, doff, rows, indices, offsets, B, out):
    """out ``[N, D]``: lane group per bag copies its rows (lanes over columns); positions
    before ``offsets[0]`` (outside every bag) get 0."""
    lane = cuda.threadIdx.x % LANES
    group = cuda.grid(1) // LANES
    n_groups = cuda.gridsize(1) // LANES
    T = woff.shape[0]
    D = doff[1]
    N = indices.shape[0]
    for p in range(group, min(max(offsets[0], 0), N), n_groups):
        for d in range(lane, D, LANES):
            out[p, d] = 0.0
    for k in range(group, T * B, n_groups):
        t = k // B
        E = rows[t]
        s, e = _bag(offsets, k, N)
        for p in range(s, e):
            r = indices[p]
            if r < 0 or r >= E:
                for d in range(lane, D, LANES):
                    out[p, d] = 0.0
                continue
            row = woff[t] + r * D
            for d in range(lane, D, LANES):
                out[p, d] = np.float32(w[row + d])


@vbe.forward
def tbe_forward(weights, output_dtype, out, **lookup):
    a = LookupArgs(**lookup)
    if out.size == 0:
        return
    lk = _prepare(a)
    psw = None if a.per_sample_weights is None else contiguous(a.per_sample_weights)
    shape = None if a.pooling == NONE else _forward_shape(_bytes(a.weights_offsets), _bytes(a.D_offsets))
    args = (lk.woff, lk.doff, lk.rows, lk.indices, lk.offsets, lk.B, a.pooling, psw, out, shape)
    _launch_forward(contiguous(weights), *args)


def _bytes(a) -> bytes:
    return np.asarray(a, np.int64).tobytes()


def _launch_forward(w, woff, doff, rows, indices, offsets, B, pooling, psw, out, shape, no_floats=None, aligned=None):
    """The forward's one launch on prepared arrays (device layout tables, contiguous lookups of one
    index type, ``psw`` contiguous float32 or None; ``shape``: :func:`_forward_shape` of the host
    layout, pooled only; ``aligned``: :func:`_aligned4` of ``w`` where the caller knows it)."""
    T = woff.shape[0]
    if pooling == NONE:
        n = max(T * B, int(indices.shape[0]))
        launch(_forward_none, _groups(n), TPB, w, woff, doff, rows, indices, offsets, B, out)
        return
    has_psw = psw is not None
    if not has_psw:
        psw = _NO_FLOATS() if no_floats is None else no_floats
    rows4, log_g, chunks = shape
    aligned = _aligned4(w) if aligned is None else aligned
    kernel = _FORWARD_POOLED["vector" if rows4 and aligned else "element"]
    args = (w, woff, doff, rows, indices, offsets, B, pooling == MEAN, psw, has_psw)
    launch(kernel, _groups(T * B * chunks, log_g), TPB, *args, log_g, chunks, out)


class ForwardLaunch:
    """:func:`tbe_forward` prepared once for one layout and pooling (``embnum.ops.tbe.ForwardPlan``
    holds it): the layout's device tables uploaded once and kept and the launch shape chosen
    (:func:`_forward_shape`), so a call passes only its checked lookups (int32/int64 ``indices
    [N]``, ``offsets [T*B+1]``), ``B``, float32 ``psw [N]`` or None, and ``out`` (``[B, total_D]``,
    or ``[N, D]`` for ``"none"``). No VBE. The common call (pooled, no ``psw``, both lookup arrays
    contiguous arrays of the backend's own type and one index dtype) launches straight from here;
    the weights' contiguous form, pointer alignment and so kernel are kept per weights array."""

    def __init__(self, woff, doff, rows, pooling: int):
        # copies: under the simulator a launch writes its host arguments back into them
        self.woff, self.doff, self.rows = (constant(np.array(a, np.int64)) for a in (woff, doff, rows))
        self.pooling = pooling
        self.shape = None if pooling == NONE else _forward_shape(_bytes(woff), _bytes(doff))
        self.no_floats = _NO_FLOATS()
        self._weights: tuple = (None,)  # (the weights array last given, its contiguous form, kernel, alignment)
        self._array = type(xp().empty(0, np.int64))  # the backend's own array type
        self._pooled = self.shape is not None
        if self.shape is not None:
            rows4, log_g, chunks = self.shape
            # T * B * chunks lane groups of 2**log_g lanes; TPB lanes a block
            self._items, self._per_block = int(woff.shape[0]) * chunks, TPB >> log_g
            self._tail = (self.pooling == MEAN, self.no_floats, False, log_g, chunks)

    def _keep(self, weights) -> tuple:
        """``(weights, their contiguous form, the pooled kernel their alignment allows, the
        alignment)``, kept until another weights array comes."""
        w = contiguous(weights)
        aligned = _aligned4(w)
        kernel = _FORWARD_POOLED["vector" if self._pooled and self.shape[0] and aligned else "element"]
        kept = self._weights = (weights, w, kernel, aligned)
        return kept

    def __call__(self, weights, indices, offsets, B, psw, out) -> None:
        if out.size == 0:
            return
        kept = self._weights
        if kept[0] is not weights:
            kept = self._keep(weights)
        a = self._array
        if (
            self._pooled
            and psw is None
            and type(indices) is a
            and type(offsets) is a
            and indices.dtype == offsets.dtype
            and indices.flags.c_contiguous
            and offsets.flags.c_contiguous
        ):  # the common call: _launch_forward's pooled launch, its per-layout parts done once
            n_blocks = min(MAX_BLOCKS, -(-B * self._items // self._per_block))  # (B >= 1: out is not empty)
            w, woff, doff, rows = kept[1], self.woff, self.doff, self.rows
            launch(kept[2], n_blocks, TPB, w, woff, doff, rows, indices, offsets, B, *self._tail, out)
            return
        if offsets.dtype != indices.dtype:
            offsets = offsets.astype(indices.dtype)
        psw = None if psw is None else contiguous(psw)
        ids, off = contiguous(indices), contiguous(offsets)
        args = (kept[1], self.woff, self.doff, self.rows, ids, off, B, self.pooling, psw, out, self.shape)
        _launch_forward(*args, self.no_floats, kept[3])


@functools.lru_cache(maxsize=256)
def _forward_shape(weights_offsets: bytes, D_offsets: bytes) -> tuple[bool, int, int]:
    """Per host layout (int64 bytes), once: whether every table's offset and dim are multiples of 4
    (its rows start on 4-element boundaries when the weights' pointer does), and :func:`_sub_groups`."""
    woff, doff = np.frombuffer(weights_offsets, np.int64), np.frombuffer(D_offsets, np.int64)
    return not (woff % 4).any() and not (doff % 4).any(), *_sub_groups(doff)


def _sub_groups(D_offsets) -> tuple[int, int]:
    """``(log2 G, chunks)`` of the pooled forward: ``G`` lanes per bag, the fewest (a power of two, at
    most ``LANES``) whose ``COLS`` columns each cover the widest dim of the host layout ``D_offsets``
    (so ``LANES // G`` bags share a warp when every dim is at most ``LANES * COLS / 2``, 64 on a
    GPU), and the ``G * COLS``-column chunks that cover it."""
    widest = int(np.diff(np.asarray(D_offsets)).max())
    log_g = 0
    while (1 << log_g) < LANES and (COLS << log_g) < widest:
        log_g += 1
    return log_g, -(-widest // (COLS << log_g))


def _aligned4(a) -> bool:
    """Whether the data pointer of the array ``a`` is a multiple of four elements' bytes (16 for
    float32): the vector loads of a table whose offset and dim are multiples of 4 are then aligned."""
    ptr = a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr
    return ptr % (4 * a.itemsize) == 0


def _NO_FLOATS():
    return constant(np.zeros(1, np.float32))


# -- backward: sort by (row, position), reduce each run, write each row once ----------------
class Runs(NamedTuple):
    """The sorted lookups: ``order`` (positions sorted by (linear id, position)), ``bag`` of
    each sorted position (-1 outside every bag), ``lid`` sorted linear ids, ``new`` int64 1 where
    a sorted position starts a run, ``run_start`` int64 ``[N + 1]`` (entries ``0..U``),
    ``n_runs`` int64 ``[1]`` (``U``, on the device)."""

    order: object
    bag: object
    lid: object
    new: object
    run_start: object
    n_runs: object


@cuda_kernel
def _linear_ids(hcs, rows, indices, offsets, B, bag, lid):
    """Bag of each position (binary search of ``offsets``) and its linear row id; positions
    outside every bag, and ids outside their table (possible only unchecked, bounds mode "none"
    on a device), get bag -1 and ``hash_size_cumsum[T]``, larger than every id: they sort last
    and no kernel reads or writes their row."""
    n_bags = offsets.shape[0] - 1
    big = hcs[hcs.shape[0] - 1]
    for p in range(cuda.grid(1), indices.shape[0], cuda.gridsize(1)):
        if p < offsets[0] or p >= offsets[n_bags]:
            bag[p] = -1
            lid[p] = big
            continue
        lo = 0
        hi = n_bags
        while hi - lo > 1:  # offsets[lo] <= p < offsets[hi]
            mid = (lo + hi) // 2
            if offsets[mid] <= p:
                lo = mid
            else:
                hi = mid
        r = indices[p]
        if r < 0 or r >= rows[lo // B]:
            bag[p] = -1
            lid[p] = big
            continue
        bag[p] = lo
        lid[p] = hcs[lo // B] + r


@cuda_kernel
def _run_starts(lid, big, rank, run_start, n_runs):
    """With ``rank`` the inclusive scan of the run-start flags: ``run_start[rank[q] - 1] = q``
    where sorted position ``q`` starts a run; the last in-bag position writes ``U`` and the end
    of the last run."""
    N = lid.shape[0]
    for q in range(cuda.grid(1), N, cuda.gridsize(1)):
        x = lid[q]
        if x == big:
            continue
        if q == 0 or lid[q - 1] != x:
            run_start[rank[q] - 1] = q
        if q == N - 1 or lid[q + 1] == big:
            n_runs[0] = rank[q]
            run_start[rank[q]] = q + 1


@cuda_kernel
def _new_run(lid, big, new):
    for q in range(cuda.grid(1), lid.shape[0], cuda.gridsize(1)):
        x = lid[q]
        new[q] = 1 if x != big and (q == 0 or lid[q - 1] != x) else 0


def sort_key(lid, n_rows: int):
    """The linear ids ``lid`` (``0..n_rows``, ``n_rows`` for lookups outside every bag) in the
    narrowest unsigned type that holds ``n_rows``: a radix sort makes one pass per key byte, so
    tables of fewer than 65,536 rows in all sort in 2 passes and fewer than 2**32 in 4, where int64
    keys take 8 (and ``(id, position)`` packed into one int64 key would overflow past 2**63)."""
    for t in (np.uint16, np.uint32):
        if n_rows <= np.iinfo(t).max:
            return lid.astype(t)
    return lid


def _runs(lk: Lookups) -> Runs:
    """Sort the lookups and number the runs of equal rows, all on the device (no host read)."""
    m = xp()
    N = int(lk.indices.shape[0])
    run_start = m.zeros(N + 1, np.int64)
    n_runs = m.zeros(1, np.int64)
    if N == 0:
        empty = m.zeros(0, np.int64)
        return Runs(empty, empty, empty, empty, run_start, n_runs)
    bag = m.empty(N, np.int64)
    lid = m.empty(N, np.int64)
    launch(_linear_ids, blocks(N, TPB), TPB, lk.hcs, lk.rows, lk.indices, lk.offsets, lk.B, bag, lid)
    order = stable_argsort(sort_key(lid, lk.n_rows))  # stable: (row, position) order, a fixed one
    lid_sorted = lid[order]
    new = m.empty(N, np.int64)
    launch(_new_run, blocks(N, TPB), TPB, lid_sorted, lk.n_rows, new)
    rank = m.cumsum(new)  # one scan
    launch(_run_starts, blocks(N, TPB), TPB, lid_sorted, lk.n_rows, rank, run_start, n_runs)
    return Runs(order, bag[order], lid_sorted, new, run_start, n_runs)


@cuda.jit(device=True)
def _run_grad4(q0, q1, d0, D, walk):
    """float32 summed gradient of the columns ``d0 .. d0 + 3`` (0 at or past ``D``) over the sorted
    lookups ``q0..q1``, in one walk in position order: each lookup adds its factor (per-sample
    weight, ``1/len`` for MEAN, 1) times its bag's gradient, "none" pooling its position's gradient
    row. ``walk``: ``(order, sbag, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw)``, ``g`` the
    gradient flattened to 1-D with rows of ``gD``: with ``gvec`` (:func:`_gradient_rows`: every slice
    starts on a 4-element boundary) each lookup is one vector load, else four scalar loads (the same
    values)."""
    order, sbag, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw = walk
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for q in range(q0, q1):
        p = order[q]
        c = np.float32(1.0)
        r = p
        at = doff[0]  # 0
        if pooling != NONE:
            k = sbag[q]
            tt = k // B
            r = k - tt * B
            at = doff[tt]
            if has_psw:
                c = psw[p]
            elif pooling == MEAN:
                c = np.float32(1.0) / np.float32(offsets[k + 1] - offsets[k])
        x0, x1, x2, x3 = _load(g, r * gD + at + d0, D, d0, 1, gvec)
        a0 += c * np.float32(x0)
        a1 += c * np.float32(x1)
        a2 += c * np.float32(x2)
        a3 += c * np.float32(x3)
    return a0, a1, a2, a3


def _gradient_rows(g, lk: Lookups):
    """``(g flattened to 1-D, its row length, whether every lookup's gradient slice can be read with
    vector loads)``: the pointer on a 4-element boundary, the row length and every feature's dim (so
    every column offset) multiples of 4, from the host layout (no device read)."""
    gD = int(g.shape[1])
    dims4 = lk.dims4 if lk.dims4 is not None else not (np.asarray(lk.D_offsets) % 4).any()
    return g.reshape(-1), gD, _aligned4(g) and gD % 4 == 0 and dims4


@cuda.jit(device=True)
def _put4(out, at, d0, D, g0, g1, g2, g3):
    """``out[at + d0 + j] = g_j`` for the columns ``d0 + j`` below ``D``."""
    if d0 < D:
        out[at + d0] = g0
    if d0 + 1 < D:
        out[at + d0 + 1] = g1
    if d0 + 2 < D:
        out[at + d0 + 2] = g2
    if d0 + 3 < D:
        out[at + d0 + 3] = g3


@cuda_kernel
def _dense_grad(
    order, sbag, lid, run_start, n_runs, offsets, B, doff, hcs, woff, pooling, g, gD, gvec, psw, has_psw, out
):
    """Lane group per run (lane ``l`` owning the columns ``4 l .. 4 l + 3`` of each ``LANES * COLS``
    chunk, :func:`_run_grad4`): the run's summed gradient written to its row of the dense gradient
    ``out`` [W] (zero elsewhere, set by the caller)."""
    lane = cuda.threadIdx.x % LANES
    group = cuda.grid(1) // LANES
    n_groups = cuda.gridsize(1) // LANES
    walk = (order, sbag, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw)
    for u in range(group, n_runs[0], n_groups):
        q0 = run_start[u]
        q1 = run_start[u + 1]
        t = sbag[q0] // B
        D = doff[t + 1] - doff[t]
        at = woff[t] + (lid[q0] - hcs[t]) * D
        for d0 in range(COLS * lane, D, LANES * COLS):  # the run walked once per chunk
            g0, g1, g2, g3 = _run_grad4(q0, q1, d0, D, walk)
            _put4(out, at, d0, D, g0, g1, g2, g3)


@cuda_kernel
def _sparse_grad(order, sbag, run_start, n_runs, voff, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw, values):
    """Lane group per run: the run's summed gradient written to ``values[voff[u]:]``."""
    lane = cuda.threadIdx.x % LANES
    group = cuda.grid(1) // LANES
    n_groups = cuda.gridsize(1) // LANES
    walk = (order, sbag, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw)
    for u in range(group, n_runs[0], n_groups):
        q0 = run_start[u]
        t = sbag[q0] // B
        q1 = run_start[u + 1]
        D = doff[t + 1] - doff[t]
        for d0 in range(COLS * lane, D, LANES * COLS):  # the run walked once per chunk
            g0, g1, g2, g3 = _run_grad4(q0, q1, d0, D, walk)
            _put4(values, voff[u], d0, D, g0, g1, g2, g3)


def _gradient(grad_output, max_gradient=None):
    g = contiguous(grad_output)
    if max_gradient is not None:
        g = xp().clip(g.astype(np.float32), -max_gradient, max_gradient)
    return g


def _psw(per_sample_weights):
    has = per_sample_weights is not None
    return (contiguous(per_sample_weights) if has else _NO_FLOATS()), has


@vbe.backward
def tbe_backward(grad_output, weights, out, **lookup):
    a = LookupArgs(**lookup)
    out[...] = 0
    lk = _prepare(a)
    N = int(lk.indices.shape[0])
    if N == 0:
        return
    rs = _runs(lk)
    psw, has_psw = _psw(a.per_sample_weights)
    g = _gradient(grad_output)
    args = (rs.order, rs.bag, rs.lid, rs.run_start, rs.n_runs, lk.offsets, lk.B, lk.doff, lk.hcs, lk.woff, a.pooling)
    launch(_dense_grad, _groups(N), TPB, *args, *_gradient_rows(g, lk), psw, has_psw, out)


def _sparse(lk: Lookups, g, pooling, per_sample_weights, max_rows=None, n_values=0) -> TBESparseGrad:
    """The row-wise gradient. Without ``max_rows`` the one host read: the number of rows ``U`` and
    of values (the outputs' sizes); with it (and ``n_values``, at least the values of the first
    ``max_rows`` rows), nothing is read (fixed sizes, see the declaration)."""
    m = xp()
    N = int(lk.indices.shape[0])
    if N == 0 and max_rows is None:
        return TBESparseGrad(m.zeros(0, np.int64), m.zeros(0, np.float32), m.zeros(1, np.int64))
    rs = _runs(lk)
    dims = m.diff(lk.doff)
    run_dims = rs.new * dims[m.maximum(rs.bag, 0) // max(lk.B, 1)]
    vend = m.cumsum(run_dims)  # inclusive: value end of the run starting at each position
    total = vend[-1:] if N else m.zeros(1, np.int64)
    if max_rows is None:
        U, n_values = (int(x) for x in to_host(m.concatenate([rs.n_runs, total])))
        cap = U
    else:
        cap = max_rows
    u = m.arange(cap + 1)
    live = u < rs.n_runs[0]  # rows past U (or the runs past max_rows: cut) get the end of the kept values
    at = m.minimum(rs.run_start[m.minimum(u, N)], max(N - 1, 0))  # first sorted position of row u
    if N:
        voff = m.where(live, vend[at] - run_dims[at], total[0])
        ids = m.where(live[:cap], rs.lid[at[:cap]], -1)
    else:
        voff = m.zeros(cap + 1, np.int64)
        ids = m.full(cap, -1, np.int64)
    values = m.zeros(n_values, np.float32)
    if N and cap:
        psw, has_psw = _psw(per_sample_weights)
        n_kept = m.minimum(rs.n_runs, cap)
        args = (rs.order, rs.bag, rs.run_start, n_kept, voff, lk.offsets, lk.B, lk.doff, pooling)
        launch(_sparse_grad, _groups(min(N, cap)), TPB, *args, *_gradient_rows(g, lk), psw, has_psw, values)
    return TBESparseGrad(ids.astype(np.int64, copy=False), values, voff.astype(np.int64, copy=False))


@vbe.backward
def tbe_backward_sparse(grad_output, weights, max_rows=None, **lookup):
    a = LookupArgs(**lookup)
    lk = _prepare(a)
    n_values = 0
    if max_rows is not None:  # the declaration's size: max_rows x the largest dim (a host layout)
        n_values = max_rows * int(np.diff(np.asarray(a.D_offsets)).max())
    return _sparse(lk, _gradient(grad_output), a.pooling, a.per_sample_weights, max_rows, n_values)


# -- gradient of the per-sample weights ------------------------------------------------------
@cuda_kernel
def _grad_psw(w, woff, doff, rows, indices, offsets, B, bag, g, out):
    """out[p] = dot(g[b, cols of t], row): lane group per lookup, lane partial sums reduced
    in shared memory in a fixed order (block-uniform loop: every thread reaches each barrier)."""
    part = cuda.shared.array(TPB, np.float32)
    tid = cuda.threadIdx.x
    lane = tid % LANES
    per_block = cuda.blockDim.x // LANES
    N = indices.shape[0]
    for p0 in range(cuda.blockIdx.x * per_block, N, cuda.gridDim.x * per_block):
        p = p0 + tid // LANES
        acc = np.float32(0.0)
        k = bag[p] if p < N else -1
        if k >= 0:
            t = k // B
            b = k - t * B
            D = doff[t + 1] - doff[t]
            r = indices[p]
            if r >= 0 and r < rows[t]:
                row = woff[t] + r * D
                for d in range(lane, D, LANES):
                    acc += np.float32(g[b, doff[t] + d]) * np.float32(w[row + d])
        part[tid] = acc
        cuda.syncthreads()
        if lane == 0 and p < N:
            s = np.float32(0.0)
            for j in range(LANES):
                s += part[tid + j]
            out[p] = s
        cuda.syncthreads()


@vbe.backward
def tbe_grad_per_sample_weights(grad_output, weights, out, **lookup):
    a = LookupArgs(**lookup)
    N = int(a.indices.shape[0])
    if N == 0:
        return
    m = xp()
    lk = _prepare(a)
    bag = m.empty(N, np.int64)
    lid = m.empty(N, np.int64)
    launch(_linear_ids, blocks(N, TPB), TPB, lk.hcs, lk.rows, lk.indices, lk.offsets, lk.B, bag, lid)
    args = (contiguous(weights), lk.woff, lk.doff, lk.rows, lk.indices, lk.offsets, lk.B, bag, _gradient(grad_output))
    launch(_grad_psw, _groups(N), TPB, *args, out)


@cuda.jit(device=True)
def _ssq4(g0, g1, g2, g3, d0, D, w, base, wd, decay):
    """This lane's sum of squares of the (decayed) gradient of its columns ``d0 .. d0 + 3`` below
    ``D``, in column order."""
    ssq = np.float32(0.0)
    for j in range(COLS):
        if d0 + j < D:
            gd = g0 if j == 0 else g1 if j == 1 else g2 if j == 2 else g3
            ge = gd + wd * np.float32(w[base + d0 + j]) if decay == DECAY_L2 else gd
            ssq += ge * ge
    return ssq


@cuda.jit(device=True)
def _step4(kind, g0, g1, g2, g3, d0, D, base, w, m1, m2, hyper, corr, mult):
    """:func:`_element_step` on the columns ``d0 .. d0 + 3`` below ``D`` of the row at ``base``,
    gradient ``g0..g3``; ``hyper``: ``(lr, eps, wd, b1, b2, bc1, bc2)``."""
    lr, eps, wd, b1, b2, bc1, bc2 = hyper
    for j in range(COLS):
        if d0 + j < D:
            gd = g0 if j == 0 else g1 if j == 1 else g2 if j == 2 else g3
            i = base + d0 + j
            w[i] = _element_step(kind, np.float32(w[i]), gd, i, m1, m2, lr, eps, wd, b1, b2, bc1, bc2, corr, mult)


# -- the fused optimizer step ------------------------------------------------------------------
@cuda.jit(device=True)
def _run_row(u, U, run_start, sbag, lid, B, doff, hcs, woff):
    """``(q0, q1, D, base, row_id)`` of run ``u``: its sorted lookups ``q0..q1``, its row's dim, first
    element and linear id; an empty run of dim 0 and id -1 when ``u >= U`` (a lane group with no row)."""
    if u >= U:
        return 0, 0, 0, 0, -1
    q0 = run_start[u]
    t = sbag[q0] // B
    D = doff[t + 1] - doff[t]
    row_id = lid[q0]
    return q0, run_start[u + 1], D, woff[t] + (row_id - hcs[t]) * D, row_id


@cuda.jit(device=True)
def _rowwise_scalars(ssq, row_id, D, m1, lr, eps, wd, decay):
    """Row-wise Adagrad's ``(corr, mult)`` of the group's row from each lane's ``ssq``, summed by
    :func:`_group_sum` (a fixed order); lane 0 reads the old accumulator (broadcast by a group sum)
    and writes the new one. Every lane of the block calls it (the simulator's shuffles synchronise
    the block)."""
    lane = cuda.threadIdx.x % LANES
    s = _group_sum(ssq)
    old = _group_sum(m1[row_id] if lane == 0 and row_id >= 0 else np.float32(0.0))
    mm, corr, mult = _rowwise_adagrad_row(old, s, D, lr, eps, wd, decay)
    if lane == 0 and row_id >= 0:
        m1[row_id] = mm
    return corr, mult


@cuda.jit(device=True)
def _row_pass(first, kind, q0, q1, lane, D, walk, base, w, m1, m2, hyper, corr, mult, decay):
    """One walk of the run per ``LANES * COLS`` columns (lane ``l`` owning the columns ``4 l .. 4 l + 3``
    of each chunk), the summed gradient kept in registers: with ``first`` (row-wise Adagrad's first
    walk) this lane's share of the row's sum of squares of its (decayed) gradient, returned; else
    the optimizer step on the lane's columns of the row at ``base``."""
    ssq = np.float32(0.0)
    for d0 in range(COLS * lane, D, LANES * COLS):
        g0, g1, g2, g3 = _run_grad4(q0, q1, d0, D, walk)
        if first:
            ssq += _ssq4(g0, g1, g2, g3, d0, D, w, base, hyper[2], decay)
        else:
            _step4(kind, g0, g1, g2, g3, d0, D, base, w, m1, m2, hyper, corr, mult)
    return ssq


@cuda_kernel(launch_bounds=HALF_SM)
def _apply(
    order,
    sbag,
    lid,
    run_start,
    n_runs,
    offsets,
    B,
    doff,
    hcs,
    woff,
    pooling,
    g,
    gD,
    gvec,
    psw,
    has_psw,
    w,
    m1,
    m2,
    kind,
    decay,
    lr,
    eps,
    wd,
    b1,
    b2,
    bc1,
    bc2,
):
    """Lane group per touched row: the optimizer step of spec 3.5 in float32 from the run's summed
    gradient (:func:`_row_pass`). Row-wise Adagrad walks the run twice (its sum of squares, reduced
    by a group sum, then the update); its shuffles need every lane, so the loop over rows is
    block-uniform. One walk in the code for both passes (two copies cost 12 registers)."""
    lane = cuda.threadIdx.x % LANES
    per_block = cuda.blockDim.x // LANES
    walk = (order, sbag, offsets, B, doff, pooling, g, gD, gvec, psw, has_psw)
    hyper = (lr, eps, wd, b1, b2, bc1, bc2)
    U = n_runs[0]
    for u0 in range(cuda.blockIdx.x * per_block, U, cuda.gridDim.x * per_block):
        q0, q1, D, base, row_id = _run_row(u0 + cuda.threadIdx.x // LANES, U, run_start, sbag, lid, B, doff, hcs, woff)
        corr = mult = np.float32(1.0)
        rowwise = kind == ROWWISE_ADAGRAD  # block-uniform
        for first in (rowwise, False):
            ssq = _row_pass(first, kind, q0, q1, lane, D, walk, base, w, m1, m2, hyper, corr, mult, decay)
            if first:
                corr, mult = _rowwise_scalars(ssq, row_id, D, m1, lr, eps, wd, decay)
            if not rowwise:
                break


# the element steps and row scalars of embnum._tbe_rows (the CPU compiles the same functions)
_rule = cuda.jit(device=True)
_sgd_step = _rule(_tbe_rows.sgd_step)
_adagrad_step = _rule(_tbe_rows.adagrad_step)
_rowwise_adagrad_row = _rule(_tbe_rows.rowwise_adagrad_row)
_rowwise_adagrad_step = _rule(_tbe_rows.rowwise_adagrad_step)
_adam_step = _rule(_tbe_rows.adam_step)
_partial_rowwise_adam_step = _rule(_tbe_rows.partial_rowwise_adam_step)
_lamb_direction = _rule(_tbe_rows.lamb_direction)
_partial_lamb_direction = _rule(_tbe_rows.partial_lamb_direction)
_lars_step = _rule(_tbe_rows.lars_step)
_partial_rowwise_v = _rule(_tbe_rows.partial_rowwise_v)
_partial_rowwise_den = _rule(_tbe_rows.partial_rowwise_den)
_lamb_rate = _rule(_tbe_rows.lamb_rate)
_lamb_move = _rule(_tbe_rows.lamb_move)
_lars_rate = _rule(_tbe_rows.lars_rate)
_max_norm_scale = _rule(_tbe_rows.max_norm_scale)
_norm_of = _rule(_tbe_rows.norm_of)


@cuda.jit(device=True)
def _element_step(kind, x, gd, i, m1, m2, lr, eps, wd, b1, b2, bc1, bc2, corr, mult):
    """The new float32 value of element ``i`` (weight ``x``, gradient ``gd``) for SGD, Adagrad,
    row-wise Adagrad (``corr``/``mult`` from the row's state) and Adam, updating its element-wise
    state; the step of both fused-update kernels."""
    if kind == SGD:
        return _sgd_step(x, gd, lr)
    if kind == ADAGRAD:
        x, m1[i] = _adagrad_step(x, gd, m1[i], lr, eps)
        return x
    if kind == ROWWISE_ADAGRAD:
        return _rowwise_adagrad_step(x, gd, corr, mult)
    x, m1[i], m2[i] = _adam_step(x, gd, m1[i], m2[i], lr, eps, wd, b1, b2, bc1, bc2)  # ADAM
    return x


@vbe.backward
def tbe_backward_update(grad_output, weights, optimizer, momentum1, momentum2, step, **lookup):
    a = LookupArgs(**lookup)
    _update(_prepare(a), a, grad_output, weights, optimizer, momentum1, momentum2, step)


def _update(lk, a, grad_output, weights, optimizer, momentum1, momentum2, step, n_values=None):
    """:func:`tbe_backward_update` on prepared lookups ``lk`` (``a``: the call's :class:`LookupArgs`,
    host layout); ``n_values``: the row-wise gradient's size where the caller knows it."""
    N = int(lk.indices.shape[0])
    if N == 0:
        return
    g = _gradient(grad_output, optimizer.float32()["max_gradient"])
    if KIND_CODES[optimizer.kind] >= LAMB or optimizer.max_norm is not None:
        layout = (a.weights_offsets, a.D_offsets, a.hash_size_cumsum)  # host arrays
        if n_values is None:
            n_values = values_bound(N, a.D_offsets, a.hash_size_cumsum, a.rows)
        _update_rows(
            weights, layout, lk, g, a.pooling, a.per_sample_weights, optimizer, momentum1, momentum2, step, n_values
        )
        return
    rs = _runs(lk)
    psw, has_psw = _psw(a.per_sample_weights)
    none = _NO_FLOATS()
    args = (rs.order, rs.bag, rs.lid, rs.run_start, rs.n_runs, lk.offsets, lk.B, lk.doff, lk.hcs, lk.woff, a.pooling)
    launch(
        _apply,
        _groups(N),
        TPB,
        *args,
        *_gradient_rows(g, lk),
        psw,
        has_psw,
        weights,
        none if momentum1 is None else momentum1,
        none if momentum2 is None else momentum2,
        *optimizer.kernel_args(step),
    )


class UpdateLaunch:
    """:func:`tbe_backward_update` prepared once for one layout and pooling (``embnum.ops.tbe.UpdatePlan``
    holds it): the layout's device tables uploaded once and kept, and the row-wise gradient's size
    bound (:func:`values_bound`) reduced to per-table sizes once, so a call passes only its checked
    lookups, ``B``, the gradient, ``psw`` and the state, as :func:`tbe_backward_update` takes them.
    No VBE."""

    def __init__(self, woff, doff, hcs, rows, pooling: int):
        # copies: under the simulator a launch writes its host arguments back into them
        self.host = tuple(np.array(a, np.int64) for a in (woff, doff, hcs, rows))
        self.dev = tuple(constant(a.copy()) for a in self.host)
        self.pooling, self.T, self.n_rows = pooling, int(woff.shape[0]), int(hcs[-1])
        dims = np.diff(self.host[1])
        _, first = np.unique(self.host[2][:-1], return_index=True)  # one feature per table
        self._max_dim = int(dims.max())
        self._tables = [(int(self.host[3][t]), int(dims[t])) for t in first]
        self._dims4 = not (self.host[1] % 4).any()  # (_gradient_rows' layout half, once)

    def n_values(self, N: int) -> int:
        """:func:`values_bound` of ``N`` lookups (Python ints: no wrap)."""
        return min(N * self._max_dim, sum(min(r, N) * d for r, d in self._tables))

    def __call__(self, grad_output, weights, indices, offsets, B, psw, optimizer, momentum1, momentum2, step):
        if offsets.dtype != indices.dtype:
            offsets = offsets.astype(indices.dtype)
        woff, doff, hcs, rows = self.dev
        ids, off = contiguous(indices), contiguous(offsets)
        lk = Lookups(woff, doff, hcs, rows, ids, off, B, self.T, self.n_rows, self.host[1], self._dims4)
        a = LookupArgs(*self.host, ids, off, B, self.pooling, psw)
        rowwise = KIND_CODES[optimizer.kind] >= LAMB or optimizer.max_norm is not None  # the scratch's size
        n_values = self.n_values(int(ids.shape[0])) if rowwise else None
        _update(lk, a, grad_output, weights, optimizer, momentum1, momentum2, step, n_values)


# -- the other optimizers and max_norm: a lane group per touched row ------------------------------
@cuda.jit(device=True)
def _group_sum(x):
    """float32 sum of ``x`` over the lane group, the same bits in every lane (xor butterfly: a fixed
    order, and each step adds the same two values in both lanes). Every lane of the group calls it."""
    off = LANES // 2
    while off > 0:
        x += np.float32(shfl_xor(x, off))
        off //= 2
    return x


@cuda.jit(device=True)
def _group_max(x):
    """float32 maximum of ``x`` over the lane group, in every lane (xor butterfly). Every lane of
    the group calls it."""
    off = LANES // 2
    while off > 0:
        y = np.float32(shfl_xor(x, off))
        x = y if y > x else x
        off //= 2
    return x


@cuda.jit(device=True)
def _group_norm(a, o, D, lane, ssq):
    """``_tbe_rows.norm_of`` the row ``a[o:o+D]`` (float32 or float16) of group sum of squares
    ``ssq``: its largest magnitude and scaled sum of squares are reduced in every case, since every
    lane of the block must reach each reduction (the simulator's shuffles synchronise the block);
    the caller calls it under block-uniform conditions only (the kind, ``max_norm``)."""
    big = np.float32(0.0)
    for d in range(lane, D, LANES):
        x = abs(np.float32(a[o + d]))
        big = x if x > big else big
    big = _group_max(big)
    t = np.float32(0.0)
    if big > np.float32(0.0) and big < np.float32(np.inf):
        for d in range(lane, D, LANES):
            q = np.float32(a[o + d]) / big
            t += q * q
    t = _group_sum(t)
    return _norm_of(ssq, big, t)


@cuda.jit(device=True)
def _row_sums(kind, decay, w, e, g, go, D, lane, wd):
    """Step 1 of :func:`_apply_rows`: the group sums the rule needs before any element changes
    (row-wise Adagrad: of the decayed gradient's squares; partial row-wise: of the gradient's
    squares; LARS: of the weight's and the gradient's squares), in every lane."""
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    for d in range(lane, D, LANES):
        gd = g[go + d]
        x = np.float32(w[e + d])
        if kind == ROWWISE_ADAGRAD:
            ge = gd + wd * x if decay == DECAY_L2 else gd
            s1 += ge * ge
        elif kind == PARTIAL_ROWWISE_ADAM or kind == PARTIAL_ROWWISE_LAMB:
            s1 += gd * gd
        elif kind == LARS_SGD:
            s1 += x * x
            s2 += gd * gd
    return _group_sum(s1), _group_sum(s2)


@cuda.jit(device=True)
def _row_scalars(kind, decay, w, e, g, go, D, lane, lid, m1, m2, s1, s2, hp):
    """Step 2 of :func:`_apply_rows`: the row's scalars ``(corr, mult, den, alr)`` from the row
    sums and the row-wise state. Lane 0 reads the old state, a group sum broadcasts it, every lane
    computes the scalars, lane 0 writes the new state. Block-uniform reductions (LARS' norms)."""
    zero = np.float32(0.0)
    wn = zero
    gn = zero
    if kind == LARS_SGD:  # block-uniform: every lane reaches the reductions
        wn = _group_norm(w, e, D, lane, s1)
        gn = _group_norm(g, go, D, lane, s2)
    old = zero
    if lane == 0 and D > 0:
        if kind == ROWWISE_ADAGRAD:
            old = m1[lid]
        elif kind == PARTIAL_ROWWISE_ADAM or kind == PARTIAL_ROWWISE_LAMB:
            old = m2[lid]
    old = _group_sum(old)
    mult = zero
    corr = np.float32(1.0)
    den = np.float32(1.0)
    alr = zero
    if D > 0:
        if kind == ROWWISE_ADAGRAD:
            rs, corr, mult = _rowwise_adagrad_row(
                old, s1, D, hp[_tbe_rows.LR], hp[_tbe_rows.EPS], hp[_tbe_rows.WD], decay
            )
            if lane == 0:
                m1[lid] = rs
        elif kind == PARTIAL_ROWWISE_ADAM or kind == PARTIAL_ROWWISE_LAMB:
            rs = _partial_rowwise_v(old, s1, D, hp[_tbe_rows.BETA2])
            den = _partial_rowwise_den(rs, hp[_tbe_rows.BC2], hp[_tbe_rows.EPS])
            if lane == 0:
                m2[lid] = rs
        elif kind == LARS_SGD:
            # mult and den carry LARS's numerator and divisor (no other kind reads them here)
            alr, mult, den = _lars_rate(hp[_tbe_rows.LR], hp[_tbe_rows.ETA], hp[_tbe_rows.WD], wn, gn)
    return corr, mult, den, alr


@cuda.jit(device=True)
def _row_step(kind, w, e, g, go, D, lane, m1, m2, hyper, corr, mult, den, alr):
    """Step 3 of :func:`_apply_rows`: element-wise state and the new row, kept in float32 in ``g``
    (LAMB: its direction first, then the trust ratio). ``hyper``: ``(lr, eps, wd, b1, b2, bc1, bc2,
    momentum)``. Returns the new row's group sum of squares."""
    lr, eps, wd, b1, b2, bc1, bc2, momentum = hyper
    wsq = np.float32(0.0)
    rsq = np.float32(0.0)
    nsq = np.float32(0.0)
    for d in range(lane, D, LANES):
        i = e + d
        gd = g[go + d]
        x = np.float32(w[i])
        if kind <= ADAM:
            x = _element_step(kind, x, gd, i, m1, m2, lr, eps, wd, b1, b2, bc1, bc2, corr, mult)
        elif kind == PARTIAL_ROWWISE_ADAM:
            x, m1[i] = _partial_rowwise_adam_step(x, gd, m1[i], lr, wd, b1, bc1, den)
        elif kind == LAMB or kind == PARTIAL_ROWWISE_LAMB:
            if kind == LAMB:
                r, m1[i], m2[i] = _lamb_direction(x, gd, m1[i], m2[i], eps, wd, b1, b2, bc1, bc2)
            else:
                r, m1[i] = _partial_lamb_direction(x, gd, m1[i], wd, b1, bc1, den)
            g[go + d] = r
            wsq += x * x
            rsq += r * r
        else:  # LARS_SGD
            x, m1[i] = _lars_step(x, gd, m1[i], alr, momentum, wd, mult, den)
        if kind != LAMB and kind != PARTIAL_ROWWISE_LAMB:
            g[go + d] = x
            nsq += x * x
    if kind == LAMB or kind == PARTIAL_ROWWISE_LAMB:  # block-uniform
        wsq = _group_sum(wsq)
        rsq = _group_sum(rsq)
        wn = _group_norm(w, e, D, lane, wsq)
        rn = _group_norm(g, go, D, lane, rsq)
        step = _lamb_rate(lr, wn, rn)
        for d in range(lane, D, LANES):
            x = _lamb_move(np.float32(w[e + d]), g[go + d], step, lr, wn, rn)
            g[go + d] = x
            nsq += x * x
    return _group_sum(nsq)


@cuda.jit(device=True)
def _write_row(w, e, g, go, D, lane, nsq, max_norm):
    """Step 4 of :func:`_apply_rows`: ``max_norm`` (block-uniform), then the one write of the row."""
    n = np.float32(0.0)
    if max_norm > np.float32(0.0):
        n = _group_norm(g, go, D, lane, nsq)
    clip, c = _max_norm_scale(n, max_norm)
    for d in range(lane, D, LANES):
        x = g[go + d]
        w[e + d] = x * c if clip else x


@cuda_kernel
def _apply_rows(kind, decay, w, elem, lids, g, voff, m1, m2, hp):
    """Lane group per touched row ``u`` (``lids[u] < 0``: a padded row, skipped), lanes over the
    columns: :mod:`embnum._tbe_rows`'s rule (the same formulas) for LAMB, partial row-wise
    Adam/LAMB, LARS-SGD and every kind with ``max_norm``. Row sums by :func:`_group_sum`
    (deterministic, no atomics); row-wise state read and written by lane 0 and broadcast by a
    group sum; element-wise state and weights read and written coalesced. The new row is kept in
    float32 in ``g`` (the caller's scratch) until ``max_norm`` is known, then written once (float16
    weights rounded once). The loop over rows is block-uniform (the shuffles need every lane)."""
    lane = cuda.threadIdx.x % LANES
    per_block = cuda.blockDim.x // LANES
    hyper = (
        hp[_tbe_rows.LR],
        hp[_tbe_rows.EPS],
        hp[_tbe_rows.WD],
        hp[_tbe_rows.BETA1],
        hp[_tbe_rows.BETA2],
        hp[_tbe_rows.BC1],
        hp[_tbe_rows.BC2],
        hp[_tbe_rows.MOMENTUM],
    )
    max_norm = hp[_tbe_rows.MAX_NORM]
    R = lids.shape[0]
    for u0 in range(cuda.blockIdx.x * per_block, R, cuda.gridDim.x * per_block):
        u = u0 + cuda.threadIdx.x // LANES
        D = 0
        go = 0
        e = 0
        lid = 0
        if u < R and lids[u] >= 0:
            lid = lids[u]
            go = voff[u]
            D = voff[u + 1] - go
            e = elem[u]
        s1, s2 = _row_sums(kind, decay, w, e, g, go, D, lane, hyper[2])
        corr, mult, den, alr = _row_scalars(kind, decay, w, e, g, go, D, lane, lid, m1, m2, s1, s2, hp)
        nsq = _row_step(kind, w, e, g, go, D, lane, m1, m2, hyper, corr, mult, den, alr)
        _write_row(w, e, g, go, D, lane, nsq, max_norm)


def values_bound(N: int, D_offsets, hash_size_cumsum, rows) -> int:
    """The most float32 values the row-wise gradient of ``N`` lookups can hold, from the host layout
    (no device read): each touched row holds its table's dim, ``N`` lookups touch at most ``N`` rows
    of at most the largest dim, and at most ``min(N, rows)`` rows of each table (features sharing a
    table share its rows: equal ``hash_size_cumsum`` entries). So tables smaller than the batch
    bound the scratch by their own size, not by ``N x max_dim``."""
    doff, hcs = np.asarray(D_offsets, np.int64), np.asarray(hash_size_cumsum, np.int64)
    dims = np.diff(doff)
    _, first = np.unique(hcs[:-1], return_index=True)  # one feature per table
    per_table = np.minimum(np.asarray(rows, np.int64)[first], N) * dims[first]
    return min(N * int(dims.max()), sum(int(x) for x in per_table))  # Python ints: no wrap


def _update_rows(weights, layout, lk, g, pooling, per_sample_weights, optimizer, momentum1, momentum2, step, n_values):
    """LAMB, partial row-wise Adam/LAMB, LARS-SGD and ``max_norm``: the sparse gradient at the fixed
    size ``max_rows = N`` (``U <= N``), so nothing is read back, then :func:`_apply_rows`, a lane group
    per touched row, in place on float32 or float16 weights. ``layout``: the host
    ``(weights_offsets, D_offsets, hash_size_cumsum)``; ``n_values``: the gradient's size
    (:func:`values_bound`)."""
    m = xp()
    N = int(lk.indices.shape[0])
    lids, values, voff = _sparse(lk, g, pooling, per_sample_weights, max_rows=N, n_values=n_values)
    elem = _tbe_rows.row_elements(m, m.maximum(lids, 0), *layout)
    none = _NO_FLOATS()
    args = optimizer.kernel_args(step)
    hp = m.asarray(optimizer.hyper_array(step))
    state = (none if momentum1 is None else momentum1, none if momentum2 is None else momentum2)
    launch(_apply_rows, _groups(N), TPB, args.kind, args.decay, weights, elem, lids, values, voff, *state, hp)
