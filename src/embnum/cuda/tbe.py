"""Numba-CUDA kernels of the TBE family.

Same contract as ``embnum.cpu.tbe``. The declarations have already checked (or
repaired a copy of) every index, and the kernels still skip any row id outside
its table, so no id can make a kernel read or write out of bounds.

Forward: one block per bag (grid-stride), threads over the embedding dim.
Backward: the lookups are sorted by ``(linear row id, position)`` with the
array module's sort (a unique key, so the order is fixed), each run of one
row is reduced by one block in position order, and each unique row is
written once: no float atomics, identical results from run to run.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import _tbe_rows
from .._tbe import DECAY_CODES, KIND_CODES, LAMB, TBESparseGrad
from ._common import TPB, blocks, contiguous, float32_result, half_table, round_once, xp


def _weights(weights):
    m = xp()
    w = contiguous(weights)
    if w.dtype == np.float16:
        return w.view(np.uint16), half_table(), True
    return w, m.zeros(1, np.float32), False


def _dev(a, dtype=np.int64):
    return xp().asarray(a, dtype=dtype)


@cuda.jit
def _forward_pooled(w, lut, half, woff, doff, rows, indices, offsets, B, mean, psw, has_psw, out):
    T = woff.shape[0]
    for k in range(cuda.blockIdx.x, T * B, cuda.gridDim.x):
        t = k // B
        b = k - t * B
        D = doff[t + 1] - doff[t]
        s = offsets[k]
        e = offsets[k + 1]
        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            acc = np.float32(0.0)
            for p in range(s, e):
                r = indices[p]
                if r < 0 or r >= rows[t]:
                    continue
                i = woff[t] + r * D + d
                x = lut[w[i]] if half else w[i]
                acc += psw[p] * x if has_psw else x
            if mean and e > s:
                acc = acc / np.float32(e - s)
            out[b, doff[t] + d] = acc


@cuda.jit
def _forward_none(w, lut, half, woff, doff, rows, indices, offsets, B, out):
    T = woff.shape[0]
    D = doff[1]
    for p in range(cuda.blockIdx.x, offsets[0], cuda.gridDim.x):  # outside every bag: 0
        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            out[p, d] = 0.0
    for k in range(cuda.blockIdx.x, T * B, cuda.gridDim.x):
        t = k // B
        for p in range(offsets[k], offsets[k + 1]):
            r = indices[p]
            if r < 0 or r >= rows[t]:
                continue
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
                i = woff[t] + r * D + d
                out[p, d] = lut[w[i]] if half else w[i]


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
    m = xp()
    w, lut, half = _weights(weights)
    target = float32_result(out)
    woff, doff, nrows = _dev(weights_offsets), _dev(D_offsets), _dev(rows)
    idx, offs = contiguous(indices), contiguous(offsets)
    if pooling == 2:
        if target.size:
            _forward_none[blocks(indices.shape[0] + 1), TPB](w, lut, half, woff, doff, nrows, idx, offs, B, target)
    elif target.size:
        has_psw = per_sample_weights is not None
        psw = contiguous(per_sample_weights) if has_psw else m.zeros(1, np.float32)
        _forward_pooled[blocks(weights_offsets.shape[0] * B), TPB](
            w, lut, half, woff, doff, nrows, idx, offs, B, pooling == 1, psw, has_psw, target
        )
    round_once(target, out)


# -- backward: sort by (row, position), reduce each run, write each row once ----
def _runs(hash_size_cumsum, weights_offsets, D_offsets, indices, offsets, B):
    """Sorted lookups: ``(order, unique linear ids, run starts [U+1], feature of each run, D of each run)``."""
    m = xp()
    offs = offsets.astype(np.int64)
    first, N = int(offs[0]), int(indices.shape[0])
    pos = m.arange(first, N, dtype=np.int64)
    bag = m.searchsorted(offs, pos, side="right") - 1
    feat = bag // max(B, 1)
    hcs = _dev(hash_size_cumsum)
    lid = hcs[feat] + indices[first:].astype(np.int64)
    order = m.argsort(lid * max(N, 1) + pos)  # unique keys: a fixed order whatever the sort
    lid_sorted = lid[order]
    if lid_sorted.shape[0]:
        new = m.concatenate([m.ones(1, bool), lid_sorted[1:] != lid_sorted[:-1]])
        starts = m.nonzero(new)[0]
    else:
        starts = m.zeros(0, np.int64)
    U = int(starts.shape[0])
    run_start = m.concatenate([starts, m.asarray([lid_sorted.shape[0]])]).astype(np.int64)
    run_feat = feat[order[starts]] if U else m.zeros(0, np.int64)
    dims = _dev(np.diff(D_offsets))
    run_D = dims[run_feat] if U else m.zeros(0, np.int64)
    return (pos[order], bag[order]), lid_sorted[starts] if U else m.zeros(0, np.int64), run_start, run_feat, run_D


@cuda.jit
def _reduce_runs(sorted_pos, sorted_bag, run_start, run_feat, voff, offsets, B, doff, pooling, g, psw, has_psw, values):
    """``values[voff[u] + d]`` = summed gradient of run ``u`` (block per run, threads over d)."""
    U = run_start.shape[0] - 1
    for u in range(cuda.blockIdx.x, U, cuda.gridDim.x):
        t = run_feat[u]
        D = doff[t + 1] - doff[t]
        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            acc = np.float32(0.0)
            for q in range(run_start[u], run_start[u + 1]):
                p = sorted_pos[q]
                if pooling == 2:
                    acc += g[p, d]
                    continue
                k = sorted_bag[q]
                tt = k // B
                b = k - tt * B
                if has_psw:
                    c = psw[p]
                elif pooling == 1:
                    c = np.float32(1.0) / np.float32(offsets[k + 1] - offsets[k])
                else:
                    c = np.float32(1.0)
                acc += c * g[b, doff[tt] + d]
            values[voff[u] + d] = acc


def _sparse(
    grad_output, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, B, pooling, per_sample_weights, g=None
):
    m = xp()
    idx, offs = contiguous(indices), contiguous(offsets)
    (spos, sbag), lids, run_start, run_feat, run_D = _runs(hash_size_cumsum, weights_offsets, D_offsets, idx, offs, B)
    U = int(lids.shape[0])
    voff = m.zeros(U + 1, np.int64)
    if U:
        voff[1:] = m.cumsum(run_D)
    values = m.empty(int(voff[-1]), np.float32)
    if U:
        g = contiguous(grad_output).astype(np.float32) if g is None else g
        has_psw = per_sample_weights is not None
        psw = contiguous(per_sample_weights) if has_psw else m.zeros(1, np.float32)
        _reduce_runs[blocks(U), TPB](
            spos, sbag, run_start, run_feat, voff, offs, B, _dev(D_offsets), pooling, g, psw, has_psw, values
        )
    return lids, values, voff, run_feat


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
    lids, values, voff, _ = _sparse(
        grad_output, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, B, pooling, per_sample_weights
    )
    return TBESparseGrad(lids, values, voff)


@cuda.jit
def _scatter_rows(lids, run_feat, voff, woff, doff, hcs, values, dense):
    U = lids.shape[0]
    for u in range(cuda.blockIdx.x, U, cuda.gridDim.x):
        t = run_feat[u]
        D = doff[t + 1] - doff[t]
        base = woff[t] + (lids[u] - hcs[t]) * D
        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            dense[base + d] = values[voff[u] + d]


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
    lids, values, voff, run_feat = _sparse(
        grad_output, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, B, pooling, per_sample_weights
    )
    out[...] = 0
    if lids.shape[0]:
        _scatter_rows[blocks(int(lids.shape[0])), TPB](
            lids, run_feat, voff, _dev(weights_offsets), _dev(D_offsets), _dev(hash_size_cumsum), values, out
        )


@cuda.jit
def _grad_psw(w, lut, half, woff, doff, rows, indices, offsets, B, g, out):
    T = woff.shape[0]
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for p in range(start, offsets[0], stride):
        out[p] = 0.0
    for k in range(start, T * B, stride):
        t = k // B
        b = k - t * B
        D = doff[t + 1] - doff[t]
        for p in range(offsets[k], offsets[k + 1]):
            r = indices[p]
            acc = np.float32(0.0)
            if r >= 0 and r < rows[t]:
                for d in range(D):
                    i = woff[t] + r * D + d
                    acc += g[b, doff[t] + d] * (lut[w[i]] if half else w[i])
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
    w, lut, half = _weights(weights)
    g = contiguous(grad_output).astype(np.float32)
    if out.shape[0]:
        _grad_psw[blocks(max(weights_offsets.shape[0] * B, int(offsets[0]), 1), TPB), TPB](
            w,
            lut,
            half,
            _dev(weights_offsets),
            _dev(D_offsets),
            _dev(rows),
            contiguous(indices),
            contiguous(offsets),
            B,
            g,
            out,
        )


@cuda.jit
def _apply(
    lids,
    run_feat,
    voff,
    woff,
    doff,
    hcs,
    values,
    w,
    lut,
    half,
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
    new,
    pos,
):
    """One thread per touched row: the optimizer step of ``docs/families/tbe.md`` (float32)."""
    U = lids.shape[0]
    one = np.float32(1.0)
    for u in range(cuda.grid(1), U, cuda.gridsize(1)):
        t = run_feat[u]
        D = doff[t + 1] - doff[t]
        base = woff[t] + (lids[u] - hcs[t]) * D
        v0 = voff[u]
        mult = one
        corr = one
        if kind == 2:
            ssq = np.float32(0.0)
            for d in range(D):
                x = lut[w[base + d]] if half else w[base + d]
                ge = values[v0 + d] + wd * x if decay == 1 else values[v0 + d]
                ssq += ge * ge
            mm = m1[lids[u]] + ssq / np.float32(D)
            m1[lids[u]] = mm
            mult = lr / (np.float32(math.sqrt(mm)) + eps)
            corr = one - mult * wd if decay == 1 else (one - lr * wd if decay == 2 else one)
        for d in range(D):
            x = lut[w[base + d]] if half else w[base + d]
            gd = values[v0 + d]
            if kind == 0:
                x = x - lr * gd
            elif kind == 1:
                mm = m1[base + d] + gd * gd
                m1[base + d] = mm
                x = x - lr * gd / (np.float32(math.sqrt(mm)) + eps)
            elif kind == 2:
                x = corr * x - mult * gd
            else:
                a = b1 * m1[base + d] + (one - b1) * gd
                v = b2 * m2[base + d] + (one - b2) * gd * gd
                m1[base + d] = a
                m2[base + d] = v
                x = x - lr * ((a / bc1) / (np.float32(math.sqrt(v / bc2)) + eps) + wd * x)
            if in_place:
                w[base + d] = x
            else:
                new[v0 + d] = x
                pos[v0 + d] = base + d


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
    m = xp()
    g = contiguous(grad_output).astype(np.float32)
    hp = optimizer.float32()
    if hp["max_gradient"] is not None:
        g = m.clip(g, -hp["max_gradient"], hp["max_gradient"])
    lids, values, voff, run_feat = _sparse(
        None, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, B, pooling, per_sample_weights, g=g
    )
    U = int(lids.shape[0])
    if not U:
        return
    if KIND_CODES[optimizer.kind] >= LAMB or optimizer.max_norm is not None:
        _update_rows(
            weights,
            (weights_offsets, D_offsets, hash_size_cumsum),
            (lids, values, voff),
            optimizer,
            momentum1,
            momentum2,
            step,
        )
        return
    half = weights.dtype == np.float16
    w, lut, _ = _weights(weights)
    n = int(voff[-1])
    new = m.empty(n if half else 1, np.float32)
    pos = m.empty(n if half else 1, np.int64)
    none = m.zeros(1, np.float32)
    _apply[blocks(U, TPB), TPB](
        lids,
        run_feat,
        voff,
        _dev(weights_offsets),
        _dev(D_offsets),
        _dev(hash_size_cumsum),
        values,
        w,
        lut,
        half,
        none if momentum1 is None else momentum1,
        none if momentum2 is None else momentum2,
        KIND_CODES[optimizer.kind],
        DECAY_CODES[optimizer.weight_decay_mode],
        *optimizer.kernel_parameters(step),
        not half,
        new,
        pos,
    )
    if half:
        weights[pos] = new.astype(np.float16)


# -- the other optimizers and max_norm: the shared row rule, one thread per touched row ------
_rule = _tbe_rows.make_update_row(cuda.jit(device=True))


@cuda.jit
def _apply_rows(kind, decay, rows, g, voff, elem, lids, m1, m2, hp):
    for u in range(cuda.grid(1), lids.shape[0], cuda.gridsize(1)):
        o = voff[u]
        _rule(kind, decay, rows, g, o, voff[u + 1] - o, m1, m2, elem[u], lids[u], hp)


def _update_rows(weights, layout, sparse, optimizer, momentum1, momentum2, step):
    """LAMB, partial row-wise Adam/LAMB, LARS-SGD and ``max_norm``: the touched rows gathered
    as float32 (library gathers), :mod:`embnum._tbe_rows`'s rule per row, one write back."""

    def apply(*args):
        _apply_rows[blocks(int(sparse[0].shape[0]), TPB), TPB](*args)

    _tbe_rows.update_rows(xp(), apply, weights, layout, sparse, optimizer, momentum1, momentum2, step)
