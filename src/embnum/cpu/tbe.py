"""Numba host kernels of the TBE family (``docs/families/tbe.md``).

Forward: parallel over blocks of bags of one feature; each bag is pooled into a
float32 register block and written once. float16 weights are widened through a
65536-entry lookup table (exact; Numba has no float16 arithmetic on the CPU).

Backward and the fused optimizers: per physical table, a counting sort of the
lookups by row (ids are bounded by the table's rows, so no comparison sort),
then one pass over the rows in increasing order that sums each touched row's
gradient in a fixed order (increasing position) and writes or updates the row
once. No atomics; results do not depend on the thread count.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._tbe import DECAY_CODES, KIND_CODES, TBESparseGrad

SUM, MEAN, NONE = 0, 1, 2
BAGS_PER_JOB = 64
PREFETCH_DISTANCE = 8  # forward: lookups ahead (the rows are random in a buffer far larger than the caches)
UPDATE_PREFETCH_DISTANCE = 4  # fused update: touched rows ahead
_F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
_NO_LUT = np.zeros(1, dtype=np.float32)
_NO_F32 = np.zeros(1, dtype=np.float32)


def _load(w, lut, i):
    """``weights[i]`` as float32 (float16 weights arrive as their uint16 bits)."""


@overload(_load, inline="always")
def _load_impl(w, lut, i):
    if isinstance(w, types.Array) and w.dtype == types.uint16:
        return lambda w, lut, i: lut[w[i]]
    return lambda w, lut, i: w[i]


@intrinsic
def _prefetch(typingctx, arr, i):
    """Hint the CPU to fetch ``arr[i]``'s cache line (LLVM ``llvm.prefetch``, read, high locality)."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        i32 = ir.IntType(32)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


def _per_line(w):
    """Elements of ``w`` per 64-byte cache line (a compile-time constant)."""


@overload(_per_line, inline="always")
def _per_line_impl(w):
    n = 512 // w.dtype.bitwidth
    return lambda w: n


@njit(cache=True, inline="always")
def _prefetch_row(w, base, n):
    """Prefetch the cache lines of ``w[base : base + n]``."""
    ub = np.uint64(base)
    for c in range(0, n, _per_line(w)):
        _prefetch(w, ub + np.uint64(c))


def _weights(weights):
    w = np.ascontiguousarray(weights)
    return (w.view(np.uint16), _F16_LUT) if w.dtype == np.float16 else (w, _NO_LUT)


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


def _make_forward_pooled(DC):
    """The pooled forward for features of one embedding dim: ``DC`` (a constant the
    compiler unrolls and vectorises the row loops for) or, when ``DC == 0``, the dim
    read from ``D_offsets`` per feature."""

    @njit(cache=True, parallel=True, nogil=True)
    def kernel(w, lut, woff, doff, feats, indices, offsets, B, mean, psw, has_psw, out):
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
            for q in range(ps, min(ps + PREFETCH_DISTANCE, pend)):
                _prefetch_row(w, w0 + np.int64(indices[q]) * D, D)
            for b in range(b0, b1):
                s = offsets[t * B + b]
                e = offsets[t * B + b + 1]
                for d in range(D):
                    acc[d] = 0.0
                for p in range(s, e):
                    q = p + PREFETCH_DISTANCE
                    if q < pend:
                        _prefetch_row(w, w0 + np.int64(indices[q]) * D, D)
                    if has_psw:
                        _add_scaled_row(acc, w, lut, w0 + np.int64(indices[p]) * D, D, psw[p])
                    else:
                        _add_row(acc, w, lut, w0 + np.int64(indices[p]) * D, D)
                o = np.uint64(b * OC + c0)
                if mean and e > s:
                    L = np.float32(e - s)
                    for d in range(D):
                        flat[o + np.uint64(d)] = acc[d] / L
                else:
                    for d in range(D):
                        flat[o + np.uint64(d)] = acc[d]

    return kernel


# dims with their own compiled forward (the common recsys dims); others share the generic one
SPECIALISED_DIMS = (32, 64, 128, 256)
_FORWARD_POOLED = {D: _make_forward_pooled(D) for D in SPECIALISED_DIMS + (0,)}


def _forward_pooled(w, lut, woff, doff, indices, offsets, B, mean, psw, has_psw, out):
    dims = np.diff(doff)
    generic = np.array([t for t, D in enumerate(dims.tolist()) if D not in SPECIALISED_DIMS], dtype=np.int64)
    groups = [(D, np.flatnonzero(dims == D)) for D in SPECIALISED_DIMS if (dims == D).any()] + [(0, generic)]
    for key, feats in groups:
        if feats.shape[0]:
            _FORWARD_POOLED[key](
                w, lut, woff, doff, feats.astype(np.int64), indices, offsets, B, mean, psw, has_psw, out
            )


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
                out[p, d] = _load(w, lut, base + d)


