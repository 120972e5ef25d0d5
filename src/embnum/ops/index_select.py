"""Declarations of the index_select family (``docs/families/index_select.md``).

Row gathers along dimension 0 of dense arrays, several in one call, and the adjoint of the
batched one: what TorchRec does to pooled embeddings when it undoes a de-duplication of its
input (``group_index_select_dim0``) and when it puts variable-batch outputs back in batch order
(``batch_index_select_dim0``), and the gather of whole jagged segments that TorchRec's
``KeyedJaggedTensorPool`` lookups do (``jagged_index_select_2d``). Each function validates its
arguments and returns its plan ``(args, out)``; the implementations live in
``embnum.{ref,cpu,cuda}.index_select``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as v
from .._cache import BoundedCache
from .._registry import op

_VALUES = v.VALUE_DTYPES
_FLOATS = v.FLOAT_DTYPES


def _in_range(name, a, n, what=""):
    """Entries of the 1-D int32/int64 array ``a`` lie in ``[0, n)`` (IndexError naming the first that does not)."""
    v.index_array(name, a)
    if a.size:
        lo, hi = v.min_max(a)
        if lo < 0 or hi >= n:
            i = int(v.xp_of(a).argmax((a < 0) | (a >= n)))
            raise IndexError(f"{name}[{i}] = {int(a[i])} is out of range [0, {n}){what}")


def _fits(name, n):
    if n > v.MAX_SIZE:
        raise ValueError(f"{name} has {n} entries, above the size limit 2**48")


# -- 1. group_index_select_dim0 ----------------------------------------------------------------
@op("index_select", returns="list", differentiable=("input_group",))
def group_index_select_dim0(input_group, indices_group):
    """Rows ``indices_group[g]`` of each ``input_group[g]``: ``G`` row gathers in one call.

    input_group: non-empty list of ``G`` arrays, each at least 1-D, int32/int64/float16/32/64
    (their dtypes and shapes may differ); indices_group: ``G`` 1-D int32/int64 arrays,
    ``indices_group[g]`` in ``[0, input_group[g].shape[0])`` (repeats allowed). Returns ``G``
    arrays ``[len(indices_group[g]), *input_group[g].shape[1:]]`` in the dtype of
    ``input_group[g]``.

    Examples
    --------
    >>> a, b = np.arange(6.0).reshape(3, 2), np.array([7, 8, 9])
    >>> embnum.group_index_select_dim0([a, b], [np.array([2, 2, 0]), np.array([1])])
    [array([[4., 5.],
           [4., 5.],
           [0., 1.]]), array([8])]
    """
    inputs = v.array_list("input_group", input_group, min_len=1)
    indices = v.array_list("indices_group", indices_group)
    if len(indices) != len(inputs):
        raise ValueError(f"indices_group must hold len(input_group) = {len(inputs)} arrays, got {len(indices)}")
    outs = []
    for g, (a, i) in enumerate(zip(inputs, indices)):
        v.array(f"input_group[{g}]", a, dtypes=_VALUES)
        if a.ndim < 1:
            raise ValueError(f"input_group[{g}] must be at least 1-D, got a 0-D array")
        _in_range(f"indices_group[{g}]", i, a.shape[0], f" (input_group[{g}] has {a.shape[0]} rows)")
        shape = (i.shape[0],) + tuple(a.shape[1:])
        _fits(f"output {g}", math.prod(shape))  # (Python ints: exact at any size)
        outs.append((shape, a.dtype))
    return (dict(input_group=inputs, indices_group=indices), outs)


# -- 2. batch_index_select_dim0 and its adjoint -------------------------------------------------
def _batch_layout(indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1):
    """The plan arguments every batch op shares: the tables' int64 offsets into the inputs
    (``in_offs``), into ``indices`` (``idx_offs``) and into the selection (``sel_offs``), their
    ``cols``, and where selected row ``j`` of table ``t`` goes: ``base[t] + j * step[t]``.
    Returns ``(layout, input size, output size)``."""
    num = v.int_list("input_num_indices", input_num_indices)
    T = len(num)
    rows = v.int_list("input_rows", input_rows, length=T)
    cols = v.int_list("input_columns", input_columns, length=T)
    permute = v.flag("permute_output_dim_0_1", permute_output_dim_0_1)
    v.index_array("indices", indices)
    n_idx = sum(num)
    if indices.shape[0] != n_idx:
        raise ValueError(f"len(indices) = {indices.shape[0]} must equal sum(input_num_indices) = {n_idx}")
    key = (tuple(num), tuple(rows), tuple(cols), permute)
    known = _LAYOUTS.get(key)
    if known is None:
        known = _tables_layout(num, rows, cols, permute)
        if n_idx <= _LAYOUT_MAX_INDICES:
            known = _LAYOUTS.put(key, known)
    arrays, table, limit, n_in, n_out = known
    if T and indices.shape[0]:
        xp = v.xp_of(indices)
        bad = (indices < 0) | (indices >= (limit if xp is np else xp.asarray(limit)))
        if bool(bad.any()):
            k = int(xp.argmax(bad))
            t = int(table[k])
            raise IndexError(
                f"indices[{k}] = {int(indices[k])} (table {t}, entry {k - int(arrays['idx_offs'][t])}) is out of "
                f"range [0, {rows[t]}) (input_rows[{t}])"
            )
    return dict(indices=indices, **arrays), n_in, n_out


# The layouts of recent table lists, by their (num, rows, cols, permute): a training loop passes
# the same lists every step, and building the arrays took most of a small call (~100 us). Only
# calls of at most _LAYOUT_MAX_INDICES indices (a layout holds two int64 arrays of that length:
# at most 4 MiB kept); for larger calls the arrays are a small part of the work.
_LAYOUTS = BoundedCache(16)
_LAYOUT_MAX_INDICES = 1 << 14


def _tables_layout(num, rows, cols, permute):
    """``(arrays, table of each index, its table's row count, input size, output size)`` for the
    checked lists. The arrays are shared by every call with these lists: the kernels only read them
    (left writeable: the CUDA simulator copies into the arrays it was given as device arrays)."""
    T = len(num)
    n_in = sum(r * c for r, c in zip(rows, cols))
    n_out = sum(n * c for n, c in zip(num, cols))
    _fits("the inputs", n_in)
    _fits("the output", n_out)
    if permute and len(set(num)) > 1:
        raise ValueError(f"permute_output_dim_0_1 needs one batch size: input_num_indices are {num}")
    in_offs, idx_offs, sel_offs = (
        np.cumsum([0] + s, dtype=np.int64)
        for s in ([r * c for r, c in zip(rows, cols)], num, [n * c for n, c in zip(num, cols)])
    )
    if permute:  # row j of every table in output row j: tables side by side
        base, step = np.cumsum([0] + cols[:-1], dtype=np.int64)[:T], np.full(T, sum(cols), np.int64)
    else:  # each table's selected rows, tables one after another
        base, step = sel_offs[:T].copy(), np.array(cols, np.int64)
    table = np.repeat(np.arange(T), num)
    limit = np.array(rows, np.int64)[table]
    arrays = dict(
        in_offs=in_offs,
        idx_offs=idx_offs,
        sel_offs=sel_offs,
        cols=np.array(cols, np.int64),
        base=np.asarray(base, np.int64),
        step=step,
        rows=np.array(rows, np.int64),
    )
    return arrays, table, limit, n_in, n_out


@op("index_select", differentiable=("inputs",))
def batch_index_select_dim0(
    inputs, indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1=False
):
    """Row gathers of ``T`` tables packed in one flat array, packed again in one flat output.

    inputs: 1-D int32/int64/float16/32/64 ``[sum_t rows_t * cols_t]``: table ``t`` is the
    row-major ``[input_rows[t], input_columns[t]]`` block after table ``t - 1``'s. indices:
    1-D int32/int64 ``[sum_t input_num_indices[t]]``, table ``t``'s ``input_num_indices[t]``
    entries in ``[0, input_rows[t])``. The three lists: ``T`` ints ``>= 0``. Returns a 1-D
    array in the dtype of ``inputs``, of ``sum_t num_t * cols_t`` entries: the selected rows of
    each table, tables one after another; with ``permute_output_dim_0_1`` (every ``num_t`` one
    batch size ``B``), the ``[B, sum_t cols_t]`` array whose row ``b`` is the ``b``-th selected
    row of every table, side by side.

    Examples
    --------
    >>> inputs = np.arange(12.0)  # table 0: 3 rows of 2; table 1: 2 rows of 3
    >>> embnum.batch_index_select_dim0(inputs, np.array([2, 0, 1, 0]), [2, 2], [3, 2], [2, 3])
    array([ 4.,  5.,  0.,  1.,  9., 10., 11.,  6.,  7.,  8.])
    >>> embnum.batch_index_select_dim0(inputs, np.array([2, 0, 1, 0]), [2, 2], [3, 2], [2, 3], True).reshape(2, 5)
    array([[ 4.,  5.,  9., 10., 11.],
           [ 0.,  1.,  6.,  7.,  8.]])
    """
    v.array("inputs", inputs, ndim=1, dtypes=_VALUES)
    layout, n_in, n_out = _batch_layout(indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1)
    if inputs.shape[0] != n_in:
        raise ValueError(f"len(inputs) = {inputs.shape[0]} must equal sum(input_rows * input_columns) = {n_in}")
    return (dict(inputs=inputs, **layout), ((n_out,), inputs.dtype))


@op("index_select")
def batch_index_select_dim0_backward(
    grad_output, indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1=False
):
    """Adjoint of :func:`batch_index_select_dim0`: the gradient of its ``inputs``.

    grad_output: 1-D float16/32/64, the forward's output size; the other arguments as in the
    forward. Returns ``[sum_t rows_t * cols_t]`` in the dtype of ``grad_output``: zeros, plus for
    every selection the gradient of the row it produced, repeats added in ascending order of
    their position in ``indices``, in float32 (float64 for float64) and rounded once.

    Examples
    --------
    >>> grad = np.arange(1.0, 11.0)  # the output of the first example above
    >>> embnum.batch_index_select_dim0_backward(grad, np.array([2, 2, 1, 0]), [2, 2], [3, 2], [2, 3])
    array([ 0.,  0.,  0.,  0.,  4.,  6.,  8.,  9., 10.,  5.,  6.,  7.])
    """
    v.array("grad_output", grad_output, ndim=1, dtypes=_FLOATS)
    layout, n_in, n_out = _batch_layout(indices, input_num_indices, input_rows, input_columns, permute_output_dim_0_1)
    if grad_output.shape[0] != n_out:
        raise ValueError(
            f"len(grad_output) = {grad_output.shape[0]} must equal the forward's output size "
            f"sum(input_num_indices * input_columns) = {n_out}"
        )
    return (dict(grad_output=grad_output, **layout), ((n_in,), grad_output.dtype))


# -- 3. jagged_index_select_2d --------------------------------------------------------------------
@op("index_select")
def jagged_index_select_2d(values, indices, input_offsets, output_offsets, num_dense_output_rows=None):
    """The segments ``indices`` of a jagged 2-D array, one after another.

    values: 2-D ``[rows, D]`` int32/int64/float16/32/64, ``N`` segments of consecutive rows:
    segment ``s`` is rows ``[input_offsets[s - 1], input_offsets[s])`` (``0`` for ``s = 0``);
    input_offsets: 1-D int32/int64 ``[N]``, the inclusive sum of the segment lengths
    (non-negative, non-decreasing, at most ``rows``); indices: 1-D int32/int64 ``[M]`` in
    ``[0, N)`` (repeats allowed); output_offsets: 1-D int32/int64 ``[M]``, the inclusive sum of
    the lengths of the selected segments (a ``ValueError`` where it is not);
    num_dense_output_rows: None (all of them) or an int in ``[0, output_offsets[-1]]``: only
    the first rows of the result. Returns ``[num_dense_output_rows, D]`` in the dtype of
    ``values``: the rows of segment ``indices[0]``, then those of ``indices[1]``, ...

    Examples
    --------
    >>> values = np.arange(12.0).reshape(6, 2)  # segments of 2, 0, 3 and 1 rows
    >>> embnum.jagged_index_select_2d(values, np.array([2, 0, 3]), np.array([2, 2, 5, 6]), np.array([3, 5, 6]))
    array([[ 4.,  5.],
           [ 6.,  7.],
           [ 8.,  9.],
           [ 0.,  1.],
           [ 2.,  3.],
           [10., 11.]])
    """
    v.array("values", values, ndim=2, dtypes=_VALUES)
    for name, a in (("indices", indices), ("input_offsets", input_offsets), ("output_offsets", output_offsets)):
        v.index_array(name, a)
    n_seg, m = input_offsets.shape[0], indices.shape[0]
    if n_seg:
        v.offsets("input_offsets", input_offsets, n_values=values.shape[0])
    _in_range("indices", indices, n_seg, f" (input_offsets has {n_seg} segments)")
    if output_offsets.shape[0] != m:
        raise ValueError(f"output_offsets must have len(indices) = {m} entries, got {output_offsets.shape[0]}")
    xp = v.xp_of(values)
    ends = xp.concatenate([xp.zeros(1, np.int64), input_offsets.astype(np.int64)])
    picked = indices.astype(np.int64)
    src = ends[picked]
    dst = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(ends[picked + 1] - src)])
    if m:
        wrong = dst[1:] != output_offsets
        if bool(wrong.any()):
            j = int(xp.argmax(wrong))
            raise ValueError(
                f"output_offsets[{j}] = {int(output_offsets[j])}, but the selected segments "
                f"indices[0..{j}] hold {int(dst[j + 1])} rows: output_offsets must be their inclusive sum"
            )
    total = int(dst[-1])
    rows = total
    if num_dense_output_rows is not None:
        rows = v.integer("num_dense_output_rows", num_dense_output_rows, min=0, max=total)
    _fits("the output", rows * values.shape[1])
    return (dict(values=values, src=src, dst=dst, rows=rows), ((rows, values.shape[1]), values.dtype))
