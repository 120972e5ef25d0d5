"""Declarations of the jagged family (``docs/families/jagged.md``).

Each function below states an op's public signature and validates its
arguments; the registry turns it into ``embnum.<name>`` and finds the
implementations in ``embnum.{ref,cpu,cuda}.jagged``.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import _validate as v
from .._compare import exact_match, within
from .._registry import check, op

MAX_JAGGED_DIMS = 5


# -- shared checks ---------------------------------------------------------
_INT32 = np.dtype(np.int32)  # a dtype, not the type: comparing with the type converts it on every call
_INT32_MAX = v.INT32_MAX


@functools.cache
def _load_checks():
    from . import _checks_jagged

    return _checks_jagged


def _checks():
    """This family's compiled verdicts (``ops/_checks_jagged.py``, loaded on first use), or None
    where the shared compiled checks are not (Numba missing, or ``v.compiled`` stubbed by a test)."""
    return _load_checks() if v.compiled() is not None else None


def _int32_bound_fits(a, drop_last: bool) -> bool:
    """The compiled int32 prefix verdict's first step without Numba: True only where the min/max
    bound proves every running sum of a host int32 array fits (Python ints)."""
    n = a.shape[-1]
    if a.size == 0 or n == 0 or (drop_last and n < 2):
        return True
    lo, hi = int(a.min()), int(a.max())
    return hi * n <= _INT32_MAX and lo * n >= -_INT32_MAX


def _cumsum_fits_int32(name, lengths, drop_last):
    """ValueError when an int32 prefix sum (the output) would leave int32 (``lengths``: an int32
    index array; its callers have tested the dtype)."""
    if type(lengths) is _ND:  # host data: one verdict; a failing one runs the exact rule below
        checks = _checks()
        if (
            checks.int32_prefix_fits(lengths, drop_last)
            if checks is not None
            else _int32_bound_fits(lengths, drop_last)
        ):
            return
    n = lengths.shape[-1]
    if n == 0 or lengths.size == 0 or (drop_last and n < 2):
        return
    xp = v.xp_of(lengths)
    prefix = xp.cumsum(lengths.astype(xp.int64), axis=-1)  # int32 entries: the int64 prefix is exact
    if drop_last:
        prefix = prefix[..., :-1]
    top, bottom = (int(x) for x in v.read_ints(prefix.max(), prefix.min()))  # device data: one read
    if top > v.INT32_MAX or bottom < -(2**31):
        raise ValueError(f"prefix sum of {name} overflows int32; use int64 lengths")


def _jagged_offsets(offsets, n_values):
    """Validate a list of J offsets arrays (1 <= J <= 5) over ``n_values`` rows; return them and
    ``offsets[-1][-1]``. Every level's rules are read back in ONE device-to-host copy."""
    offsets = v.array_list("offsets", offsets, min_len=1, max_len=MAX_JAGGED_DIMS)
    for k, o in enumerate(offsets):
        v.index_array(f"offsets[{k}]", o)
        if o.shape[0] < 1:
            raise ValueError(f"offsets[{k}] must have at least 1 entry, got 0")
    summary = v.read_ints(*(p for o in offsets for p in v.offsets_parts(o))).reshape(-1, 3)
    for k, o in enumerate(offsets):
        name = f"offsets[{k}]"
        v.offsets(name, o, n_values=n_values if k == len(offsets) - 1 else None, summary=summary[k])
        if k >= 1:
            want = int(summary[k - 1][2]) + 1
            if o.shape[0] != want:
                raise ValueError(f"{name} must have offsets[{k - 1}][-1] + 1 = {want} entries, got {o.shape[0]}")
    return offsets, int(summary[-1][2])


def _value_array(name, a, ndim):
    return v.array(name, a, ndim=ndim, dtypes=v.VALUE_DTYPES)


# -- the per-call path --------------------------------------------------------
# On plain NumPy arrays and Python ints a declaration first asks ONE compiled pass (a generic
# reduction of ``v.compiled()``, or this family's verdict of ``_checks()``) per array for its verdict; when every rule
# holds the plan is built from that. A failing verdict, other argument types or a missing Numba take
# the exact rules, which raise the error (same types and messages whatever the path).
_ND = np.ndarray
_INDEX = v.INDEX_DTYPES
_VALUES = v.VALUE_DTYPES
_MAX = v.MAX_SIZE


def _host_index(a) -> bool:
    """``a`` is a plain 1-D NumPy int32/int64 array with at least one entry."""
    return type(a) is _ND and a.ndim == 1 and a.dtype in _INDEX and a.shape[0] > 0


