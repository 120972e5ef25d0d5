"""NumPy oracle of the jagged family (``docs/families/jagged.md``).

Arguments arrive validated (``embnum.ops.jagged``); each function returns a
new array. Plain and obviously right first; speed is not the point.
"""

from __future__ import annotations

import numpy as np


def _cumsum(lengths):
    """Row-wise prefix sums, in int64, returned in the dtype of ``lengths``."""
    return np.cumsum(lengths, axis=-1, dtype=np.int64).astype(lengths.dtype)


def complete_cumsum(lengths):
    zero = np.zeros(lengths.shape[:-1] + (1,), dtype=lengths.dtype)
    return np.concatenate([zero, _cumsum(lengths)], axis=-1)


def exclusive_cumsum(lengths):
    return complete_cumsum(lengths)[:-1]


def inclusive_cumsum(lengths):
    return _cumsum(lengths)


def offsets_range(offsets, range_size):
    j = np.arange(range_size, dtype=np.int64)
    if range_size == 0:
        return j.astype(offsets.dtype)
    start = offsets[np.searchsorted(offsets, j, side="right") - 1]  # max{offsets[k] <= j}
    return (j - start).astype(offsets.dtype)


def _accumulator(dtype):
    return np.float64 if dtype.kind == "f" else np.int64


def segment_sum_csr(batch_size, csr_seg, values):
    bounds = csr_seg.astype(np.int64) * batch_size
    acc = _accumulator(values.dtype)
    sums = [values[a:b].sum(dtype=acc) for a, b in zip(bounds[:-1], bounds[1:])]
    return np.array(sums, dtype=acc).astype(values.dtype)  # one rounding; ints wrap


def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values):
    bounds = csr_seg.astype(np.int64) * batch_size
    grad = np.zeros(num_values, dtype=grad_output.dtype)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        grad[a:b] = grad_output[i]
    return grad


def _leaf_segment(offsets, prefix):
    """Walk ``(b, i_1, ..., i_{J-1})`` down the offsets; the segment of
    ``offsets[J-1]`` it reaches, or None when some ``i_k`` is past its
    segment's end."""
    r = prefix[0]
    for k, i in enumerate(prefix[1:]):
        start, end = int(offsets[k][r]), int(offsets[k][r + 1])
        if i >= end - start:
            return None
        r = start + i
    return r


def _runs(offsets, B, max_lengths):
    """``(prefix, start, n)`` for every leaf segment of a padded ``[B, *max_lengths]`` array:
    ``dense[prefix][:n]`` and ``values[start:start+n]`` are the same elements (the segment,
    truncated to ``max_lengths[-1]``); both directions of jagged <-> dense walk these."""
    for prefix in np.ndindex(B, *max_lengths[:-1]):
        seg = _leaf_segment(offsets, prefix)
        if seg is not None:
            start, end = int(offsets[-1][seg]), int(offsets[-1][seg + 1])
            yield prefix, start, min(end - start, max_lengths[-1])


def jagged_to_padded_dense(values, offsets, max_lengths, padding_value):
    rows = values if values.ndim == 2 else values[:, None]
    B = len(offsets[0]) - 1
    dense = np.full((B, *max_lengths, rows.shape[1]), padding_value, dtype=values.dtype)
    for prefix, start, n in _runs(offsets, B, max_lengths):
        dense[prefix][:n] = rows[start : start + n]
    return dense.reshape(dense.shape[:-1]) if values.ndim == 1 else dense


def dense_to_jagged(dense, offsets, total_L):
    B, *M, D = dense.shape
    values = np.zeros((total_L, D), dtype=dense.dtype)
    for prefix, start, n in _runs(offsets, B, M):
        values[start : start + n] = dense[prefix][:n]
    return values
