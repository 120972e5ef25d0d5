"""NumPy oracle of the TBE family (``docs/families/tbe.md``): float64 accumulation,
one feature at a time, written for reading."""

from __future__ import annotations

import numpy as np

from .._tbe import MEAN, NONE, TBESparseGrad, pad_sparse
from .._tbe_vbe import flat_positions


def _vbe_grad(grad_output, vbe, D_offsets, B):
    """The flat VBE gradient placed in the padded ``[B_max, total_D]`` form the pooled code reads
    (padded bags are empty: their rows are never read)."""
    if vbe is None:
        return grad_output
    g = np.zeros((B, int(D_offsets[-1])), dtype=grad_output.dtype)
    rows, cols = flat_positions(vbe, D_offsets)
    g[rows, cols] = grad_output
    return g


def _features(weights, weights_offsets, D_offsets, rows, indices, offsets, B):
    """Per feature: ``(t, table [E, D] float64 view or copy, cols, positions a:e, bag of each position, lengths)``."""
    offsets = offsets.astype(np.int64)
    for t in range(weights_offsets.shape[0]):
        D = int(D_offsets[t + 1] - D_offsets[t])
        w0 = int(weights_offsets[t])
        table = weights[w0 : w0 + int(rows[t]) * D].reshape(int(rows[t]), D)
        o = offsets[t * B : (t + 1) * B + 1]
        lengths = np.diff(o)
        bag = np.repeat(np.arange(B), lengths)
        yield t, table, slice(int(D_offsets[t]), int(D_offsets[t + 1])), int(o[0]), int(o[-1]), bag, lengths


def tbe_forward(
    weights,
    weights_offsets,
    D_offsets,
    rows,
    indices,
    offsets,
    B,
    pooling,
    per_sample_weights,
    output_dtype,
    vbe=None,
    **_,
):
    idx = indices.astype(np.int64)
    N = indices.shape[0]
    w64 = weights.astype(np.float64)
    if pooling == NONE:
        out = np.zeros((N, int(D_offsets[1])))
    else:
        out = np.zeros((B, int(D_offsets[-1])))
    for t, table, cols, a, e, bag, lengths in _features(w64, weights_offsets, D_offsets, rows, idx, offsets, B):
        vals = table[idx[a:e]]
        if pooling == NONE:
            out[a:e] = vals
            continue
        if per_sample_weights is not None:
            vals = vals * per_sample_weights[a:e, None].astype(np.float64)
        acc = np.zeros((B, table.shape[1]))
        np.add.at(acc, bag, vals)
        if pooling == MEAN:
            nz = lengths > 0
            acc[nz] /= lengths[nz, None]
        out[:, cols] = acc
    if vbe is not None:
        out = out[flat_positions(vbe, D_offsets)]
    with np.errstate(over="ignore"):
        return out.astype(np.float32).astype(output_dtype) if output_dtype == np.float16 else out.astype(output_dtype)


def _row_grads(
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
    vbe=None,
):
    """Dense float64 gradient ``[W]`` and the sorted touched linear ids."""
    idx = indices.astype(np.int64)
    g = _vbe_grad(grad_output, vbe, D_offsets, B).astype(np.float64)
    grad = np.zeros(weights.shape[0])
    touched = []
    for t, table, cols, a, e, bag, lengths in _features(grad, weights_offsets, D_offsets, rows, idx, offsets, B):
        ids = idx[a:e]
        if pooling == NONE:
            contrib = g[a:e]
        else:
            contrib = g[bag, cols]
            if per_sample_weights is not None:
                contrib = contrib * per_sample_weights[a:e, None].astype(np.float64)
            if pooling == MEAN:
                contrib = contrib / lengths[bag][:, None]
        np.add.at(table, ids, contrib)  # ``table`` is a view of ``grad``
        touched.append(int(hash_size_cumsum[t]) + ids)
    lids = np.unique(np.concatenate(touched)) if touched else np.zeros(0, np.int64)
    return grad, lids.astype(np.int64)


def _row_spans(lids, weights_offsets, D_offsets, hash_size_cumsum):
    """Element range ``(start, D)`` in ``weights`` of each linear row id."""
    firsts = {}
    for t in range(weights_offsets.shape[0]):
        firsts.setdefault(int(hash_size_cumsum[t]), t)
    starts = np.array(sorted(firsts))
    spans = []
    for lid in lids.tolist():
        t = firsts[int(starts[np.searchsorted(starts, lid, side="right") - 1])]
        D = int(D_offsets[t + 1] - D_offsets[t])
        spans.append((int(weights_offsets[t]) + (lid - int(hash_size_cumsum[t])) * D, D))
    return spans


def tbe_backward(grad_output, **kw):
    grad, _ = _row_grads(grad_output, **kw)
    return grad.astype(np.float32)


def _sparse(grad, lids, kw):
    spans = _row_spans(lids, kw["weights_offsets"], kw["D_offsets"], kw["hash_size_cumsum"])
    voffs = np.zeros(len(spans) + 1, dtype=np.int64)
    voffs[1:] = np.cumsum([D for _, D in spans])
    vals = np.concatenate([grad[s : s + D] for s, D in spans]) if spans else np.zeros(0)
    return spans, voffs, vals


def tbe_backward_sparse(grad_output, max_rows=None, **kw):
    grad, lids = _row_grads(grad_output, **kw)
    _, voffs, vals = _sparse(grad, lids, kw)
    out = TBESparseGrad(lids, vals.astype(np.float32), voffs)
    return out if max_rows is None else pad_sparse(out, max_rows, int(np.diff(kw["D_offsets"]).max()))