def _host_size(x) -> bool:
    """``x`` is a Python int in ``[0, MAX_SIZE]`` (what ``v.size`` passes unchanged)."""
    return type(x) is int and 0 <= x <= _MAX


def _host_values(a, ndims) -> bool:
    return type(a) is _ND and a.ndim in ndims and a.dtype in _VALUES


def _host_levels(compiled, offsets, n_values):
    """``offsets[-1][-1]`` when ``offsets`` is a list/tuple of 1..5 host offsets arrays that pass
    every rule of :func:`_jagged_offsets` over ``n_values`` rows (``-1``: no bound), else -1."""
    if (type(offsets) is not list and type(offsets) is not tuple) or not 1 <= len(offsets) <= MAX_JAGGED_DIMS:
        return -1
    last, top = -1, len(offsets) - 1
    for k, o in enumerate(offsets):
        if not _host_index(o) or (k and o.shape[0] != last + 1):
            return -1
        last = compiled.offsets_last(o, False, n_values if k == top else -1)
        if last < 0:
            return -1
    return last


def _host_padding(value, dtype):
    """``v.scalar_for(value, dtype)`` for a Python int/float that converts without overflow or
    rounding questions, else None (then the exact conversion runs)."""
    t = type(value)
    if dtype.kind == "f":
        if (t is float or t is int) and -65504 <= value <= 65504:  # finite in every float dtype
            return dtype.type(float(value))
    elif t is int and -(2**31) <= value <= v.INT32_MAX:
        return dtype.type(value)
    return None


# -- 1. cumulative sums ----------------------------------------------------
@op("jagged")
def complete_cumsum(lengths):
    """Offsets from lengths: ``[N] -> [N+1]`` with a leading 0; ``[R, N] -> [R, N+1]`` row by row.

    lengths: int32/int64, 1-D or 2-D. Output: the dtype of ``lengths``.
    An int32 result that would overflow is a ``ValueError``.

    Examples
    --------
    >>> embnum.complete_cumsum(np.array([2, 0, 3, 1]))
    array([0, 2, 2, 5, 6])
    >>> embnum.complete_cumsum(np.array([[1, 2], [3, 0]], dtype=np.int32))
    array([[0, 1, 3],
           [0, 3, 3]], dtype=int32)
    """
    if type(lengths) is not _ND or lengths.dtype not in _INDEX or not 1 <= lengths.ndim <= 2:
        v.index_array("lengths", lengths, ndim=(1, 2))  # the exact rule (the common case tested inline above)
    dtype, shape = lengths.dtype, lengths.shape  # read once: each read is a getter call (shape builds a tuple)
    if dtype == _INT32:
        _cumsum_fits_int32("lengths", lengths, False)
    return {"lengths": lengths}, (shape[:-1] + (shape[-1] + 1,), dtype)


def _same_length_scan(lengths, drop_last):
    if type(lengths) is not _ND or lengths.dtype not in _INDEX or lengths.ndim != 1:
        v.index_array("lengths", lengths, ndim=1)  # the exact rule (the common case tested inline above)
    if lengths.dtype == _INT32:
        _cumsum_fits_int32("lengths", lengths, drop_last)
    return {"lengths": lengths}, (lengths.shape, lengths.dtype)


@op("jagged")
def exclusive_cumsum(lengths):
    """``[N] -> [N]``: ``out[i] = lengths[0] + ... + lengths[i-1]`` (``out[0] = 0``).

    lengths: int32/int64, exactly 1-D. Output: the dtype of ``lengths``.

    Examples
    --------
    >>> embnum.exclusive_cumsum(np.array([2, 0, 3, 1]))
    array([0, 2, 2, 5])
    """
    return _same_length_scan(lengths, True)  # the grand total is not an output


@op("jagged")
def inclusive_cumsum(lengths):
    """``[N] -> [N]``: ``out[i] = lengths[0] + ... + lengths[i]``.

    lengths: int32/int64, exactly 1-D. Output: the dtype of ``lengths``.

    Examples
    --------
    >>> embnum.inclusive_cumsum(np.array([2, 0, 3, 1]))
    array([2, 2, 5, 6])
    """
    return _same_length_scan(lengths, False)