def tbe_forward(
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
    output_dtype,
    out,
):
    idx, offs = _checked(indices, offsets)
    w, lut = _weights(weights)
    target = out if out.dtype == np.float32 else np.empty(out.shape, np.float32)
    if pooling == NONE:
        _forward_none(w, lut, weights_offsets, D_offsets, idx, offs, B, target)
    else:
        has_psw = per_sample_weights is not None
        psw = np.ascontiguousarray(per_sample_weights) if has_psw else _NO_F32
        _forward_pooled(w, lut, weights_offsets, D_offsets, idx, offs, B, pooling == MEAN, psw, has_psw, target)
    if target is not out:
        with np.errstate(over="ignore"):
            out[...] = target


# -- backward: counting sort per table, one pass over touched rows ---------------
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


def _tables(hash_size_cumsum, weights_offsets, D_offsets, rows, offsets, B):
    """One row per physical table: ``[first feature, index range start, end, rows, D, weights offset, hcs]``."""
    T = weights_offsets.shape[0]
    out = []
    for t in range(T):
        if t and hash_size_cumsum[t] == hash_size_cumsum[t - 1]:
            out[-1][2] = int(offsets[(t + 1) * B])
            continue
        out.append(
            [
                t,
                int(offsets[t * B]),
                int(offsets[(t + 1) * B]),
                int(rows[t]),
                int(D_offsets[t + 1] - D_offsets[t]),
                int(weights_offsets[t]),
                int(hash_size_cumsum[t]),
            ]
        )
    return np.array(out, dtype=np.int64).reshape(-1, 7)


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


@njit(cache=True, parallel=True)
def _count_touched(indices, tables):
    n = tables.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    for j in prange(n):
        a, e, E = tables[j, 1], tables[j, 2], tables[j, 3]
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
def _row_grad(acc, D, order, s, e, bag, offsets, B, doff, pooling, g, psw, has_psw):
    """``acc[:D]`` = the summed gradient of one row from its lookups ``order[s:e]``
    (``g``: the output gradient flattened)."""
    for d in range(D):
        acc[d] = 0.0
    TD = doff[doff.shape[0] - 1]
    for q in range(s, e):
        p = order[q]
        if pooling == 2:
            src = np.uint64(p * D)
            c = np.float32(1.0)
        else:
            k = bag[p]
            t = k // B
            src = np.uint64((k - t * B) * TD + doff[t])
            if has_psw:
                c = psw[p]
            elif pooling == 1:
                c = np.float32(1.0) / np.float32(offsets[k + 1] - offsets[k])
            else:
                c = np.float32(1.0)
        for d in range(D):
            acc[d] += c * g[src + np.uint64(d)]


@njit(cache=True, parallel=True)
def _grouped(
    action,
    indices,
    offsets,
    bag,
    B,
    doff,
    pooling,
    g,
    psw,
    has_psw,
    tables,
    row_start,
    dense,
    lids,
    values,
    positions,
    w,
    lut,
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
    in_place,
):
    """One pass over the touched rows of every table. ``action``: 0 sparse gradient
    (``lids``/``values``), 1 dense gradient (``dense``), 2 optimizer step (in place
    on float32 ``w``; float16 weights: new rows to ``values`` and their element
    positions to ``positions``)."""
    for j in prange(tables.shape[0]):
        a, e, E, D, w0, h0 = tables[j, 1], tables[j, 2], tables[j, 3], tables[j, 4], tables[j, 5], tables[j, 6]
        order, ends = _sort_rows(indices, a, e, E)
        acc = np.empty(D, dtype=np.float32)
        part = np.empty(16, dtype=np.float32)
        touched, run_end, n_touched = _touched_rows(ends, E, e - a)
        u = row_start[j]
        TD = doff[doff.shape[0] - 1]
        for i in range(n_touched):
            r = touched[i]
            s = run_end[i - 1] if i > 0 else 0
            stop = run_end[i]
            base = w0 + np.int64(r) * D
            ahead = i + UPDATE_PREFETCH_DISTANCE
            if ahead < n_touched:
                if action == 2:
                    _prefetch_row(w, w0 + touched[ahead] * D, D)
                    if kind == 1 or kind == 3:
                        _prefetch_row(m1, w0 + touched[ahead] * D, D)
                q = run_end[ahead - 1]
                p = order[q]
                if pooling == 2:
                    _prefetch_row(g, p * D, D)
                else:
                    k = bag[p]
                    t = k // B
                    _prefetch_row(g, (k - t * B) * TD + doff[t], D)
            _row_grad(acc, D, order, s, stop, bag, offsets, B, doff, pooling, g, psw, has_psw)
            if action == 1:
                for d in range(D):
                    dense[base + d] = acc[d]
                continue
            vo = u * D if action == 0 or not in_place else 0
            if action == 0:
                lids[u] = h0 + r
                for d in range(D):
                    values[vo + d] = acc[d]
                u += 1
                continue
            _update_row(
                acc,
                D,
                base,
                h0 + r,
                w,
                lut,
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
                in_place,
                values,
                positions,
                vo,
                part,
            )
            u += 1


