"""NumPy oracle of the quantized TBE lookup (``docs/families/tbe_quantized.md``).

Arguments arrive validated and bounds-checked (``embnum.ops.tbe_quantized``):
``layout[t] = (byte offset, type code, first output column, D, row bytes)``;
every index inside a bag is in range or ``-1`` (pruned). Rows are dequantized
exactly (``scale * q + bias`` in float64, rounded once to float32) and pooled
in float64.
"""

from __future__ import annotations

import numpy as np

from .._validate import to_host


def dequantize_row(weights, start, code, D):
    """Row of ``D`` float32 values starting at byte ``start`` (tbe.md 5.1)."""
    # contiguous copies of the bytes: a strided ``weights`` (which cpu accepts) cannot be viewed as floats
    if code == 0:
        return np.ascontiguousarray(weights[start : start + 4 * D]).view("<f4").astype(np.float32)
    if code == 1:
        return np.ascontiguousarray(weights[start : start + 2 * D]).view("<f2").astype(np.float32)
    scale, bias = np.ascontiguousarray(weights[start : start + 4]).view("<f2").astype(np.float64)
    data = weights[start + 4 :]
    if code == 2:
        q = data[:D]
    elif code == 3:
        q = np.stack([data[: D // 2] & 15, data[: D // 2] >> 4], axis=1).reshape(-1)
    else:
        b = data[: D // 4]
        q = np.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, b >> 6], axis=1).reshape(-1)
    return (scale * q.astype(np.float64) + bias).astype(np.float32)


def _bags(indices, offsets, B, T):
    """Yield ``(t, b, positions)`` for every bag, feature-major."""
    for t in range(T):
        for b in range(B):
            k = t * B + b
            yield t, b, range(int(offsets[k]), int(offsets[k + 1]))


def tbe_forward_quantized(weights, layout, indices, offsets, B, pooling, per_sample_weights, output_dtype):
    T = layout.shape[0]
    N = indices.shape[0]
    if pooling == 2:  # none: one row per index
        D = int(layout[0, 3])
        out = np.zeros((N, D), np.float64)
        for t, b, positions in _bags(indices, offsets, B, T):
            start, code, _, D, R = (int(x) for x in layout[t])
            for p in positions:
                i = int(indices[p])
                if i != -1:
                    out[p] = dequantize_row(weights, start + i * R, code, D)
        return out.astype(np.float32).astype(output_dtype)
    out = np.zeros((B, int(layout[-1, 2] + layout[-1, 3])), np.float64)
    for t, b, positions in _bags(indices, offsets, B, T):
        start, code, col, D, R = (int(x) for x in layout[t])
        acc = np.zeros(D, np.float64)
        for p in positions:
            i = int(indices[p])
            if i == -1:
                continue  # pruned: adds nothing, still counts in the mean's divisor
            w = 1.0 if per_sample_weights is None else float(per_sample_weights[p])
            acc += w * dequantize_row(weights, start + i * R, code, D).astype(np.float64)
        if pooling == 1 and len(positions):
            acc /= len(positions)
        out[b, col : col + D] = acc
    with np.errstate(over="ignore"):
        return out.astype(np.float32).astype(output_dtype)


def bag_magnitudes(a, shape):
    """``sum(|w_p| * max|row_p|)`` of each output element's bag (the tolerance scale of tbe.md 5.3);
    ``a``: the op's validated plan arguments."""
    host = lambda x: None if x is None else to_host(x)  # noqa: E731
    weights, layout, indices, offsets = (host(a[k]) for k in ("weights", "layout", "indices", "offsets"))
    psw = host(a["per_sample_weights"])
    T = layout.shape[0]
    scale = np.zeros(shape, np.float64)
    row_max = {}  # byte offset of a row -> its max |element|: a row looked up again is not decoded again
    for t, b, positions in _bags(indices, offsets, a["B"], T):
        start, code, col, D, R = (int(x) for x in layout[t])
        for p in positions:
            i = int(indices[p])
            if i == -1:
                continue
            at = start + i * R
            m = row_max.get(at)
            if m is None:
                # NaN elements (a NaN scale or bias) are matched as NaN; they must not void the other columns' bound
                m = row_max[at] = float(
                    np.nanmax(np.abs(dequantize_row(weights, at, code, D).astype(np.float64)), initial=0.0)
                )
            w = 1.0 if psw is None else abs(float(psw[p]))
            if a["pooling"] == 2:
                scale[p] = m
            else:
                scale[b, col : col + D] += w * m
    return scale