# -- 2. offsets_range ------------------------------------------------------
@op("jagged")
def offsets_range(offsets, range_size):
    """Position of each element inside its segment: ``[range_size]``, dtype of ``offsets``.

    ``out[j] = j - max{offsets[k] : offsets[k] <= j}``. ``offsets`` (int32/int64,
    1-D) holds segment starts: the exclusive form ``[N]`` or the complete form
    ``[N+1]`` ending in ``range_size``. It must start at 0, be non-decreasing and
    stay within ``[0, range_size]``.

    Examples
    --------
    >>> embnum.offsets_range(np.array([0, 2, 2, 5]), 6)
    array([0, 1, 0, 1, 2, 0])
    """
    compiled = v.compiled()
    if (
        compiled is not None
        and _host_index(offsets)
        and _host_size(range_size)
        and (range_size <= _INT32_MAX or offsets.dtype != _INT32)
        and compiled.offsets_last(offsets, True, range_size) >= 0
    ):
        return (dict(offsets=offsets, range_size=range_size), ((range_size,), offsets.dtype))
    v.index_array("offsets", offsets)
    range_size = v.size("range_size", range_size)
    if offsets.dtype == np.int32 and range_size > v.INT32_MAX:
        raise ValueError(f"range_size = {range_size} does not fit the int32 offsets")
    if offsets.shape[0] == 0:
        if range_size != 0:
            raise ValueError(f"offsets is empty but range_size = {range_size} (must be 0)")
    else:
        v.offsets("offsets", offsets, n_values=range_size, first_zero=True)
    return (dict(offsets=offsets, range_size=range_size), ((range_size,), offsets.dtype))


# -- 3. segment_sum_csr ----------------------------------------------------
def _csr_runs(batch_size, csr_seg, n_values, values_name):
    batch_size = v.size("batch_size", batch_size)
    v.index_array("csr_seg", csr_seg)
    if csr_seg.shape[0] < 1:
        raise ValueError(f"csr_seg must have at least 1 entry, got {csr_seg.shape[0]}")
    summary = v.read_ints(*v.offsets_parts(csr_seg))  # one read: the rules and the last entry
    v.offsets("csr_seg", csr_seg, summary=summary)
    end = int(summary[2]) * batch_size
    if end > n_values:
        raise ValueError(
            f"csr_seg[-1] * batch_size = {int(csr_seg[-1])} * {batch_size} = {end} exceeds "
            f"len({values_name}) = {n_values}"
        )
    return batch_size


@op("jagged", differentiable=("values",))
def segment_sum_csr(batch_size, csr_seg, values):
    """Sums of runs of ``values``: ``out[i] = sum(values[csr_seg[i]*batch_size : csr_seg[i+1]*batch_size])``.

    batch_size: int >= 0. csr_seg: int32/int64 ``[S+1]``, non-decreasing, ``>= 0``.
    values: 1-D float16/float32/float64/int32/int64. Output ``[S]``, dtype of
    ``values``; float16 is accumulated in float32 and rounded once (``embnum._half``; the oracle sums wider),
    integers wrap.

    Examples
    --------
    >>> embnum.segment_sum_csr(2, np.array([0, 1, 1, 3]), np.arange(1.0, 7.0))
    array([ 3.,  0., 18.])
    """
    checks = _checks()
    if (
        checks is None
        or not (_host_values(values, (1,)) and _host_size(batch_size) and _host_index(csr_seg))
        or not checks.csr_ok(csr_seg, batch_size, values.shape[0])
    ):  # the exact rules (they raise)
        _value_array("values", values, 1)
        batch_size = _csr_runs(batch_size, csr_seg, values.shape[0], "values")
    return (
        dict(batch_size=batch_size, csr_seg=csr_seg, values=values),
        ((csr_seg.shape[0] - 1,), values.dtype),
    )


@op("jagged")
def segment_sum_csr_backward(batch_size, csr_seg, grad_output, num_values):
    """Adjoint of :func:`segment_sum_csr`: ``[num_values]``, ``grad_output[i]`` on every element
    of run ``i`` and 0 on elements in no run.

    grad_output: 1-D ``[S]`` (``S = len(csr_seg) - 1``), any value dtype;
    num_values: int ``>= csr_seg[-1] * batch_size``.

    Examples
    --------
    >>> embnum.segment_sum_csr_backward(2, np.array([0, 1, 1, 3]), np.array([1.0, 2.0, 3.0]), 7)
    array([1., 1., 3., 3., 3., 3., 0.])
    """
    checks = _checks()
    if (
        checks is None
        or not (_host_values(grad_output, (1,)) and _host_size(num_values) and _host_size(batch_size))
        or not (_host_index(csr_seg) and grad_output.shape[0] == csr_seg.shape[0] - 1)
        or not checks.csr_ok(csr_seg, batch_size, num_values)
    ):  # the exact rules (they raise)
        _value_array("grad_output", grad_output, 1)
        num_values = v.size("num_values", num_values)
        batch_size = _csr_runs(batch_size, csr_seg, num_values, "values (num_values)")
    if grad_output.shape[0] != csr_seg.shape[0] - 1:
        raise ValueError(
            f"grad_output must have len(csr_seg) - 1 = {csr_seg.shape[0] - 1} entries, got {grad_output.shape[0]}"
        )
    return (
        dict(batch_size=batch_size, csr_seg=csr_seg, grad_output=grad_output, num_values=num_values),
        ((num_values,), grad_output.dtype),
    )