@njit(cache=True, inline="always")
def _sum_squares(part, g, D, w, lut, ub, wd, l2):
    """``sum_d (g[d] + l2 * wd * w[d])^2`` in 16 float32 partial sums (a fixed order that
    vectorises; one running sum would be a chain of dependent additions)."""
    part[:] = 0.0
    full = D - D % 16
    for d0 in range(0, full, 16):
        for j in range(16):
            ge = g[d0 + j] + wd * _load(w, lut, ub + np.uint64(d0 + j)) if l2 else g[d0 + j]
            part[j] += ge * ge
    for d in range(full, D):
        ge = g[d] + wd * _load(w, lut, ub + np.uint64(d)) if l2 else g[d]
        part[d - full] += ge * ge
    total = np.float32(0.0)
    for j in range(16):
        total += part[j]
    return total


@njit(cache=True, inline="always")
def _update_row(
    g, D, base, lid, w, lut, m1, m2, kind, decay, lr, eps, wd, b1, b2, bc1, bc2, in_place, new, pos, vo, part
):
    one = np.float32(1.0)
    ub = np.uint64(base)
    mult = one
    corr = one
    if kind == 2:  # rowwise adagrad: one accumulator per row
        m = m1[lid] + _sum_squares(part, g, D, w, lut, ub, wd, decay == 1) / np.float32(D)
        m1[lid] = m
        mult = lr / (np.sqrt(m) + eps)
        corr = one - mult * wd if decay == 1 else (one - lr * wd if decay == 2 else one)
        if in_place:
            for d in range(D):
                i = ub + np.uint64(d)
                w[i] = corr * w[i] - mult * g[d]
            return
    elif kind == 0 and in_place:
        for d in range(D):
            i = ub + np.uint64(d)
            w[i] = w[i] - lr * g[d]
        return
    for d in range(D):
        i = ub + np.uint64(d)
        x = _load(w, lut, i)
        gd = g[d]
        if kind == 0:
            x = x - lr * gd
        elif kind == 1:
            m = m1[i] + gd * gd
            m1[i] = m
            x = x - lr * gd / (np.sqrt(m) + eps)
        elif kind == 2:
            x = corr * x - mult * gd
        else:
            mm = b1 * m1[i] + (one - b1) * gd
            vv = b2 * m2[i] + (one - b2) * gd * gd
            m1[i] = mm
            m2[i] = vv
            x = x - lr * ((mm / bc1) / (np.sqrt(vv / bc2) + eps) + wd * x)
        if in_place:
            w[i] = x
        else:
            new[vo + d] = x
            pos[vo + d] = base + d


def _prepare(
    grad_output,
    indices,
    offsets,
    B,
    rows,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    per_sample_weights,
    max_gradient=None,
):
    idx, offs = _checked(indices, offsets)
    g = np.ascontiguousarray(grad_output, dtype=np.float32)
    if max_gradient is not None:
        g = np.clip(g, -max_gradient, max_gradient)
    g = g.reshape(-1)
    bag = _bag_of_position(offs, offs.shape[0] - 1, idx.shape[0])
    tables = _tables(hash_size_cumsum, weights_offsets, D_offsets, rows, offs, B)
    has_psw = per_sample_weights is not None
    psw = np.ascontiguousarray(per_sample_weights) if has_psw else _NO_F32
    return idx, offs, g, bag, tables, psw, has_psw


_F = np.float32(0)
_NO_I64 = np.zeros(1, dtype=np.int64)


def _run(
    action,
    prep,
    B,
    doff,
    pooling,
    row_start,
    dense=_NO_F32,
    lids=_NO_I64,
    values=_NO_F32,
    positions=_NO_I64,
    w=_NO_F32,
    lut=_NO_LUT,
    m1=_NO_F32,
    m2=_NO_F32,
    kind=0,
    decay=0,
    hp=(_F,) * 7,
    in_place=True,
):
    idx, offs, g, bag, tables, psw, has_psw = prep
    _grouped(
        action,
        idx,
        offs,
        bag,
        B,
        doff,
        pooling,
        g,
        psw,
        has_psw,
        tables,
        row_start,
        dense,
        lids,
        values,
        positions,
        w,
        lut,
        m1,
        m2,
        kind,
        decay,
        *hp,
        in_place,
    )