def tbe_grad_per_sample_weights(
    grad_output, weights, weights_offsets, D_offsets, rows, indices, offsets, B, vbe=None, **_
):
    idx = indices.astype(np.int64)
    g = _vbe_grad(grad_output, vbe, D_offsets, B).astype(np.float64)
    out = np.zeros(indices.shape[0])
    for t, table, cols, a, e, bag, lengths in _features(
        weights.astype(np.float64), weights_offsets, D_offsets, rows, idx, offsets, B
    ):
        out[a:e] = (table[idx[a:e]] * g[bag, cols]).sum(axis=1)
    return out.astype(np.float32)


def tbe_backward_update(grad_output, weights, optimizer, momentum1, momentum2, step, **kw):
    """The fused-optimizer step (``docs/families/tbe.md``) in float64 with float32 hyper-parameters;
    writes ``weights`` and the state."""
    hp = {k: (None if x is None else float(x)) for k, x in optimizer.float32().items()}
    g_out = grad_output.astype(np.float32)
    if hp["max_gradient"] is not None:
        g_out = np.clip(g_out, -hp["max_gradient"], hp["max_gradient"])
    grad, lids = _row_grads(g_out, weights=weights, **kw)
    spans = _row_spans(lids, kw["weights_offsets"], kw["D_offsets"], kw["hash_size_cumsum"])
    lr, eps, wd = hp["lr"], hp["eps"], hp["wd"]
    mode = optimizer.weight_decay_mode
    for lid, (s, D) in zip(lids.tolist(), spans):
        sl = slice(s, s + D)
        g = grad[sl]
        w = weights[sl].astype(np.float64)
        if optimizer.kind == "sgd":
            new = w - lr * g
        elif optimizer.kind == "adagrad":
            m = momentum1[sl].astype(np.float64) + g * g
            momentum1[sl] = m
            new = w - lr * g / (np.sqrt(m) + eps)
        elif optimizer.kind == "rowwise_adagrad":
            g_eff = g + wd * w if mode == "l2" else g
            m = float(momentum1[lid]) + float(np.mean(g_eff * g_eff))
            momentum1[lid] = m
            mult = lr / (np.sqrt(m) + eps)
            corr = 1 - mult * wd if mode == "l2" else (1 - lr * wd if mode == "decoupled" else 1.0)
            new = corr * w - mult * g
        elif optimizer.kind == "adam":
            b1, b2 = hp["beta1"], hp["beta2"]
            m = b1 * momentum1[sl].astype(np.float64) + (1 - b1) * g
            vv = b2 * momentum2[sl].astype(np.float64) + (1 - b2) * g * g
            momentum1[sl], momentum2[sl] = m, vv
            m_hat = m / (1 - b1**step)
            v_hat = vv / (1 - b2**step)
            new = w - lr * (m_hat / (np.sqrt(v_hat) + eps) + wd * w)
        else:
            new = _new_kinds(optimizer.kind, hp, g, w, momentum1, momentum2, sl, lid, step)
        if hp["max_norm"] is not None:
            norm = np.sqrt(np.sum(new * new))
            if norm > hp["max_norm"]:
                new = new * (hp["max_norm"] / norm)
        with np.errstate(over="ignore"):
            weights[sl] = new.astype(np.float32).astype(weights.dtype) if weights.dtype == np.float16 else new


def _trust(num, den):
    """``num / den``, 0 when ``den == 0`` (fbgemm gets 0/0 = NaN there; the update is 0 anyway)."""
    return num / den if den > 0 else 0.0


def _new_kinds(kind, hp, g, w, momentum1, momentum2, sl, lid, step):
    """LAMB, partial row-wise Adam / LAMB and LARS-SGD (fbgemm_gpu's GPU formulas); writes the state."""
    lr, eps, wd, b1, b2 = hp["lr"], hp["eps"], hp["wd"], hp["beta1"], hp["beta2"]
    if kind == "lars_sgd":
        w_norm, g_norm = np.sqrt(np.sum(w * w)), np.sqrt(np.sum(g * g))
        adjusted_lr = _trust(lr * hp["eta"] * w_norm, g_norm + wd * w_norm)
        m = hp["momentum"] * momentum1[sl].astype(np.float64) + adjusted_lr * (g + wd * w)
        momentum1[sl] = m
        return w - m
    m = b1 * momentum1[sl].astype(np.float64) + (1 - b1) * g  # first moment: per element for all three
    momentum1[sl] = m
    m_hat = m / (1 - b1**step)
    if kind == "lamb":
        v = b2 * momentum2[sl].astype(np.float64) + (1 - b2) * g * g
        momentum2[sl] = v
        denom = np.sqrt(v / (1 - b2**step)) + eps
    else:  # partial row-wise: one second moment per row, from the mean squared gradient
        v = b2 * float(momentum2[lid]) + (1 - b2) * float(np.mean(g * g))
        momentum2[lid] = v
        denom = np.sqrt(v / (1 - b2**step)) + eps
    if kind == "partial_rowwise_adam":
        return w - lr * (m_hat / denom + wd * w)
    r = m_hat / denom + wd * w  # LAMB: the Adam direction plus decay, scaled by the trust ratio
    ratio = _trust(np.sqrt(np.sum(w * w)), np.sqrt(np.sum(r * r)))
    return w - lr * ratio * r