# -- 4. jagged_to_padded_dense ---------------------------------------------
@op("jagged", differentiable=("values",))
def jagged_to_padded_dense(values, offsets, max_lengths, padding_value=0.0):
    """Scatter a jagged tensor with ``J`` jagged dims into a padded dense array.

    values: ``[N, D]`` or ``[N]``, float16/32/64 or int32/64. offsets: list of
    ``J`` (1..5) int32/int64 arrays, ``offsets[0]`` of length ``B+1``,
    ``offsets[k]`` of length ``offsets[k-1][-1] + 1``. max_lengths: ``J`` ints
    ``>= 0``. Output ``[B, *max_lengths, D]`` (no ``D`` for 1-D values), dtype of
    ``values``; positions past a segment's end hold ``padding_value``, segments
    longer than the maximum are truncated.

    Examples
    --------
    >>> values = np.arange(1.0, 7.0).reshape(3, 2)
    >>> embnum.jagged_to_padded_dense(values, [np.array([0, 2, 2, 3])], [2], padding_value=-1.0)
    array([[[ 1.,  2.],
            [ 3.,  4.]],
    <BLANKLINE>
           [[-1., -1.],
            [-1., -1.]],
    <BLANKLINE>
           [[ 5.,  6.],
            [-1., -1.]]])
    """
    plan = _padded_fast(values, (1, 2), offsets, max_lengths, padding_value)
    if plan is not None:
        return plan
    _value_array("values", values, (1, 2))
    offsets, _ = _jagged_offsets(offsets, values.shape[0])
    max_lengths = v.int_list("max_lengths", max_lengths)
    if len(max_lengths) != len(offsets):
        raise ValueError(f"max_lengths must have len(offsets) = {len(offsets)} entries, got {len(max_lengths)}")
    pad = v.scalar_for("padding_value", padding_value, values.dtype)
    B = offsets[0].shape[0] - 1
    shape = (B, *max_lengths) + tuple(values.shape[1:])
    if not v.shape_fits(shape + (values.dtype.itemsize,)):
        raise ValueError(f"max_lengths = {max_lengths} give an output of shape {shape}, above the size limit 2**48")
    return (dict(values=values, offsets=offsets, max_lengths=max_lengths, padding_value=pad), (shape, values.dtype))


def _padded_fast(values, ndims, offsets, max_lengths, padding_value):
    """The plan of :func:`jagged_to_padded_dense` from one compiled pass per offsets level when every
    rule holds on host data (``values`` of ``ndims`` dims), else None."""
    compiled = v.compiled()
    if compiled is None or not _host_values(values, ndims) or _host_levels(compiled, offsets, values.shape[0]) < 0:
        return None
    if type(max_lengths) is not list and type(max_lengths) is not tuple or len(max_lengths) != len(offsets):
        return None
    for x in max_lengths:
        if not _host_size(x):
            return None
    pad = _host_padding(padding_value, values.dtype)
    shape = (offsets[0].shape[0] - 1, *max_lengths) + values.shape[1:]
    if pad is None or not v.shape_fits(shape + (values.dtype.itemsize,)):
        return None
    offsets, max_lengths = list(offsets), list(max_lengths)
    return (dict(values=values, offsets=offsets, max_lengths=max_lengths, padding_value=pad), (shape, values.dtype))


@op("jagged", differentiable=("values",), same_as="jagged_to_padded_dense")
def jagged_1d_to_dense(values, offsets, max_sequence_length, padding_value=0):
    """``jagged_to_padded_dense(values, [offsets], [max_sequence_length], padding_value)``
    for exactly 1-D ``values``: output ``[B, max_sequence_length]``.

    Examples
    --------
    >>> embnum.jagged_1d_to_dense(np.array([10, 11, 12, 13]), np.array([0, 2, 3, 3, 4]), 2, -1)
    array([[10, 11],
           [12, -1],
           [-1, -1],
           [13, -1]])
    """
    plan = _padded_fast(values, (1,), [offsets], [max_sequence_length], padding_value)
    if plan is not None:
        return plan
    _value_array("values", values, 1)
    v.index_array("offsets", offsets)
    L = v.size("max_sequence_length", max_sequence_length)
    return jagged_to_padded_dense.op.declaration(values, [offsets], [L], padding_value)


