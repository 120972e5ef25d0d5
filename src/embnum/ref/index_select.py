"""NumPy oracle of the index_select family (``docs/families/index_select.md``).

Arguments arrive validated (``embnum.ops.index_select``). Each table of a batch op is cut out of
the flat inputs as a ``[rows, cols]`` block; selected row ``j`` of table ``t`` sits at
``base[t] + j * step[t]`` of the flat output.
"""

from __future__ import annotations

import numpy as np


def group_index_select_dim0(input_group, indices_group):
    return [np.take(a, i.astype(np.int64), axis=0) for a, i in zip(input_group, indices_group)]


def _tables(in_offs, idx_offs, cols, base, step, indices):
    """For each table with something to move: ``(source positions, destination positions)``, both
    ``[n_t, cols_t]`` int64, row ``j`` in the order of ``indices``."""
    for t in range(cols.shape[0]):
        C = int(cols[t])
        ids = indices[idx_offs[t] : idx_offs[t + 1]].astype(np.int64)
        if C == 0 or ids.shape[0] == 0:
            continue
        c = np.arange(C)
        src = in_offs[t] + ids[:, None] * C + c
        dst = base[t] + np.arange(ids.shape[0])[:, None] * step[t] + c
        yield src, dst


def batch_index_select_dim0(inputs, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows):
    out = np.zeros(int(sel_offs[-1]), inputs.dtype)
    for src, dst in _tables(in_offs, idx_offs, cols, base, step, indices):
        out[dst] = inputs[src]
    return out


def batch_index_select_dim0_backward(grad_output, indices, in_offs, idx_offs, sel_offs, cols, base, step, rows):
    wide = np.float64 if grad_output.dtype == np.float64 else np.float32
    acc = np.zeros(int(in_offs[-1]), wide)
    g = grad_output.astype(wide)
    for src, dst in _tables(in_offs, idx_offs, cols, base, step, indices):
        np.add.at(acc, src.reshape(-1), g[dst.reshape(-1)])  # unbuffered, in order: repeats add in order
    return acc.astype(grad_output.dtype)


def jagged_index_select_2d(values, src, dst, rows):
    lengths = np.diff(dst)
    positions = np.repeat(src - dst[:-1], lengths) + np.arange(dst[-1], dtype=np.int64)
    return values[positions[:rows]]
