"""Numba host kernels of the keyed_tensor family.

Every permute is planned on the host as a short table of row segments with
byte addresses (:mod:`embnum._permute_plan`), so that inputs and outputs of
any number, shape and stride are reached without concatenating anything and
with one compiled kernel per direction:

* forward: for each block of batch rows, each segment is one ``memcpy`` per
  row (or a zero fill for output columns no row covers);
* backward: each elementary input slot (a key, for ``kt_regroup_arguments``
  rows) is written once per row: the first contribution is ``0 + g`` and the
  later ones (the duplicates, in permutes row order) are added in the value
  dtype while the row segment is in L1, so no gradient array is read back
  from memory and the result is the same on every run.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _permute_plan as plan
from .._jit import njit
from . import _common
from ._common import float_to_half_bits, half_bits_to_float

ROWS_PER_TASK = 32  # batch rows per parallel task


@intrinsic
def _memcpy(typingctx, dst, src, nbytes):
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        d, s, n = args
        cgutils.raw_memcpy(builder, builder.inttoptr(d, i8p), builder.inttoptr(s, i8p), n, 1)

    return sig, codegen


@intrinsic
def _memzero(typingctx, dst, nbytes):
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        d, n = args
        cgutils.memset(builder, builder.inttoptr(d, i8p), n, 0)

    return sig, codegen


@intrinsic
def _at(typingctx, addr, like):
    """``addr`` as a pointer to elements of ``like``'s dtype (indexable)."""
    ptr = types.CPointer(like.dtype)
    sig = ptr(types.int64, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return sig, codegen


# -- forward: segment copies -------------------------------------------------------
@njit(cache=True, parallel=True)
def _copy(segs, B):
    """segs ``[S, 5]``: (src address or 0 for zeros, src row stride, dst address, dst row
    stride, bytes); row ``b`` of segment ``s`` goes from ``src + b*src_stride`` to
    ``dst + b*dst_stride``."""
    S = segs.shape[0]
    for task in prange((B + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        b0 = np.int64(task) * ROWS_PER_TASK
        b1 = min(B, b0 + ROWS_PER_TASK)
        for b in range(b0, b1):
            for s in range(S):
                src, ss, dst, ds, nb = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3], segs[s, 4]
                if src == 0:
                    _memzero(dst + b * ds, nb)
                else:
                    _memcpy(dst + b * ds, src + b * ss, nb)


def _run_copy(segs, B, nbytes):
    """The parallel copy, on one thread below the registry's default threshold (``nbytes``: the
    bytes read and written): these ops are at 0 in ``SERIAL_BYTES_OF`` because their small calls
    take the serial kernels, which need no thread switch; the rest keep the registry's rule here."""
    if B and segs.shape[0]:
        _parallel_when_big(_copy, nbytes, segs, B)


def _parallel_when_big(kernel, nbytes, *args):
    limit = _common.SERIAL_OVERRIDE
    if nbytes < (_common.SERIAL_BYTES if limit is None else limit):
        return _common.on_one_thread(kernel, *args)
    return kernel(*args)


# -- small calls: no addresses, no plan arrays per call, one thread ---------------------
# Below SMALL_BYTES (bytes of the inputs) a call's cost is its Python: the addressed plan
# (``copy_segments``: an ``__array_interface__`` read per array, ~1.4 us each, and a
# handful of NumPy temporaries) and a parallel region cost more than the copies. These
# kernels take the arrays themselves (a tuple of C-contiguous arrays of one type: one
# Numba argument, ~0.1 us per array) and the cached indexed plan, and run serially.
SMALL_BYTES = 1 << 16


def _bytes(arrays) -> int:
    return sum(a.nbytes for a in arrays)


def _small(arrays) -> bool:
    """Whether ``arrays`` (a list of 2-D arrays of one dtype) take the small kernels: aligned
    C-contiguous NumPy arrays, all read-only or all writable, not float16 (Numba has no float16
    host type), fewer than SMALL_BYTES in all."""
    total = 0
    first = arrays[0].flags
    for a in arrays:  # one Numba type for the tuple: C-contiguous, and read-only / aligned alike
        if type(a) is not np.ndarray:
            return False
        f = a.flags
        if not f.c_contiguous or f.writeable != first.writeable or not f.aligned:
            return False
        total += a.nbytes
    return total < SMALL_BYTES and arrays[0].dtype != np.float16


@njit(cache=True)
def _copy_small(ins, outs, segs, B):
    """segs ``[S, 5]`` indexed (``_permute_plan.copy_indexed``: src array or -1 for zeros, src
    col, dst array, dst col, n): ``outs[j][b, c:c+n] = ins[i][b, a:a+n]`` for every row."""
    for b in range(B):
        for s in range(segs.shape[0]):
            i, a, j, c, n = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3], segs[s, 4]
            d = outs[j]
            if i < 0:
                for x in range(n):
                    d[b, c + x] = 0
            else:
                src = ins[i]
                for x in range(n):
                    d[b, c + x] = src[b, a + x]


@njit(cache=True)
def _pooled_small(src, dst, offs, perm, inv_offs):
    """``permute_pooled_embs`` straight from its validated lists (every output column is
    written: the groups tile ``[0, D)``)."""
    for b in range(src.shape[0]):
        for t in range(perm.shape[0]):
            p = perm[t]
            a, c = offs[p], inv_offs[t]
            for x in range(offs[p + 1] - a):
                dst[b, c + x] = src[b, a + x]


def _forward(inputs, permutes, out):
    if _small(inputs):
        segs = plan.forward_segments(permutes, [o.shape[1] for o in out])
        if inputs[0].shape[0] and segs.shape[0]:
            _copy_small(tuple(inputs), tuple(out), segs, inputs[0].shape[0])
        return
    keep = []  # strided inputs' contiguous copies live here until the kernel is done
    rows = plan.host_rows(permutes)
    _run_copy(
        plan.copy_segments(plan.forward_indexed(rows, [o.shape[1] for o in out]), inputs, out, keep),
        inputs[0].shape[0],
        _bytes(inputs) + _bytes(out),
    )


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list, out):
    if (
        type(offset_dim_list) is np.ndarray
        and pooled_embs.nbytes < SMALL_BYTES
        and pooled_embs.dtype != np.float16
        and pooled_embs.flags.aligned
    ):
        _pooled_small(pooled_embs, out, offset_dim_list, permute_list, inv_offset_dim_list)
        return
    segs = plan.pooled_indexed(offset_dim_list, permute_list, inv_offset_dim_list, out.shape[1])
    keep = []
    _run_copy(plan.copy_segments(segs, [pooled_embs], [out], keep), pooled_embs.shape[0], 2 * pooled_embs.nbytes)