@op("jagged", differentiable=("values",), same_as="jagged_to_padded_dense")
def jagged_2d_to_dense(values, offsets, max_sequence_length):
    """``jagged_to_padded_dense(values, [offsets], [max_sequence_length], 0.0)`` for exactly
    2-D ``values [N, D]``: output ``[B, max_sequence_length, D]``.

    Examples
    --------
    >>> embnum.jagged_2d_to_dense(np.arange(6.0).reshape(3, 2), np.array([0, 1, 3]), 2)
    array([[[0., 1.],
            [0., 0.]],
    <BLANKLINE>
           [[2., 3.],
            [4., 5.]]])
    """
    plan = _padded_fast(values, (2,), [offsets], [max_sequence_length], 0.0)
    if plan is not None:
        return plan
    _value_array("values", values, 2)
    v.index_array("offsets", offsets)
    L = v.size("max_sequence_length", max_sequence_length)
    return jagged_to_padded_dense.op.declaration(values, [offsets], [L], 0.0)


# -- 5. dense_to_jagged ----------------------------------------------------
@op("jagged", differentiable=("dense",))
def dense_to_jagged(dense, offsets, total_L=None):
    """Gather the valid positions of ``dense [B, M_1..M_J, D]`` into jagged values ``[total_L, D]``.

    offsets: as in :func:`jagged_to_padded_dense`, ``len(offsets[0]) == B + 1``.
    total_L: output rows, ``None`` for ``offsets[-1][-1]``; extra rows are 0, and
    so is every row no dense position reaches (truncated tails included).
    Returns the values only (fbgemm also returns the offsets).

    Examples
    --------
    >>> dense = np.arange(1.0, 9.0).reshape(2, 2, 2)
    >>> embnum.dense_to_jagged(dense, [np.array([0, 1, 4])])
    array([[1., 2.],
           [5., 6.],
           [7., 8.],
           [0., 0.]])
    """
    compiled = v.compiled()
    if compiled is not None and type(dense) is _ND and dense.dtype in _VALUES:
        last = _host_levels(compiled, offsets, -1)
        if (
            0 <= last <= _MAX
            and dense.ndim == len(offsets) + 2
            and offsets[0].shape[0] == dense.shape[0] + 1
            and (total_L is None or (_host_size(total_L) and total_L >= last))
        ):
            total_L = last if total_L is None else total_L
            return (
                dict(dense=dense, offsets=list(offsets), total_L=total_L),
                ((total_L, dense.shape[-1]), dense.dtype),
            )
    v.array("dense", dense, dtypes=v.VALUE_DTYPES)
    offsets = v.array_list("offsets", offsets, min_len=1, max_len=MAX_JAGGED_DIMS)
    J = len(offsets)
    if dense.ndim != J + 2:
        raise ValueError(
            f"dense must have len(offsets) + 2 = {J + 2} dims [B, M_1..M_{J}, D], got shape {tuple(dense.shape)}"
        )
    B = dense.shape[0]
    if offsets[0].ndim == 1 and offsets[0].shape[0] != B + 1:
        raise ValueError(f"offsets[0] must have dense.shape[0] + 1 = {B + 1} entries, got {offsets[0].shape[0]}")
    offsets, last = _jagged_offsets(offsets, None)
    needed = v.size(f"offsets[{J - 1}][-1]", last)  # the output's rows: bounded before allocation
    total_L = needed if total_L is None else v.size("total_L", total_L)
    if total_L < needed:
        raise ValueError(f"total_L = {total_L} is smaller than offsets[-1][-1] = {needed}")
    return (dict(dense=dense, offsets=offsets, total_L=total_L), ((total_L, dense.shape[-1]), dense.dtype))


# -- oracle comparisons ----------------------------------------------------
@check(segment_sum_csr)
def _segment_sum_close(got, want, args):
    """Per-run error bound (``docs/families/jagged.md``): ``rtol * sum(|v|)`` (float), exact (int)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind != "f" or got.shape != want.shape or got.dtype != want.dtype:
        return exact_match(got, want)
    csr = np.asarray(args["csr_seg"]).astype(np.int64) * args["batch_size"]
    vals = np.abs(np.asarray(args["values"]).astype(np.float64))
    scale = np.array([vals[a:b].sum() for a, b in zip(csr[:-1], csr[1:])])
    if got.dtype == np.float16:
        # one float16 ulp of the result (plus float32 accumulation error)
        tol = np.spacing(np.abs(want)).astype(np.float64) + 1e-6 * scale
    else:
        tol = (1e-12 if got.dtype == np.float64 else 1e-5) * scale + 1e-30
    return within(got, want, tol)
