"""Numba host kernels of the TBE family (``docs/families/tbe.md``).

Forward: parallel over blocks of bags of one feature; each bag is pooled in float32 and
written once: for the specialised dims (multiples of 8) in 8-lane vector accumulators held in
registers (``_pool_bag8``, explicit LLVM vector code), else element by element through a
float32 block (``_pool_bag_scalar``). The rows are random, so the gather is bound by the
cache misses a core keeps in flight: rows are prefetched in two stages (towards the L2 far
ahead, into the L1 near), see ``PREFETCH_FAR``. float16 weights are widened exactly: 8 at a
time by the CPU's F16C conversion where it has one (LLVM ``fpext``), else through a
65536-entry lookup table (``embnum._half``; Numba has no float16 arithmetic on the CPU);
accumulated in float32 and rounded once.

Backward and the fused optimizers: per physical table, a counting sort of the
lookups by row (ids are bounded by the table's rows, so no comparison sort),
then one pass over the rows in increasing order that sums each touched row's
gradient in a fixed order (increasing position) and writes or updates the row
once. No atomics; results do not depend on the thread count. One kernel per
result (``_dense_grad``, ``_sparse_grad``, ``_FUSED_UPDATE``), each taking the
prepared lookups as one ``Lookups`` record; the optimizer step takes
``embnum._tbe.OptimizerArgs`` and applies one row rule per kind.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import llvmlite.binding as llvm_binding
import llvmlite.ir as ir
import numpy as np
from numba import parallel_chunksize, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import _tbe_rows
from .._cache import BoundedCache
from .._jit import njit
from .._tbe import (
    ADAGRAD,
    ADAM,
    DECAY_L2,
    MEAN,
    NONE,
    ROWWISE_ADAGRAD,
    SGD,
    LookupArgs,
    TBESparseGrad,
    clipped_gradient,
    pad_sparse,
    uses_row_rule,
)
from . import _common
from . import _tbe_vbe as vbe
from ._common import F16C, float32_result, half_table, round_once, widen_half

BAGS_PER_JOB = 64
# forward: rows are random in a buffer far larger than the caches, so the gather is bound by the misses
# one core keeps in flight. Two stages: rows FAR lookups ahead towards the L2 (prefetcht2: no first-level
# miss buffer held, and the L2 tracks more misses), rows NEAR lookups ahead from there into the L1.
# One stage (prefetcht0, 8 ahead) kept ~24 lines in flight: 72 -> 57 ms on the case, 1 thread.
PREFETCH_DISTANCE = 6
PREFETCH_FAR = 32
# Rows of 64 dims and more (256 bytes of float32): further ahead in both stages. On the Xeon of
# 2026-11-28 (2 MiB L2 per core), T=26 x 100K x 128, B=2048, L~20, one thread: 76-77 -> 62-63 ms
# (fbgemm 71-72); 32 -> 48 rows ahead is a cliff, 48-128 a plateau. 32 dims kept the near ones
# (24.7 vs 21.7-22.6 ms at 100K rows, 27.4-28.7 vs 26.7 at 400K: the further rows only evict).
WIDE_PREFETCH_FAR = 64
WIDE_PREFETCH_DISTANCE = 8
UPDATE_PREFETCH_DISTANCE = 8  # fused update: touched rows ahead into the L1 ...
UPDATE_PREFETCH_FAR = 32  # ... and this many ahead towards the L2 (two stages, as the forward)
GRAD_PREFETCH_DISTANCE = 16  # backward: sorted lookups ahead whose output gradient is prefetched
_NO_LUT = np.zeros(1, dtype=np.float32)
_NO_F32 = np.zeros(1, dtype=np.float32)
_NO_I64 = np.zeros(1, dtype=np.int64)


def _load(w, lut, i):
    """``weights[i]`` as float32 (float16 weights arrive as their uint16 bits), for arithmetic:
    a signalling NaN comes back quiet (as any float32 operation on it would return it)."""


def _copy_of(w, lut, i):
    """``weights[i]`` as float32 bit for bit (the table: a signalling NaN stays signalling), for copies."""


@overload(_copy_of, inline="always")
def _copy_of_impl(w, lut, i):
    if isinstance(w, types.Array) and w.dtype == types.uint16:
        return lambda w, lut, i: lut[w[i]]
    return lambda w, lut, i: w[i]


@overload(_load, inline="always")
def _load_impl(w, lut, i):
    if isinstance(w, types.Array) and w.dtype == types.uint16:
        if F16C:
            return lambda w, lut, i: widen_half(w[i])
        return lambda w, lut, i: lut[w[i]]
    return lambda w, lut, i: w[i]


def _prefetch_lines(builder, ptr, nbytes, locality):
    """``llvm.prefetch`` (read, ``locality``: 3 -> ``prefetcht0``, 1 -> ``prefetcht2``) of every 64-byte
    line the ``nbytes`` from ``ptr`` touch, wherever ``ptr`` falls in a line: the lines at ``ptr + 64k``
    and the one holding the last byte. NumPy's large arrays start 16 bytes past a line, so each row
    of 512 bytes spans 9 lines; the 9th, left out, was a demand miss per row (float32, 1 thread:
    a full-row read 47.6 -> 38.9 ms with it, one load per line 34.4)."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    base = builder.bitcast(ptr, i8p)
    for c in list(range(0, nbytes, 64)) + ([nbytes - 1] if nbytes > 1 else []):
        line = builder.gep(base, [ir.Constant(ir.IntType(64), c)])
        builder.call(fn, [line, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


def _prefetch_intrinsic(locality, doc):
    """An intrinsic ``(arr, i) -> None`` hinting the CPU to fetch ``arr[i]``'s cache line
    (LLVM ``llvm.prefetch``, read, the given locality: 3 -> ``prefetcht0``, 1 -> ``prefetcht2``)."""

    def prefetch(typingctx, arr, i):
        sig = types.void(arr, i)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            _prefetch_lines(builder, ptr, 1, locality)
            return context.get_dummy_value()

        return sig, codegen

    prefetch.__doc__ = doc
    prefetch.__name__ = prefetch.__qualname__ = f"prefetch_locality{locality}"
    return intrinsic(prefetch)


_prefetch = _prefetch_intrinsic(3, "Fetch ``arr[i]``'s cache line into every cache level (``prefetcht0``).")
_prefetch_far = _prefetch_intrinsic(
    1,
    "Fetch ``arr[i]``'s cache line towards the core without claiming a first-level miss buffer "
    "(``prefetcht2``: the L2 on AMD Zen, which tracks more misses in flight than the L1).",
)


def _per_line(w):
    """Elements of ``w`` per 64-byte cache line (a compile-time constant)."""


@overload(_per_line, inline="always")
def _per_line_impl(w):
    n = 512 // w.dtype.bitwidth
    return lambda w: n


@njit(cache=True, inline="always")
def _prefetch_row(w, base, n):
    """Prefetch the cache lines of ``w[base : base + n]`` into the L1."""
    ub = np.uint64(base)
    for c in range(0, n, _per_line(w)):
        _prefetch(w, ub + np.uint64(c))


@njit(cache=True, inline="always")
def _prefetch_row_far(w, base, n):
    """Prefetch the cache lines of ``w[base : base + n]`` into the L2 (see ``_prefetch_far``)."""
    ub = np.uint64(base)
    for c in range(0, n, _per_line(w)):
        _prefetch_far(w, ub + np.uint64(c))


@njit(cache=True, inline="always")
def _prefetch_whole_row(w, base, n):
    """``_prefetch_row`` and the line holding ``w[base + n - 1]`` (a row that starts inside a line
    ends in one more line; see ``_prefetch_lines``)."""
    _prefetch_row(w, base, n)
    _prefetch(w, np.uint64(base + n - 1))


@njit(cache=True, inline="always")
def _prefetch_whole_row_far(w, base, n):
    """``_prefetch_row_far`` and the line holding ``w[base + n - 1]``."""
    _prefetch_row_far(w, base, n)
    _prefetch_far(w, np.uint64(base + n - 1))


def _weights(weights):
    w = np.ascontiguousarray(weights)
    return (w.view(np.uint16), half_table()) if w.dtype == np.float16 else (w, _NO_LUT)


def _one_thread_when_small(entry):
    """Run the entry point on one thread when its lookups move fewer than
    ``SERIAL_BYTES`` (lookups x mean dim x 8 bytes: a row read and an output or
    gradient element written per element). The registry's own rule counts every
    array, the weights included, which says nothing about a lookup's work.
    ``SERIAL_OVERRIDE`` (tests, benchmarks), when set, replaces ``SERIAL_BYTES`` here too."""

    @functools.wraps(entry)
    def run(*args, **kw):
        if _small(kw):
            return _common.on_one_thread(entry, *args, **kw)
        return entry(*args, **kw)

    return run


def _small(lookup):
    """Whether a call with these lookup arguments is small (see ``_one_thread_when_small``): it
    then runs on one thread, and the pooled forward takes :func:`_forward_small`."""
    idx, doff = lookup.get("indices"), lookup.get("D_offsets")
    if idx is None or doff is None or doff.shape[0] <= 1:
        return False
    work = idx.shape[0] * (int(doff[-1]) // (doff.shape[0] - 1) + 1) * 8
    limit = _common.SERIAL_OVERRIDE
    return work < (_common.SERIAL_BYTES if limit is None else limit)


def _checked(indices, offsets):
    """Contiguous lookups (already checked by the declaration: every index is readable)."""
    return np.ascontiguousarray(indices), np.ascontiguousarray(offsets)


# -- forward -----------------------------------------------------------------
@njit(cache=True, inline="always")
def _add_row(acc, w, lut, base, D):
    # unsigned indices: no negative-index wraparound test, so the loop vectorises (a slice
    # would do the same but costs an atomic reference count, contended between threads)
    ub = np.uint64(base)
    for d in range(D):
        acc[d] += _load(w, lut, ub + np.uint64(d))


@njit(cache=True, inline="always")
def _add_scaled_row(acc, w, lut, base, D, c):
    ub = np.uint64(base)
    for d in range(D):
        acc[d] += c * _load(w, lut, ub + np.uint64(d))


def _vector_rows(w):
    """Whether ``_pool_bag8`` can read rows of ``w`` (a compile-time constant): float32, or float16
    bits where the CPU converts 8 halves at once (F16C; elsewhere LLVM would widen each lane by a
    library call)."""


@overload(_vector_rows, inline="always")
def _vector_rows_impl(w):
    ok = isinstance(w, types.Array) and (w.dtype == types.float32 or (w.dtype == types.uint16 and F16C))
    return lambda w: ok


# columns pooled per pass over a bag's rows in ``_pool_bag8`` (a wider row takes several passes, the later
# ones reading the bag's rows from the L1). 128: D=128 in one pass, 16 accumulators of 8 lanes (x86's AVX2
# has 16 vector registers, so LLVM spills ~3 to the stack). The benchmark case, 1 thread, min of 21 rounds
# (A/B in one process): float16 30.5 -> 28.9 ms with 128 columns, 38.5 with 64 (two passes); float32 53.4 -> 47.2.
POOL_COLUMNS = 128
# the pooled forward writes outputs of at least STREAM_BYTES with non-temporal stores (x86 only): a
# large output is not read again from the caches before it is evicted, and ordinary stores read
# every line in first (read for ownership) and leave it dirty for the next kernel's misses to write
# back. The benchmark case at T=8 (8 MiB output), float16, 1 thread, A/B in one process, min / median of
# 40 rounds: 7.98 / 9.20 ms -> 7.58 / 8.23 ms, the gather floor's 7.63 / 7.91.
STREAM_BYTES = 4 << 20
STREAM = llvm_binding.get_process_triple().startswith("x86_64")


def _row_pointer(builder, data, w0, index, D):
    """``&data[w0 + index * D]`` (``index`` sign-extended to 64 bits)."""
    i64 = ir.IntType(64)
    row = builder.sext(index, i64) if index.type.width < 64 else index
    return builder.gep(data, [builder.add(w0, builder.mul(row, ir.Constant(i64, D)))])


def _splat(builder, x, vty):
    """The vector ``vty`` with ``x`` in every lane."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vty.count), [0] * vty.count)
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), zeros)


def _store_row(builder, data, o, c0, vectors, lanes, nontemporal):
    """Store ``vectors`` (each ``lanes`` float32) to ``data[o + c0 :]`` one after another; non-temporal
    stores (``movntps``: whole lines go to memory past the caches, with no read for ownership) need the
    address aligned to a vector."""
    i64 = ir.IntType(64)
    for k, v in enumerate(vectors):
        ptr = builder.bitcast(
            builder.gep(data, [builder.add(o, ir.Constant(i64, c0 + lanes * k))]), v.type.as_pointer()
        )
        st = builder.store(v, ptr, align=4 * lanes if nontemporal else 4)
        if nontemporal:
            st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _half_of(builder, v, h):
    """Lanes ``4h .. 4h + 3`` of the 8-lane ``v``."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), 4), list(range(4 * h, 4 * h + 4))))


@intrinsic
def _store_fence(typingctx):
    """``sfence`` (x86): the non-temporal stores before it are ordered before every store after it
    (the parallel region's end then publishes them to the thread that reads the output)."""

    def codegen(context, builder, signature, args):
        if STREAM:  # elsewhere nothing is streamed (and the intrinsic does not exist)
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.sfence"), [])
        return context.get_dummy_value()

    return types.void(), codegen


def _bit(builder, flag):
    """A boolean argument (``i1``, or ``i8`` in some representations) as ``i1``."""
    return builder.trunc(flag, ir.IntType(1)) if flag.type.width > 1 else flag


class _BagIR:
    """The LLVM IR of one ``_pool_bag8`` call (its arguments as there): :meth:`pool` sums the bag's
    rows over ``width`` columns into 8-lane float32 accumulators, :meth:`store` writes them out."""

    def __init__(self, context, builder, signature, args, DC, width, half, far, near):
        wa, ia, self.s, self.e, self.pend, self.w0, _, _, _, _, pa, self.has_psw, fa, self.o, self.mean, self.stream = (
            args
        )
        ty = signature.args
        self.builder, self.DC, self.half, self.far, self.near = builder, DC, half, far, near
        self.wdata = context.make_array(ty[0])(context, builder, wa).data
        self.idata = context.make_array(ty[1])(context, builder, ia).data
        self.pdata = context.make_array(ty[10])(context, builder, pa).data
        self.fdata = context.make_array(ty[12])(context, builder, fa).data
        self.v8 = ir.VectorType(ir.FloatType(), 8)
        self.lane_in = ir.VectorType(ir.HalfType(), 8) if half else self.v8
        self.esize = 2 if half else 4
        self.accs = [cgutils.alloca_once(builder, self.v8) for _ in range(width // 8)]

    def pool(self, c0, scaled, prefetch):
        """Columns ``c0 :`` of the bag's rows (each times its weight when ``scaled``) summed into the
        accumulators; with ``prefetch``, rows ``far`` and ``near`` lookups ahead fetched on the way."""
        builder, v8, i64l = self.builder, self.v8, ir.IntType(64)
        for a in self.accs:
            builder.store(ir.Constant(v8, [0.0] * 8), a)
        with cgutils.for_range_slice(builder, self.s, self.e, ir.Constant(i64l, 1)) as (p, _):
            if prefetch:
                for dist, locality in ((self.far, 1), (self.near, 3)):
                    q = builder.add(p, ir.Constant(i64l, dist))
                    with cgutils.if_likely(builder, builder.icmp_signed("<", q, self.pend)):
                        ptr = _row_pointer(
                            builder, self.wdata, self.w0, builder.load(builder.gep(self.idata, [q])), self.DC
                        )
                        _prefetch_lines(builder, ptr, self.DC * self.esize, locality)
            row = _row_pointer(builder, self.wdata, self.w0, builder.load(builder.gep(self.idata, [p])), self.DC)
            if scaled:
                cv = _splat(builder, builder.load(builder.gep(self.pdata, [p])), v8)
            for k, a in enumerate(self.accs):
                ptr = builder.bitcast(builder.gep(row, [ir.Constant(i64l, c0 + 8 * k)]), self.lane_in.as_pointer())
                x = builder.load(ptr, align=self.esize)
                if self.half:
                    x = builder.fpext(x, v8)
                if scaled:
                    x = builder.fmul(cv, x)
                builder.store(builder.fadd(x, builder.load(a)), a)

    def store(self, c0):
        """The accumulators (divided by the bag's length for a non-empty ``mean`` bag) written to
        ``flat[o + c0 :]``: non-temporal stores when ``stream`` and ``flat + o + c0`` is 16-byte
        aligned (32-byte ones where it is 32-byte aligned), else plain ones."""
        builder, v8, i64l, accs = self.builder, self.v8, ir.IntType(64), self.accs
        n = builder.sub(self.e, self.s)
        with builder.if_then(builder.and_(_bit(builder, self.mean), builder.icmp_signed(">", n, n.type(0)))):
            Lv = _splat(builder, builder.sitofp(n, ir.FloatType()), v8)  # np.float32(e - s)
            for a in accs:
                builder.store(builder.fdiv(builder.load(a), Lv), a)
        first = builder.ptrtoint(builder.gep(self.fdata, [builder.add(self.o, ir.Constant(i64l, c0))]), i64l)
        aligned = [builder.icmp_unsigned("==", builder.and_(first, first.type(m)), first.type(0)) for m in (31, 15)]
        with builder.if_else(builder.and_(_bit(builder, self.stream), aligned[1])) as (nt, plain):
            with nt:
                with builder.if_else(aligned[0]) as (by32, by16):
                    with by32:
                        _store_row(builder, self.fdata, self.o, c0, [builder.load(a) for a in accs], 8, True)
                    with by16:
                        halves = [_half_of(builder, builder.load(a), h) for a in accs for h in (0, 1)]
                        _store_row(builder, self.fdata, self.o, c0, halves, 4, True)
            with plain:
                _store_row(builder, self.fdata, self.o, c0, [builder.load(a) for a in accs], 8, False)


@intrinsic(prefer_literal=True)
def _pool_bag8(typingctx, w, indices, s, e, pend, w0, D, columns, far, near, psw, has_psw, flat, o, mean, stream):
    """Bag ``s..e-1`` pooled into ``flat[o : o + D]``: ``sum_p c_p * w[w0 + indices[p] * D :][:D]`` in
    float32 (``c_p = psw[p]`` when ``has_psw``, else the row is added unscaled), divided by the bag's
    length when ``mean`` and it is not empty. ``w``: float32, or float16 as uint16 bits (widened 8 at a
    time, exactly: LLVM ``fpext``); ``D`` and ``columns``: literal multiples of 8; ``far``, ``near``: literal
    prefetch distances.

    The accumulators are 8-lane vectors held in registers over the bag's rows, ``columns`` columns
    per pass (see ``POOL_COLUMNS``), and written once; every element is the same chain of float32
    operations, in the same order, as in ``_pool_bag_scalar`` (``0 + r_0 + r_1 ...``, or
    ``... + c_p * r_p`` with a separate multiply, no fused multiply-add), so the results are bit for
    bit the same (one exception: where two NaNs of different payloads meet in a bag, the result is a
    NaN in both, but which payload survives follows the operand order LLVM picks for each add, which
    neither kernel pins, nor does the reference). The first pass prefetches rows ``far`` lookups
    ahead towards the L2 and ``near`` ahead into the L1, as the element loop does (``pend``: the
    job's end). ``stream``: write ``flat`` with non-temporal
    stores (see ``STREAM_BYTES``; 32- or 16-byte ones as ``flat + o`` is aligned, else plain stores);
    the caller then orders them (``_store_fence``) before anything reads ``flat``."""
    if not all(isinstance(x, types.IntegerLiteral) for x in (D, columns, far, near)):
        return None
    if D.literal_value % 8 or columns.literal_value % 8:
        return None
    DC = D.literal_value
    width = min(DC, columns.literal_value)
    half = w.dtype == types.uint16
    i64 = types.int64
    b1 = types.boolean
    sig = types.void(w, indices, i64, i64, i64, i64, D, columns, far, near, psw, b1, flat, i64, b1, b1)

    def codegen(context, builder, signature, args):
        bag = _BagIR(context, builder, signature, args, DC, width, half, far.literal_value, near.literal_value)
        for c0 in range(0, DC, width):
            with builder.if_else(_bit(builder, bag.has_psw)) as (then, otherwise):
                with then:
                    bag.pool(c0, True, c0 == 0)
                with otherwise:
                    bag.pool(c0, False, c0 == 0)
            bag.store(c0)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _pool_bag_scalar(w, lut, indices, s, e, pend, w0, D, psw, has_psw, acc, flat, o, mean):
    """Bag ``s..e-1`` pooled into ``flat[o : o + D]`` element by element through ``acc`` (float32 ``[D]``),
    every row prefetched in two stages (``PREFETCH_FAR``, ``PREFETCH_DISTANCE``; ``pend``: the job's end)."""
    for d in range(D):
        acc[d] = 0.0
    for p in range(s, e):
        if p + PREFETCH_FAR < pend:
            _prefetch_whole_row_far(w, w0 + np.int64(indices[p + PREFETCH_FAR]) * D, D)
        if p + PREFETCH_DISTANCE < pend:
            _prefetch_whole_row(w, w0 + np.int64(indices[p + PREFETCH_DISTANCE]) * D, D)
        if has_psw:
            _add_scaled_row(acc, w, lut, w0 + np.int64(indices[p]) * D, D, psw[p])
        else:
            _add_row(acc, w, lut, w0 + np.int64(indices[p]) * D, D)
    uo = np.uint64(o)
    if mean and e > s:
        L = np.float32(e - s)
        for d in range(D):
            flat[uo + np.uint64(d)] = acc[d] / L
    else:
        for d in range(D):
            flat[uo + np.uint64(d)] = acc[d]


def forward_prefetch(DC):
    """``(far, near)``: how many lookups ahead the vector forward of dim ``DC`` prefetches its rows."""
    return (WIDE_PREFETCH_FAR, WIDE_PREFETCH_DISTANCE) if DC >= 64 else (PREFETCH_FAR, PREFETCH_DISTANCE)


def _make_forward_pooled(DC, vector=True, columns=POOL_COLUMNS, far=None, near=None):
    """The pooled forward for features of one embedding dim: ``DC`` (a constant the
    compiler unrolls and vectorises the row loops for) or, when ``DC == 0``, the dim
    read from ``D_offsets`` per feature. ``vector``: a constant ``DC`` that is a multiple of 8
    pools each bag in 8-lane register accumulators (``_pool_bag8``) when the weights allow
    it (``_vector_rows``); else element by element through a float32 block in memory. ``far``,
    ``near``: the vector path's prefetch distances (lookups ahead towards the L2 and into the L1;
    :func:`forward_prefetch` by default)."""
    if far is None:
        far, near = forward_prefetch(DC)

    @njit(cache=True, parallel=True, nogil=True)
    def kernel(w, lut, woff, doff, feats, indices, offsets, B, mean, psw, has_psw, out, stream):
        nf = feats.shape[0]
        jobs_per_f = (B + BAGS_PER_JOB - 1) // BAGS_PER_JOB
        OC = out.shape[1]
        for job in prange(nf * jobs_per_f):
            f = job // jobs_per_f
            t = feats[f]
            b0 = (job - f * jobs_per_f) * BAGS_PER_JOB
            D = DC if DC > 0 else doff[t + 1] - doff[t]
            w0 = woff[t]
            c0 = doff[t]
            acc = np.empty(D, dtype=np.float32)
            flat = out.reshape(-1)
            b1 = min(B, b0 + BAGS_PER_JOB)
            ps = offsets[t * B + b0]
            pend = offsets[t * B + b1]
            for q in range(ps, min(ps + far, pend)):
                _prefetch_whole_row_far(w, w0 + np.int64(indices[q]) * D, D)
            for q in range(ps, min(ps + near, pend)):
                _prefetch_whole_row(w, w0 + np.int64(indices[q]) * D, D)
            for b in range(b0, b1):
                s = offsets[t * B + b]
                e = offsets[t * B + b + 1]
                o = b * OC + c0
                if vector and DC > 0 and DC % 8 == 0 and _vector_rows(w):
                    _pool_bag8(w, indices, s, e, pend, w0, DC, columns, far, near, psw, has_psw, flat, o, mean, stream)
                else:
                    _pool_bag_scalar(w, lut, indices, s, e, pend, w0, D, psw, has_psw, acc, flat, o, mean)
            if stream and vector and DC > 0 and DC % 8 == 0 and _vector_rows(w):
                _store_fence()

    return kernel


# dims with their own compiled forward (the common recsys dims); others share the generic one
SPECIALISED_DIMS = (32, 64, 128, 256)
_FORWARD_POOLED = {D: _make_forward_pooled(D) for D in SPECIALISED_DIMS + (0,)}


@njit(cache=True, nogil=True)
def _forward_small(w, lut, woff, doff, indices, offsets, B, mean, psw, has_psw, out):
    """The pooled forward of a small call (one thread, every feature, any dim) in plain loops:
    ``out [B, total_D]`` (float32) gets each bag's rows summed in float32 in index order, each row
    times ``psw[p]`` when ``has_psw``, divided by the bag's length when ``mean`` and not empty:
    the pooled kernels' arithmetic in their order, so the same bits. Small calls need none of
    their prefetching or per-dim code, and a cold first call compiles this in about 0.3 s where
    their serial twins took 1.0 s."""
    OC = out.shape[1]
    flat = out.reshape(-1)
    for t in range(woff.shape[0]):
        D, w0, c0 = doff[t + 1] - doff[t], woff[t], doff[t]
        for b in range(B):
            s, e = offsets[t * B + b], offsets[t * B + b + 1]
            o = np.uint64(b * OC + c0)
            for d in range(D):
                flat[o + np.uint64(d)] = 0.0
            for p in range(s, e):
                row = np.uint64(w0 + np.int64(indices[p]) * D)
                c = psw[p] if has_psw else np.float32(1.0)
                for d in range(D):
                    x = _load(w, lut, row + np.uint64(d))
                    flat[o + np.uint64(d)] += c * x if has_psw else x
            if mean and e > s:
                L = np.float32(e - s)
                for d in range(D):
                    flat[o + np.uint64(d)] /= L


def _forward_pooled(w, lut, woff, doff, indices, offsets, B, mean, psw, has_psw, out, small):
    if small:
        _forward_small(w, lut, woff, doff, indices, offsets, B, mean, psw, has_psw, out)
        return
    stream = STREAM and out.nbytes >= STREAM_BYTES
    for D, feats in _feature_groups(doff):
        _FORWARD_POOLED[D](w, lut, woff, doff, feats, indices, offsets, B, mean, psw, has_psw, out, stream)


def _feature_groups(doff):
    """The forward's kernel calls for ``D_offsets``: ``((dim, features int64 [n]), ...)``, one per
    specialised dim present, then the generic kernel's key 0 with the other features (if any).

    Grouping with NumPy cost ~13 us per call, most of a small forward's time, and a
    model passes the same ``D_offsets`` on every call: cached by content. The key is the array's
    dtype and bytes (``doff`` is 1-D, so they fix its length and every value the grouping reads):
    a hit can never be stale, an array changed in place has other bytes. Bounded and thread-safe
    (``BoundedCache``). The feature arrays are private (only kernels that read them get them)."""
    key = (doff.dtype, doff.tobytes())  # the dtype itself: '>i8' and '<i8' share a code
    found = _GROUPS.get(key)
    if found is None:
        found = _GROUPS.put(key, _group_features(doff))
    return found


def _group_features(doff):
    dims = np.diff(doff).tolist()
    groups = [(D, np.array([t for t, d in enumerate(dims) if d == D], dtype=np.int64)) for D in SPECIALISED_DIMS]
    groups.append((0, np.array([t for t, d in enumerate(dims) if d not in SPECIALISED_DIMS], np.int64)))
    return tuple((D, feats) for D, feats in groups if feats.shape[0])


_GROUPS = BoundedCache(256)  # D_offsets (dtype, bytes) -> _group_features(D_offsets)


@njit(cache=True, parallel=True, nogil=True)
def _forward_none(w, lut, woff, doff, indices, offsets, B, out):
    T = woff.shape[0]
    D = doff[1]
    N = indices.shape[0]
    first = offsets[0]
    for p in prange(N):
        if p < first:
            for d in range(D):
                out[p, d] = 0.0
    for k in prange(T * B):
        t = k // B
        base0 = woff[t]
        for p in range(offsets[k], offsets[k + 1]):
            base = base0 + np.int64(indices[p]) * D
            for d in range(D):
                out[p, d] = _copy_of(w, lut, base + d)


@vbe.forward
@_one_thread_when_small
def tbe_forward(weights, output_dtype, out, **lookup):
    a = LookupArgs(**lookup)
    idx, offs = _checked(a.indices, a.offsets)
    w, lut = _weights(weights)
    target = float32_result(out)
    if a.pooling == NONE:
        _forward_none(w, lut, a.weights_offsets, a.D_offsets, idx, offs, a.B, target)
    else:
        psw = _psw(a)
        mean = a.pooling == MEAN
        small = _small(lookup)
        _forward_pooled(w, lut, a.weights_offsets, a.D_offsets, idx, offs, a.B, mean, psw, a.has_psw, target, small)
    round_once(target, out)


def _psw(a):
    return np.ascontiguousarray(a.per_sample_weights) if a.has_psw else _NO_F32


# -- backward: counting sort per table, one pass over touched rows ---------------
# Columns of the ``tables`` array (one row per physical table, see ``_tables``).
FIRST_FEATURE, START, END, ROWS, DIM, WEIGHTS_OFFSET, FIRST_ROW, END_FEATURE = range(8)
# A pooled table's output-gradient columns are copied to one contiguous block (``_table_grad``)
# when it has at most this many elements and at least one lookup per bag: the sorted lookups
# then gather from a block of ~1 MB instead of rows one output-row stride apart.
COMPACT_GRAD_MAX = 1 << 21


class Lookups(NamedTuple):
    """The backward's prepared arguments (``_prepare``), passed to the kernels as one record.

    indices: int32/int64 ``[N]``; offsets: ``[T*B+1]``; bag: int32 ``[N]`` (the bag
    ``t*B + b`` of each position, -1 outside every bag); doff: int64 ``[T+1]``
    (``D_offsets``); grad: float32, the output gradient flattened (clipped when
    the optimizer says so); psw: float32 ``[N]`` (a 1-element placeholder when
    ``has_psw`` is false); tables: int64 ``[n, 8]``, columns ``FIRST_FEATURE`` ..
    ``END_FEATURE``.
    """

    indices: np.ndarray
    offsets: np.ndarray
    bag: np.ndarray
    B: int
    doff: np.ndarray
    pooling: int
    grad: np.ndarray
    psw: np.ndarray
    has_psw: bool
    tables: np.ndarray


@njit(cache=True, parallel=True)
def _bag_of_position(offsets, n_bags, N):
    """``bag[p]`` = the bag ``k = t*B + b`` holding position ``p`` (-1 outside every bag)."""
    bag = np.empty(N, dtype=np.int32)
    for p in prange(offsets[0]):
        bag[p] = -1
    for k in prange(n_bags):
        for p in range(offsets[k], offsets[k + 1]):
            bag[p] = k
    return bag


@njit(cache=True)
def _tables(hash_size_cumsum, weights_offsets, D_offsets, rows, offsets, B):
    """One row per physical table (features sharing a table merged), columns
    ``FIRST_FEATURE, START, END`` (its lookups' position range), ``ROWS, DIM,
    WEIGHTS_OFFSET, FIRST_ROW`` (its first linear row id), ``END_FEATURE`` (one past its
    last feature: the features of a table are consecutive). Compiled (one call instead of
    a Python loop over the features)."""
    T = weights_offsets.shape[0]
    out = np.empty((T, 8), dtype=np.int64)
    n = 0
    for t in range(T):
        if t and hash_size_cumsum[t] == hash_size_cumsum[t - 1]:
            out[n - 1, END] = offsets[(t + 1) * B]
            out[n - 1, END_FEATURE] = t + 1
            continue
        out[n, FIRST_FEATURE] = t
        out[n, START] = offsets[t * B]
        out[n, END] = offsets[(t + 1) * B]
        out[n, ROWS] = rows[t]
        out[n, DIM] = D_offsets[t + 1] - D_offsets[t]
        out[n, WEIGHTS_OFFSET] = weights_offsets[t]
        out[n, FIRST_ROW] = hash_size_cumsum[t]
        out[n, END_FEATURE] = t + 1
        n += 1
    return out[:n].copy()


_SERIAL = contextlib.nullcontext()


def _one_or_all(kernel):
    """``run(*args)``: ``kernel`` (a parallel Numba function whose ``prange`` iterations write
    disjoint data), or on one thread (every small call) its serial twin
    (``_common.serial_twin``: the same code, the same bits), which saves the ~2.6 us launch of a
    parallel region per kernel."""
    serial = _common.serial_twin(kernel)
    one_thread = _common.one_thread

    def run(*args):
        return serial(*args) if one_thread() else kernel(*args)

    return run


def _tables_one_by_one():
    """``parallel_chunksize(1)`` (tables handed out one by one: dynamic scheduling, so a thread
    the OS deschedules does not hold up the others); on one thread (every small call) a no-op
    context instead, since entering numba's costs ~4 us and changes nothing there."""
    return _SERIAL if _common.get_threads() == 1 else parallel_chunksize(1)


@njit(cache=True, inline="always")
def _sort_rows(indices, a, e, E):
    """Positions ``a..e-1`` sorted by row (stable); ``ends[r]`` = end of row ``r``'s run."""
    ends = np.zeros(E, dtype=np.int32)
    for p in range(a, e):
        ends[indices[p]] += 1
    acc = 0
    for r in range(E):
        acc += ends[r]
        ends[r] = acc - ends[r]  # start, becomes the end while filling
    order = np.empty(e - a, dtype=np.int32)
    for p in range(a, e):
        r = indices[p]
        order[ends[r]] = p
        ends[r] += 1
    return order, ends


@njit(cache=True, inline="always")
def _touched_rows(ends, E, n):
    """The touched rows in increasing order, the end of each one's run of lookups (so rows
    ahead can be prefetched) and their count, from the run ends of ``n`` sorted lookups.
    Branch-free: about a third of the rows are touched at random, so a branch per row
    mispredicts often; every row is written and the cursor advances only past touched ones."""
    cap = min(E, n) + 1
    touched = np.empty(cap, dtype=np.int64)
    run_end = np.empty(cap, dtype=np.int64)
    i = 0
    prev = 0
    for r in range(E):
        x = ends[r]
        touched[i] = r
        run_end[i] = x
        i += np.int64(x != prev)
        prev = x
    return touched, run_end, i


@njit(cache=True, inline="always")
def _table_runs(lk, j):
    """Table ``j``'s lookups sorted by row: ``(order, touched rows, run ends, count)``."""
    a, e, E = lk.tables[j, START], lk.tables[j, END], lk.tables[j, ROWS]
    order, ends = _sort_rows(lk.indices, a, e, E)
    touched, run_end, n = _touched_rows(ends, E, e - a)
    return order, touched, run_end, n


@njit(cache=True, parallel=True)
def _count_touched(indices, tables):
    n = tables.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    for j in prange(n):
        a, e, E = tables[j, START], tables[j, END], tables[j, ROWS]
        seen = np.zeros(E, dtype=np.uint8)
        c = 0
        for p in range(a, e):
            r = indices[p]
            if seen[r] == 0:
                seen[r] = 1
                c += 1
        counts[j] = c
    return counts


@njit(cache=True, inline="always")
def _table_grad(lk, j, D, nl):
    """Where table ``j``'s ``nl`` lookups read their output gradient: ``(g, kb, stride, col,
    affine)``. Pooled lookups of bag ``k`` start at ``(k - kb) * stride + col`` in ``g`` when
    ``affine`` (one feature, or the table's columns copied to a contiguous block: its
    features' ``[B, D]`` gradients one after the other), otherwise by the bag's feature."""
    t0, t1, B = lk.tables[j, FIRST_FEATURE], lk.tables[j, END_FEATURE], lk.B
    nb = (t1 - t0) * B
    TD = lk.doff[lk.doff.shape[0] - 1]
    if lk.pooling != NONE and nb * D <= COMPACT_GRAD_MAX and nl >= nb:
        block = np.empty(nb * D, dtype=np.float32)
        for f in range(t0, t1):
            for b in range(B):
                src = np.uint64(b * TD + lk.doff[f])
                dst = np.uint64(((f - t0) * B + b) * D)
                for d in range(D):
                    block[dst + np.uint64(d)] = lk.grad[src + np.uint64(d)]
        return block, t0 * B, D, np.int64(0), True
    return lk.grad, t0 * B, TD, lk.doff[t0], t1 - t0 == 1


@njit(cache=True, inline="always")
def _grad_source(lk, p, D, tg):
    """Where the output gradient of lookup ``p`` starts in ``tg[0]`` (``tg``: ``_table_grad``)."""
    if lk.pooling == NONE:
        return np.uint64(p * D)
    k = lk.bag[p]
    if tg[4]:
        return np.uint64((k - tg[1]) * tg[2] + tg[3])
    t = k // lk.B
    return np.uint64((k - t * lk.B) * lk.doff[lk.doff.shape[0] - 1] + lk.doff[t])


@njit(cache=True, inline="always")
def _row_grad(acc, D, order, s, e, nl, lk, tg):
    """``acc[:D]`` = the summed gradient of one row from its lookups ``order[s:e]`` (of the
    table's ``nl``; ``tg``: ``_table_grad``), prefetching the gradient of the lookup
    ``GRAD_PREFETCH_DISTANCE`` ahead in the sorted order (every lookup's, not only a row's
    first: the gradient rows are scattered)."""
    for d in range(D):
        acc[d] = 0.0
    g = tg[0]
    for q in range(s, e):
        if q + GRAD_PREFETCH_DISTANCE < nl:
            _prefetch_row(g, _grad_source(lk, order[q + GRAD_PREFETCH_DISTANCE], D, tg), D)
        p = order[q]
        src = _grad_source(lk, p, D, tg)
        if lk.pooling == NONE:
            c = np.float32(1.0)
        elif lk.has_psw:
            c = lk.psw[p]
        elif lk.pooling == MEAN:
            k = lk.bag[p]
            c = np.float32(1.0) / np.float32(lk.offsets[k + 1] - lk.offsets[k])
        else:
            c = np.float32(1.0)
        for d in range(D):
            acc[d] += c * g[src + np.uint64(d)]


@njit(cache=True, parallel=True)
def _dense_grad(lk, dense):
    """The dense weight gradient: each touched row's summed gradient into ``dense``
    (zeroed by the caller)."""
    for j in prange(lk.tables.shape[0]):
        D, w0 = lk.tables[j, DIM], lk.tables[j, WEIGHTS_OFFSET]
        order, touched, run_end, n = _table_runs(lk, j)
        acc = np.empty(D, dtype=np.float32)
        nl = order.shape[0]
        tg = _table_grad(lk, j, D, nl)
        for i in range(n):
            _row_grad(acc, D, order, run_end[i - 1] if i > 0 else 0, run_end[i], nl, lk, tg)
            base = w0 + touched[i] * D
            for d in range(D):
                dense[base + d] = acc[d]


@njit(cache=True, parallel=True)
def _sparse_grad(lk, row_start, value_start, lids, values):
    """The row-wise gradient: table ``j``'s touched rows to ``lids[row_start[j]:]`` and
    their summed gradients to ``values[value_start[j]:]``."""
    for j in prange(lk.tables.shape[0]):
        D, h0 = lk.tables[j, DIM], lk.tables[j, FIRST_ROW]
        order, touched, run_end, n = _table_runs(lk, j)
        acc = np.empty(D, dtype=np.float32)
        u = row_start[j]
        vo = value_start[j]
        nl = order.shape[0]
        tg = _table_grad(lk, j, D, nl)
        for i in range(n):
            _row_grad(acc, D, order, run_end[i - 1] if i > 0 else 0, run_end[i], nl, lk, tg)
            lids[u] = h0 + touched[i]
            for d in range(D):
                values[vo + d] = acc[d]
            u += 1
            vo += D


def _make_fused_update(in_place, kind):
    """The optimizer step (``opt``: ``OptimizerArgs``, its kind ``kind``) on every touched row:
    in place on float32 ``w`` (``in_place``); otherwise (float16 weights) table ``j``'s new
    rows, in float32, to ``new[value_start[j]:]`` and their element positions to ``pos``.
    ``in_place`` and ``kind`` are compile-time constants: as a run-time flag ``in_place``'s
    branch in every element's write kept the row loops from vectorising (the row-wise Adagrad
    step was ~25% slower), and a call compiles only its own optimizer's rule. One table's work
    is one ``prange`` iteration."""
    rule = _ROW_RULE[kind]

    @njit(cache=True, parallel=True)
    def kernel(lk, w, lut, m1, m2, opt, value_start, new, pos):
        for j in prange(lk.tables.shape[0]):
            D, w0, h0 = lk.tables[j, DIM], lk.tables[j, WEIGHTS_OFFSET], lk.tables[j, FIRST_ROW]
            order, touched, run_end, n = _table_runs(lk, j)
            acc = np.empty(D, dtype=np.float32)
            part = np.empty(16, dtype=np.float32)
            vo = value_start[j]
            nl = order.shape[0]
            tg = _table_grad(lk, j, D, nl)
            for i in range(min(UPDATE_PREFETCH_FAR, n)):
                _prefetch_row_far(w, w0 + touched[i] * D, D)
            for i in range(n):
                far = i + UPDATE_PREFETCH_FAR
                if far < n:
                    _prefetch_row_far(w, w0 + touched[far] * D, D)
                    if kind == ADAGRAD or kind == ADAM:
                        _prefetch_row_far(m1, w0 + touched[far] * D, D)
                ahead = i + UPDATE_PREFETCH_DISTANCE
                if ahead < n:
                    _prefetch_row(w, w0 + touched[ahead] * D, D)
                    if kind == ADAGRAD or kind == ADAM:
                        _prefetch_row(m1, w0 + touched[ahead] * D, D)
                    elif kind == ROWWISE_ADAGRAD:  # its one accumulator, at the row's linear id
                        _prefetch(m1, np.uint64(h0 + touched[ahead]))
                _row_grad(acc, D, order, run_end[i - 1] if i > 0 else 0, run_end[i], nl, lk, tg)
                r = touched[i]
                rule(acc, D, np.uint64(w0 + np.int64(r) * D), h0 + r, w, lut, m1, m2, opt, in_place, new, pos, vo, part)
                vo += D

    return kernel


# -- fused optimizers: one row rule per kind ---------------------------------------
# A rule reads the row's summed gradient ``g[:D]`` and the row at ``ub`` (element
# offset in ``w``), updates its state and writes each new element with ``_put``.
# A new kind: a code in ``embnum._tbe``, a rule here, an entry in ``_ROW_RULE``.
@njit(cache=True, inline="always")
def _put(w, i, x, in_place, new, pos, k):
    """Write the new element ``i``: in place, or to ``new[k]`` / ``pos[k]`` (float16 weights,
    rounded once by the caller)."""
    if in_place:
        w[i] = x
    else:
        new[k] = x
        pos[k] = i


@intrinsic
def _squares16(typingctx, arr, n):
    """The 16 lane sums ``sum_k arr[16k + j]^2`` (``k < n / 16``, in increasing ``k``; ``n`` a
    multiple of 16) of float32 ``arr``, as a tuple: two 8-lane vector accumulators, each lane
    the same chain of float32 multiply-then-add as a scalar loop (no reassociation, no fused
    multiply-add), so the result is bit for bit the scalar one. LLVM left the scalar version
    unvectorised (it cannot tell the partial-sum array from the gradient array): ~150 cycles
    per D=128 row, most of the row-wise Adagrad update's work."""
    sig = types.UniTuple(types.float32, 16)(arr, n)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        i64 = ir.IntType(64)
        base = cgutils.get_item_pointer(context, builder, aryty, ary, [ir.Constant(i64, 0)], wraparound=False)
        v8 = ir.VectorType(ir.FloatType(), 8)
        acc = [cgutils.alloca_once_value(builder, ir.Constant(v8, [0.0] * 8)) for _ in range(2)]
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), args[1], ir.Constant(i64, 16)) as (d0, _):
            for h in range(2):
                ptr = builder.bitcast(builder.gep(base, [builder.add(d0, ir.Constant(i64, 8 * h))]), v8.as_pointer())
                x = builder.load(ptr, align=4)
                builder.store(builder.fadd(builder.load(acc[h]), builder.fmul(x, x)), acc[h])
        lanes = [
            builder.extract_element(builder.load(a), ir.Constant(ir.IntType(32), j)) for a in acc for j in range(8)
        ]
        return context.make_tuple(builder, signature.return_type, lanes)

    return sig, codegen


@njit(cache=True, inline="always")
def _sum_squares(part, g, D, w, lut, ub, wd, l2):
    """``sum_d (g[d] + l2 * wd * w[d])^2`` in 16 float32 partial sums (lane ``d % 16`` for the
    first ``D - D % 16`` elements, lane ``d - full`` for the rest), then added in lane order."""
    full = D - D % 16
    if l2:
        part[:] = 0.0
        for d0 in range(0, full, 16):
            for j in range(16):
                ge = g[d0 + j] + wd * _load(w, lut, ub + np.uint64(d0 + j))
                part[j] += ge * ge
    else:
        lanes = _squares16(g, np.int64(full))
        for j in range(16):
            part[j] = lanes[j]
    for d in range(full, D):
        ge = g[d] + wd * _load(w, lut, ub + np.uint64(d)) if l2 else g[d]
        part[d - full] += ge * ge
    total = np.float32(0.0)
    for j in range(16):
        total += part[j]
    return total


_step = njit(cache=True, inline="always")  # the element steps and row scalars of embnum._tbe_rows
_sgd_step = _step(_tbe_rows.sgd_step)
_adagrad_step = _step(_tbe_rows.adagrad_step)
_rowwise_adagrad_row_scalars = _step(_tbe_rows.rowwise_adagrad_row)
_rowwise_adagrad_step = _step(_tbe_rows.rowwise_adagrad_step)
_adam_step = _step(_tbe_rows.adam_step)


@njit(cache=True, inline="always")
def _sgd_row(g, D, ub, lid, w, lut, m1, m2, opt, in_place, new, pos, vo, part):
    for d in range(D):
        i = ub + np.uint64(d)
        _put(w, i, _sgd_step(_load(w, lut, i), g[d], opt.lr), in_place, new, pos, vo + d)


@njit(cache=True, inline="always")
def _adagrad_row(g, D, ub, lid, w, lut, m1, m2, opt, in_place, new, pos, vo, part):
    for d in range(D):
        i = ub + np.uint64(d)
        x, m1[i] = _adagrad_step(_load(w, lut, i), g[d], m1[i], opt.lr, opt.eps)
        _put(w, i, x, in_place, new, pos, vo + d)


@njit(cache=True, inline="always")
def _rowwise_adagrad_row(g, D, ub, lid, w, lut, m1, m2, opt, in_place, new, pos, vo, part):
    """One accumulator per row (``m1[lid]``): the mean squared (L2-decayed) gradient."""
    ssq = _sum_squares(part, g, D, w, lut, ub, opt.wd, opt.decay == DECAY_L2)
    m1[lid], corr, mult = _rowwise_adagrad_row_scalars(m1[lid], ssq, D, opt.lr, opt.eps, opt.wd, opt.decay)
    for d in range(D):
        i = ub + np.uint64(d)
        _put(w, i, _rowwise_adagrad_step(_load(w, lut, i), g[d], corr, mult), in_place, new, pos, vo + d)


@njit(cache=True, inline="always")
def _adam_row(g, D, ub, lid, w, lut, m1, m2, opt, in_place, new, pos, vo, part):
    for d in range(D):
        i = ub + np.uint64(d)
        x, m1[i], m2[i] = _adam_step(
            _load(w, lut, i), g[d], m1[i], m2[i], opt.lr, opt.eps, opt.wd, opt.beta1, opt.beta2, opt.bc1, opt.bc2
        )
        _put(w, i, x, in_place, new, pos, vo + d)


# Each kind's row rule (the same parameters for all), chosen in Python by the kernel factories: a
# rule picked inside the kernel by a constant ``kind`` compiled all four (Numba does not prune an
# inlined callee's branches on its constant argument: +0.4 s per kernel on a cold cache).
_ROW_RULE = {SGD: _sgd_row, ADAGRAD: _adagrad_row, ROWWISE_ADAGRAD: _rowwise_adagrad_row, ADAM: _adam_row}
_FUSED_UPDATE = {(p, k): _make_fused_update(p, k) for p in (True, False) for k in _ROW_RULE}


# -- entry points --------------------------------------------------------------------
def _prepare(grad_output, lookup: dict, max_gradient=None) -> Lookups:
    a = LookupArgs(**lookup)
    idx, offs = _checked(a.indices, a.offsets)
    g = np.ascontiguousarray(clipped_gradient(np, grad_output, max_gradient), dtype=np.float32)
    return Lookups(
        indices=idx,
        offsets=offs,
        bag=_BAG_OF_POSITION(offs, offs.shape[0] - 1, idx.shape[0]),
        B=int(a.B),
        doff=a.D_offsets,
        pooling=int(a.pooling),
        grad=g.reshape(-1),
        psw=_psw(a),
        has_psw=a.has_psw,
        tables=_tables(a.hash_size_cumsum, a.weights_offsets, a.D_offsets, a.rows, offs, a.B),
    )


def _starts(lk):
    """Where each table's touched rows start (``row_start``, ``[n+1]``) and where their
    values start (``value_start``: rows times the table's dim, summed)."""
    with _tables_one_by_one():
        counts = _COUNT_TOUCHED(lk.indices, lk.tables)
    return _starts_of(counts, lk.tables)


@njit(cache=True)
def _starts_of(counts, tables):
    """``_starts``' two prefix sums in one compiled call (with NumPy: ~7 us of a small call's
    host work). int64 throughout, as NumPy summed them."""
    n = counts.shape[0]
    row_start = np.zeros(n + 1, dtype=np.int64)
    value_start = np.zeros(n + 1, dtype=np.int64)
    for j in range(n):
        row_start[j + 1] = row_start[j] + counts[j]
        value_start[j + 1] = value_start[j] + counts[j] * tables[j, DIM]
    return row_start, value_start


@njit(cache=True)
def _value_offsets(row_start, tables):
    """``value_offsets`` ``[U+1]`` of the sparse gradient: 0, then each touched row's end (table
    ``j``'s rows ``row_start[j]:row_start[j+1]`` are ``tables[j, DIM]`` values long). Compiled:
    NumPy's repeat + cumsum cost ~6 us of a small call."""
    n = tables.shape[0]
    out = np.empty(row_start[n] + 1, dtype=np.int64)
    out[0] = 0
    for j in range(n):
        D = tables[j, DIM]
        for u in range(row_start[j], row_start[j + 1]):
            out[u + 1] = out[u] + D
    return out


@vbe.backward
@_one_thread_when_small
def tbe_backward(grad_output, weights, out, **lookup):
    if _small(lookup):
        a = LookupArgs(**lookup)
        _dense_grad_small(a.weights_offsets, *_small_grad_args(grad_output, a), out)
        return
    lk = _prepare(grad_output, lookup)
    _ZERO(out)
    with _tables_one_by_one():
        _DENSE_GRAD(lk, out)


def _small_grad_args(grad_output, a):
    """The leading arguments of the small backward kernels: ``(indices, offsets, B, D_offsets,
    pooling, flat float32 gradient, per-sample weights, has_psw)``."""
    idx, offs = _checked(a.indices, a.offsets)
    g = np.ascontiguousarray(grad_output, dtype=np.float32).reshape(-1)
    return idx, offs, int(a.B), a.D_offsets, int(a.pooling), g, _psw(a), a.has_psw


@njit(cache=True, inline="always")
def _source_and_scale(pooling, has_psw, psw, p, s, e, b, D, TD, c0):
    """``(start, coefficient)``: where lookup ``p`` (of bag ``b``, positions ``s..e-1``, of a feature
    whose output columns start at ``c0``; ``TD`` the output's width) finds its output gradient in
    the flat gradient, and what it is scaled by (as :func:`_row_grad` scales it)."""
    if pooling == NONE:
        return np.uint64(p * D), np.float32(1.0)
    src = np.uint64(b * TD + c0)
    if has_psw:
        return src, psw[p]
    if pooling == MEAN:
        return src, np.float32(1.0) / np.float32(e - s)
    return src, np.float32(1.0)


@njit(cache=True, nogil=True)
def _dense_grad_small(woff, indices, offsets, B, doff, pooling, grad, psw, has_psw, dense):
    """``tbe_backward`` of a small call (one thread) in plain loops: ``dense`` (float32, the
    weights' length) zeroed, then every lookup's output gradient, times its coefficient (its
    per-sample weight, one over its bag's length for ``mean``), added to its row in position
    order: :func:`_dense_grad`'s sums in its order (each touched row's lookups by position, from
    zero), so the same bits, without the sort by row, the per-table records or a parallel region
    to compile (0.3 s cold against 3 s)."""
    for i in range(dense.shape[0]):
        dense[i] = 0.0
    TD = doff[doff.shape[0] - 1]
    for t in range(woff.shape[0]):
        D, w0 = doff[t + 1] - doff[t], woff[t]
        for b in range(B):
            s, e = offsets[t * B + b], offsets[t * B + b + 1]
            for p in range(s, e):
                src, c = _source_and_scale(pooling, has_psw, psw, p, s, e, b, D, TD, doff[t])
                row = np.uint64(w0 + np.int64(indices[p]) * D)
                for d in range(D):
                    dense[row + np.uint64(d)] += c * grad[src + np.uint64(d)]


@njit(cache=True, parallel=True)
def _zero(a):
    for i in prange(a.shape[0]):
        a[i] = 0.0


@vbe.backward
@_one_thread_when_small
def tbe_backward_sparse(grad_output, weights, max_rows=None, **lookup):
    if _small(lookup):
        out = _sparse_small(grad_output, LookupArgs(**lookup))
    else:
        lk = _prepare(grad_output, lookup)
        row_start, value_start = _starts(lk)
        lids = np.empty(int(row_start[-1]), dtype=np.int64)
        values = np.empty(int(value_start[-1]), dtype=np.float32)
        with _tables_one_by_one():
            _SPARSE_GRAD(lk, row_start, value_start, lids, values)
        out = TBESparseGrad(lids, values, _value_offsets(row_start, lk.tables))
    return out if max_rows is None else pad_sparse(out, max_rows, int(np.diff(lookup["D_offsets"]).max()))


def _sparse_small(grad_output, a, with_bases=False):
    """``tbe_backward_sparse`` of a small call (one thread): the touched linear ids (``hash_size_cumsum``
    of the feature plus the row) and each lookup's slot among them from NumPy's ``unique``, then
    :func:`_sparse_grad_small` sums the gradients into the slots: no sort by row or parallel region
    to compile (0.3 s cold against 3 s)."""
    args = _small_grad_args(grad_output, a)
    idx, offs, B = args[:3]
    T = a.weights_offsets.shape[0]
    starts = offs[np.arange(T + 1) * B].astype(np.int64)  # each feature's first position, then the end
    feature = np.repeat(np.arange(T), np.diff(starts))
    ids = idx[starts[0] : starts[T]]  # the lookups in bags, in position order
    lids, slot = np.unique(a.hash_size_cumsum[feature] + ids, return_inverse=True)
    dims = np.diff(a.D_offsets)[feature]  # each lookup's dim
    row_dims = np.zeros(lids.shape[0], np.int64)
    row_dims[slot] = dims  # every lookup of a row has its table's dim
    value_offsets = np.zeros(lids.shape[0] + 1, np.int64)
    np.cumsum(row_dims, out=value_offsets[1:])
    values = np.zeros(int(value_offsets[-1]), np.float32)
    _sparse_grad_small(*args, slot.reshape(-1).astype(np.int64, copy=False), value_offsets, values)
    out = TBESparseGrad(lids.astype(np.int64, copy=False), values, value_offsets)
    if not with_bases:
        return out
    row_base = np.zeros(lids.shape[0], np.int64)  # each touched row's first element in the weights
    row_base[slot] = a.weights_offsets[feature] + ids * dims
    return out, row_base


@njit(cache=True, nogil=True)
def _sparse_grad_small(indices, offsets, B, doff, pooling, grad, psw, has_psw, slot, value_offsets, values):
    """Every lookup's output gradient, times its coefficient (as :func:`_dense_grad_small`), added
    to its row's values (``values[value_offsets[slot[q]]:]``, zeroed by the caller; ``q`` the
    lookup's place from ``offsets[0]``) in position order: :func:`_sparse_grad`'s sums in its
    order, so the same bits."""
    TD = doff[doff.shape[0] - 1]
    first = offsets[0]
    for t in range(doff.shape[0] - 1):
        D = doff[t + 1] - doff[t]
        for b in range(B):
            s, e = offsets[t * B + b], offsets[t * B + b + 1]
            for p in range(s, e):
                src, c = _source_and_scale(pooling, has_psw, psw, p, s, e, b, D, TD, doff[t])
                v = np.uint64(value_offsets[slot[p - first]])
                for d in range(D):
                    values[v + np.uint64(d)] += c * grad[src + np.uint64(d)]


@njit(cache=True, parallel=True)
def _grad_psw(w, lut, woff, doff, indices, offsets, B, g, out):
    T = woff.shape[0]
    for p in prange(offsets[0]):
        out[p] = 0.0
    for k in prange(T * B):
        t = k // B
        b = k - t * B
        D = doff[t + 1] - doff[t]
        c0 = doff[t]
        for p in range(offsets[k], offsets[k + 1]):
            base = woff[t] + np.int64(indices[p]) * D
            acc = np.float32(0.0)
            for d in range(D):
                acc += g[b, c0 + d] * _load(w, lut, base + d)
            out[p] = acc


@vbe.backward
@_one_thread_when_small
def tbe_grad_per_sample_weights(grad_output, weights, out, **lookup):
    a = LookupArgs(**lookup)
    idx, offs = _checked(a.indices, a.offsets)
    w, lut = _weights(weights)
    g = np.ascontiguousarray(grad_output, dtype=np.float32)
    _GRAD_PSW(w, lut, a.weights_offsets, a.D_offsets, idx, offs, a.B, g, out)


@vbe.backward
@_one_thread_when_small
def tbe_backward_update(grad_output, weights, optimizer, momentum1, momentum2, step, **lookup):
    if uses_row_rule(optimizer):
        return _update_rows(grad_output, weights, lookup, optimizer, momentum1, momentum2, step)
    opt = optimizer.kernel_args(step)
    m1 = _NO_F32 if momentum1 is None else momentum1
    m2 = _NO_F32 if momentum2 is None else momentum2
    if _small(lookup):
        g = clipped_gradient(np, grad_output, optimizer.float32()["max_gradient"])
        return _update_small(g, weights, LookupArgs(**lookup), opt, m1, m2)
    lk = _prepare(grad_output, lookup, optimizer.float32()["max_gradient"])
    if weights.dtype == np.float32:
        no_starts = np.zeros(lk.tables.shape[0] + 1, np.int64)
        with _tables_one_by_one():
            _FUSED_UPDATE[True, opt.kind](lk, weights, _NO_LUT, m1, m2, opt, no_starts, _NO_F32, _NO_I64)
        return
    # float16: new rows in float32, then one rounding to float16 by NumPy
    _, value_start = _starts(lk)
    new = np.empty(int(value_start[-1]), dtype=np.float32)
    pos = np.empty(new.shape[0], dtype=np.int64)
    w, lut = _weights(weights)
    with _tables_one_by_one():
        _FUSED_UPDATE[False, opt.kind](lk, w, lut, m1, m2, opt, value_start, new, pos)
    with np.errstate(over="ignore"):
        weights[pos] = new.astype(np.float16)


def _update_small(grad, weights, a, opt, m1, m2):
    """The fused update of a small call (one thread): the touched rows' summed gradients as
    :func:`_sparse_small` makes them, then the kind's rule (``_ROW_RULE``) on each row in increasing linear
    id, as the fused kernel applies it to the same sums: the same bits, with no parallel region
    to compile."""
    sparse, row_base = _sparse_small(grad, a, with_bases=True)
    w, lut = _weights(weights)
    in_place = weights.dtype == np.float32
    n = 0 if in_place else sparse.values.shape[0]
    new, pos = np.empty(n, np.float32), np.empty(n, np.int64)
    args = (sparse.linear_ids, sparse.values, sparse.value_offsets, row_base, w, lut, m1, m2, opt, new, pos)
    _UPDATE_SMALL[in_place, opt.kind](*args, np.empty(16, np.float32))
    if not in_place:
        with np.errstate(over="ignore"):
            weights[pos] = new.astype(np.float16)


def _make_update_small(in_place, kind):
    """The serial loop of :func:`_update_small` for ``kind``'s rule (``in_place`` and ``kind``
    compile-time constants, as in the fused kernel)."""
    rule = _ROW_RULE[kind]

    @njit(cache=True, nogil=True)
    def kernel(lids, values, voff, row_base, w, lut, m1, m2, opt, new, pos, part):
        for u in range(lids.shape[0]):
            vo = voff[u]
            D = voff[u + 1] - vo
            rule(
                values[vo : vo + D],
                D,
                np.uint64(row_base[u]),
                lids[u],
                w,
                lut,
                m1,
                m2,
                opt,
                in_place,
                new,
                pos,
                vo,
                part,
            )

    return kernel


_UPDATE_SMALL = {(p, k): _make_update_small(p, k) for p in (True, False) for k in _ROW_RULE}


# -- the other optimizers and max_norm: sparse gradient, then the shared row rule ----------
_rule = _tbe_rows.make_update_row(njit(inline="always", error_model="numpy"))


@njit(cache=True, parallel=True, error_model="numpy")
def _apply_rows(kind, decay, rows, rstart, g, voff, elem, lids, m1, m2, hp):
    for u in prange(lids.shape[0]):
        go = voff[u]
        _rule(kind, decay, rows, rstart[u], g, go, voff[u + 1] - go, m1, m2, elem[u], lids[u], hp)


def _update_rows(grad_output, weights, lookup, optimizer, momentum1, momentum2, step):
    """``tbe_backward_update`` for the kinds without a fused kernel here (LAMB, partial
    row-wise Adam/LAMB, LARS-SGD) and for ``max_norm``: the summed gradient of the touched
    rows (``tbe_backward_sparse``), then :func:`embnum._tbe_rows.update_rows`: the shared
    rule on the rows in parallel, in place on float32 weights."""
    g = clipped_gradient(np, grad_output, optimizer.float32()["max_gradient"])
    sparse = tbe_backward_sparse(g, weights, **lookup)
    a = LookupArgs(**lookup)
    layout = (a.weights_offsets, a.D_offsets, a.hash_size_cumsum)
    _tbe_rows.update_rows(np, _apply_rows, weights, layout, sparse, optimizer, momentum1, momentum2, step)


# the backward kernels' serial twins for small calls (``_one_or_all``)
_BAG_OF_POSITION = _one_or_all(_bag_of_position)
_COUNT_TOUCHED = _one_or_all(_count_touched)
_ZERO = _one_or_all(_zero)
# The gradient walks have no twin: compiled serially they keep the Lookups fields' reference
# counts in the inner loops and do not unroll (5-23x slower than the parallel kernel on one thread).
_DENSE_GRAD = _dense_grad
_SPARSE_GRAD = _sparse_grad
_GRAD_PSW = _one_or_all(_grad_psw)