def permute_multi_embedding(pooled_embs, permutes, in_shapes, out_shapes, out_lengths, out):
    _forward(pooled_embs, permutes, out)


def regroup_keyed_tensor(pooled_embs, keys, lengths, groups, out):
    if _small(pooled_embs):
        segs = plan.regroup_segments(keys, lengths, groups)
        if pooled_embs[0].shape[0] and segs.shape[0]:
            _copy_small(tuple(pooled_embs), tuple(out), segs, pooled_embs[0].shape[0])
        return
    keep = []
    rows = plan.regroup_rows(keys, lengths, groups)
    _run_copy(
        plan.copy_segments(plan.forward_indexed(rows, [o.shape[1] for o in out]), pooled_embs, out, keep),
        pooled_embs[0].shape[0],
        _bytes(pooled_embs) + _bytes(out),
    )


def kt_regroup_arguments(embs, keys, lengths, groups):
    return plan.regroup_arguments(keys, lengths, groups)


# -- backward: one write per gradient element --------------------------------------
@njit(cache=True, parallel=True)
def _accumulate(slots, srcs, B, like):
    """slots ``[E, 5]``: (dst address, dst row stride, elements, first source, end source);
    srcs ``[K, 2]``: (address, row stride). ``dst = 0 + src_first + ... + src_last`` in the
    dtype of ``like`` (a zero array of one element), added left to right. Row by row, slots
    in destination order, so each gradient row is written front to back."""
    zero = like[0]
    for task in prange((B + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        b0 = np.int64(task) * ROWS_PER_TASK
        b1 = min(B, b0 + ROWS_PER_TASK)
        for b in range(b0, b1):
            for e in range(slots.shape[0]):
                dst0, ds, n, k0, k1 = slots[e, 0], slots[e, 1], slots[e, 2], slots[e, 3], slots[e, 4]
                d = _at(dst0 + b * ds, like)
                if k0 == k1:
                    for x in range(n):
                        d[x] = zero
                    continue
                s = _at(srcs[k0, 0] + b * srcs[k0, 1], like)
                for x in range(n):
                    d[x] = zero + s[x]
                for k in range(k0 + 1, k1):
                    s = _at(srcs[k, 0] + b * srcs[k, 1], like)
                    for x in range(n):
                        d[x] += s[x]


@njit(cache=True, parallel=True)
def _accumulate_half(slots, srcs, B, like):
    """:func:`_accumulate` for float16 carried as uint16: every addition is exact in
    float64 and rounded once to float16 (as NumPy's float16 addition)."""
    for task in prange((B + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        b0 = np.int64(task) * ROWS_PER_TASK
        b1 = min(B, b0 + ROWS_PER_TASK)
        for e in range(slots.shape[0]):
            dst0, ds, n, k0, k1 = slots[e, 0], slots[e, 1], slots[e, 2], slots[e, 3], slots[e, 4]
            for b in range(b0, b1):
                d = _at(dst0 + b * ds, like)
                for x in range(n):
                    acc = np.uint16(0)
                    for k in range(k0, k1):
                        s = _at(srcs[k, 0] + b * srcs[k, 1], like)
                        acc = np.uint16(float_to_half_bits(half_bits_to_float(acc) + half_bits_to_float(s[x])))
                    d[x] = acc


@njit(cache=True)
def _accumulate_small(grads, outs, slots, srcs, B, like):
    """:func:`_accumulate` on the arrays themselves (a tuple each), serially, from the indexed
    plan (``_permute_plan.backward_indexed``: slots ``[E, 5]`` (gradient array, col, n, first
    source, end source), srcs ``[K, 2]`` (grad_outputs array, col)); the same additions in the
    same order, so the same bits. ``like``: a zero of the dtype (one element)."""
    zero = like[0]
    for b in range(B):
        for e in range(slots.shape[0]):
            i, x0, n, k0, k1 = slots[e, 0], slots[e, 1], slots[e, 2], slots[e, 3], slots[e, 4]
            d = outs[i]
            if k0 == k1:
                for x in range(n):
                    d[b, x0 + x] = zero
                continue
            g, c = grads[srcs[k0, 0]], srcs[k0, 1]
            for x in range(n):
                d[b, x0 + x] = zero + g[b, c + x]
            for k in range(k0 + 1, k1):
                g, c = grads[srcs[k, 0]], srcs[k, 1]
                for x in range(n):
                    d[b, x0 + x] += g[b, c + x]


_ZERO = {np.dtype(t).char: np.zeros(1, t) for t in (np.float32, np.float64)}  # read only: never written


def permute_multi_embedding_backward(grad_outputs, permutes, in_shapes, out_shapes, in_lengths, out):
    B = grad_outputs[0].shape[0]
    if out and _small(grad_outputs):
        slots, srcs = plan.backward_plan(permutes, in_lengths)
        if B and slots.shape[0]:
            _accumulate_small(tuple(grad_outputs), tuple(out), slots, srcs, B, _ZERO[out[0].dtype.char])
        return
    keep = []
    slots, srcs = plan.backward_slots(grad_outputs, plan.host_rows(permutes), out, keep)
    if B == 0 or slots.shape[0] == 0:
        return
    dtype = out[0].dtype
    n = _bytes(grad_outputs) + _bytes(out)
    if dtype == np.float16:
        _parallel_when_big(_accumulate_half, n, slots, srcs, B, np.zeros(1, np.uint16))
    else:
        _parallel_when_big(_accumulate, n, slots, srcs, B, np.zeros(1, dtype))