def _row_starts(idx, tables):
    counts = _count_touched(idx, tables)
    starts = np.zeros(tables.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def tbe_backward(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
    out,
):
    prep = _prepare(
        grad_output, indices, offsets, B, rows, weights_offsets, D_offsets, hash_size_cumsum, per_sample_weights
    )
    _zero(out)
    _run(1, prep, B, D_offsets, pooling, np.zeros(prep[4].shape[0], np.int64), dense=out)


@njit(cache=True, parallel=True)
def _zero(a):
    for i in prange(a.shape[0]):
        a[i] = 0.0


def tbe_backward_sparse(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
):
    prep = _prepare(
        grad_output, indices, offsets, B, rows, weights_offsets, D_offsets, hash_size_cumsum, per_sample_weights
    )
    tables = prep[4]
    starts = _row_starts(prep[0], tables)
    U = int(starts[-1])
    lids = np.empty(U, dtype=np.int64)
    # values of table j start at starts[j] * D_j only when every table has one D: use per-row offsets
    dims = tables[:, 4]
    vstart = np.zeros(tables.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.diff(starts) * dims, out=vstart[1:])
    values = np.empty(int(vstart[-1]), dtype=np.float32)
    _sparse_run(prep, B, D_offsets, pooling, starts, vstart, lids, values)
    row_dims = np.repeat(dims, np.diff(starts))
    value_offsets = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(row_dims, out=value_offsets[1:])
    return TBESparseGrad(lids, values, value_offsets)


def _sparse_run(prep, B, doff, pooling, starts, vstart, lids, values):
    """Sparse gradient table by table (so each table's values start at its own offset)."""
    idx, offs, g, bag, tables, psw, has_psw = prep
    for j in range(tables.shape[0]):
        sub = tables[j : j + 1]
        n = int(starts[j + 1] - starts[j])
        lo, hi = int(vstart[j]), int(vstart[j + 1])
        _grouped(
            0,
            idx,
            offs,
            bag,
            B,
            doff,
            pooling,
            g,
            psw,
            has_psw,
            sub,
            np.zeros(1, np.int64),
            _NO_F32,
            lids[int(starts[j]) : int(starts[j]) + n],
            values[lo:hi],
            _NO_I64,
            _NO_F32,
            _NO_LUT,
            _NO_F32,
            _NO_F32,
            0,
            0,
            *((_F,) * 7),
            True,
        )


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


def tbe_grad_per_sample_weights(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
    out,
):
    idx, offs = _checked(indices, offsets)
    w, lut = _weights(weights)
    _grad_psw(
        w, lut, weights_offsets, D_offsets, idx, offs, B, np.ascontiguousarray(grad_output, dtype=np.float32), out
    )


def tbe_backward_update(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
    optimizer,
    momentum1,
    momentum2,
    step,
):
    prep = _prepare(
        grad_output,
        indices,
        offsets,
        B,
        rows,
        weights_offsets,
        D_offsets,
        hash_size_cumsum,
        per_sample_weights,
        optimizer.float32()["max_gradient"],
    )
    kw = dict(
        m1=_NO_F32 if momentum1 is None else momentum1,
        m2=_NO_F32 if momentum2 is None else momentum2,
        kind=KIND_CODES[optimizer.kind],
        decay=DECAY_CODES[optimizer.weight_decay_mode],
        hp=optimizer.kernel_parameters(step),
    )
    tables = prep[4]
    if weights.dtype == np.float32:
        _run(2, prep, B, D_offsets, pooling, np.zeros(tables.shape[0], np.int64), w=weights, in_place=True, **kw)
        return
    # float16: new rows in float32, then one rounding to float16 by NumPy
    starts = _row_starts(prep[0], tables)
    dims = tables[:, 4]
    n = int((np.diff(starts) * dims).sum())
    new = np.empty(n, dtype=np.float32)
    pos = np.empty(n, dtype=np.int64)
    w, lut = _weights(weights)
    vstart = np.zeros(tables.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.diff(starts) * dims, out=vstart[1:])
    idx, offs, g, bag, _, psw, has_psw = prep
    for j in range(tables.shape[0]):
        lo, hi = int(vstart[j]), int(vstart[j + 1])
        _grouped(
            2,
            idx,
            offs,
            bag,
            B,
            D_offsets,
            pooling,
            g,
            psw,
            has_psw,
            tables[j : j + 1],
            np.zeros(1, np.int64),
            _NO_F32,
            _NO_I64,
            new[lo:hi],
            pos[lo:hi],
            w,
            lut,
            kw["m1"],
            kw["m2"],
            kw["kind"],
            kw["decay"],
            *kw["hp"],
            False,
        )
    with np.errstate(over="ignore"):
        weights[pos] = new.astype(np.float16)
