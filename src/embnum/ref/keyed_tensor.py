"""NumPy oracle of the keyed_tensor family (``docs/families/keyed_tensor.md``).

Arguments arrive validated (``embnum.ops.keyed_tensor``); each function
returns new arrays. Written as the documented definition states it, row by row.
"""

from __future__ import annotations

import numpy as np


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    offs, inv_offs = np.asarray(offset_dim_list), np.asarray(inv_offset_dim_list)
    out = np.empty_like(pooled_embs, order="C")
    for t, p in enumerate(np.asarray(permute_list)):
        out[:, inv_offs[t] : inv_offs[t + 1]] = pooled_embs[:, offs[p] : offs[p + 1]]
    return out


def kt_regroup_arguments(embs, keys, lengths, groups):
    where = {}  # key -> (input, column, width)
    for i, (ks, ls) in enumerate(zip(keys, lengths)):
        col = 0
        for k, n in zip(ks, ls):
            where[k] = (i, col, n)
            col += n
    rows, out_shapes, occurrences = [], [], {}
    for j, g in enumerate(groups):
        col = 0
        for k in g:
            i, a, n = where[k]
            occurrences.setdefault(k, []).append(len(rows))
            rows.append([i, j, a, col, n, 0])
            col += n
        out_shapes.append(col)
    P = len(rows)
    for rs in occurrences.values():
        if len(rs) > 1:
            rows[rs[0]][5] = rs[1]  # the head points to the next occurrence
            for m in range(1, len(rs)):
                rows[rs[m]][5] = -(rs[m + 1] if m + 1 < len(rs) else P)
    permutes = np.array(rows, dtype=np.int32).reshape(P, 6)
    in_shapes = np.array([sum(ls) for ls in lengths], dtype=np.int32)
    return permutes, in_shapes, np.array(out_shapes, dtype=np.int32), list(out_shapes)


def permute_multi_embedding(pooled_embs, permutes, in_shapes, out_shapes, out_lengths):
    B, dtype = pooled_embs[0].shape[0], pooled_embs[0].dtype
    outs = [np.zeros((B, w), dtype=dtype) for w in out_lengths]
    for i, j, a, c, n, _next in np.asarray(permutes).tolist():
        outs[j][:, c : c + n] = pooled_embs[i][:, a : a + n]
    return outs


def permute_multi_embedding_backward(grad_outputs, permutes, in_shapes, out_shapes, in_lengths):
    B, dtype = grad_outputs[0].shape[0], grad_outputs[0].dtype
    grads = [np.zeros((B, w), dtype=dtype) for w in in_lengths]
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE sums: inf + -inf is NaN, overflow is inf
        for i, j, a, c, n, _next in np.asarray(permutes).tolist():
            grads[i][:, a : a + n] += grad_outputs[j][:, c : c + n]  # rounds to dtype after every addition
    return grads


def regroup_keyed_tensor(pooled_embs, keys, lengths, groups):
    permutes, in_shapes, out_shapes, out_lengths = kt_regroup_arguments(None, keys, lengths, groups)
    return permute_multi_embedding(pooled_embs, permutes, in_shapes, out_shapes, out_lengths)
