"""Declarations of the keyed_tensor family (``docs/families/keyed_tensor.md``).

Pooled-embedding permutes: a full permutation of the column groups of one
``[B, D]`` array (``permute_pooled_embs``), and regrouping the column groups
of several KeyedTensors into new ones, keys used any number of times
(``kt_regroup_arguments``, ``permute_multi_embedding`` and its backward,
``regroup_keyed_tensor``). Every index argument is checked here, on the host,
before any kernel runs.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import _permute_plan as plan
from .. import _validate as v
from .._cache import BoundedCache
from .._compare import same_bits
from .._registry import check, op

# permutes columns
IN_TENSOR, OUT_TENSOR, IN_OFFSET, OUT_OFFSET, LENGTH, NEXT = range(6)
_COLUMNS = ("in_tensor", "out_tensor", "in_offset", "out_offset", "length", "next")


def host(a) -> np.ndarray:
    """A small index array as a host int64 NumPy array (a copy from the device for CuPy)."""
    return v.to_host(a, np.int64)


def _read_together(arrays) -> list:
    """Host int64 copies of the integer ``arrays`` (any shapes) in ONE device-to-host copy, kept
    for the fast path's planning in this call (``_permute_plan.remember``)."""
    flat = v.read_ints(*(a.reshape(-1) for a in arrays))
    copies, at = [], 0
    for a in arrays:
        copies.append(flat[at : at + a.size].reshape(a.shape))
        at += a.size
    plan.remember(zip(arrays, copies))
    return copies


# -- shared checks ---------------------------------------------------------
def _float_list(name, arrays):
    """Non-empty list of 2-D float16/32/64 arrays of one dtype and one B; returns (list, B, dtype)."""
    if type(arrays) is list and arrays and type(arrays[0]) is np.ndarray:  # the per-call case: one pass
        first = arrays[0]
        dtype, B = first.dtype, first.shape[0] if first.ndim == 2 else -1
        if dtype in v.FLOAT_DTYPES and B >= 0:
            for a in arrays:
                if type(a) is not np.ndarray or a.ndim != 2 or a.dtype != dtype or a.shape[0] != B:
                    break
            else:
                return arrays, B, dtype
    arrays = v.array_list(name, arrays, min_len=1)
    for i, a in enumerate(arrays):
        v.array(f"{name}[{i}]", a, ndim=2, dtypes=v.FLOAT_DTYPES)
    dtype, B = arrays[0].dtype, arrays[0].shape[0]
    for i, a in enumerate(arrays[1:], 1):
        if a.dtype != dtype:
            raise TypeError(f"{name}[{i}] has dtype {a.dtype} but {name}[0] has {dtype}: one dtype per call")
        if a.shape[0] != B:
            raise ValueError(f"{name}[{i}] has {a.shape[0]} rows but {name}[0] has {B}: one B per call")
    return arrays, B, dtype


def _shapes(name, shapes, want, want_name, copy=None):
    """``shapes``: 1-D int32/int64 array equal to the list ``want`` (``copy``: its host copy)."""
    v.index_array(name, shapes)
    got = (host(shapes) if copy is None else copy).tolist()
    if len(got) != len(want):
        raise ValueError(f"{name} must have {len(want)} entries ({want_name}), got {len(got)}")
    for k, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise ValueError(f"{name}[{k}] = {g} but {want_name} gives {w}")


_VALID = BoundedCache(256)  # (permutes bytes, widths) of rows already validated: a training loop reuses one permute


def _permutes_shape(permutes):
    v.index_array("permutes", permutes, ndim=2)
    if permutes.shape[1] != 6:
        raise ValueError(f"permutes must have shape [P, 6], got {tuple(permutes.shape)}")


def _rows(permutes, in_widths, out_widths, in_name, out_name, rows=None):
    """Validate the ``[P, 6]`` permutes against the input and output widths (the same
    rules for the forward and the backward); return it as host int64 (``rows``: its copy)."""
    _permutes_shape(permutes)
    rows = host(permutes) if rows is None else rows
    key = (rows.tobytes(), tuple(in_widths), tuple(out_widths))
    if _VALID.get(key):
        return rows
    _check_rows(rows, in_widths, out_widths, in_name, out_name)
    _VALID.put(key, True)
    return rows


def _check_rows(rows, in_widths, out_widths, in_name, out_name):
    P = rows.shape[0]
    if P == 0:
        return rows
    _in_range(rows, IN_TENSOR, 0, len(in_widths), in_name)
    _in_range(rows, OUT_TENSOR, 0, len(out_widths), out_name)
    _in_range(rows, LENGTH, 0, None, None)
    _in_range(rows, NEXT, -P, P, None)
    for side, t_col, o_col, widths in (
        ("in", IN_TENSOR, IN_OFFSET, in_widths),
        ("out", OUT_TENSOR, OUT_OFFSET, out_widths),
    ):
        _in_range(rows, o_col, 0, None, None)
        limit = np.asarray(widths, dtype=np.int64)[rows[:, t_col]]
        bad = v.spans_exceed(rows[:, o_col], rows[:, LENGTH], limit)  # offset + length would wrap
        if bad.any():
            r = int(np.argmax(bad))
            raise ValueError(
                f"permutes[{r}]: {_COLUMNS[o_col]} + length = {rows[r, o_col]} + {rows[r, LENGTH]} "
                f"exceeds the width {limit[r]} of {side}put {rows[r, t_col]}"
            )
    _no_overlap(rows, OUT_TENSOR, OUT_OFFSET, "output")


def _in_range(rows, col, lo, hi, what):
    x = rows[:, col]
    bad = (x < lo) | ((x >= hi) if hi is not None else False)
    if bad.any():
        r = int(np.argmax(bad))
        want = f">= {lo}" if hi is None else f"in [{lo}, {hi})" + (f" (len({what}))" if what else "")
        raise ValueError(f"permutes[{r}, {col}] ({_COLUMNS[col]}) = {x[r]} must be {want}")


def _no_overlap(rows, t_col, o_col, what):
    """No two rows with length > 0 write overlapping columns of one output."""
    live = np.flatnonzero(rows[:, LENGTH] > 0)
    if live.size < 2:
        return
    order = live[np.lexsort((rows[live, o_col], rows[live, t_col]))]
    t, start, end = rows[order, t_col], rows[order, o_col], rows[order, o_col] + rows[order, LENGTH]
    clash = (t[1:] == t[:-1]) & (start[1:] < end[:-1])
    if clash.any():
        k = int(np.argmax(clash))
        a, b = sorted((int(order[k]), int(order[k + 1])))
        raise ValueError(f"permutes rows {a} and {b} write overlapping columns of {what} {t[k]}")


# -- 1. permute_pooled_embs ------------------------------------------------
def _cumsum_list(name, offs, D=None, o=None):
    v.index_array(name, offs)
    o = host(offs) if o is None else o
    if o.shape[0] < 1:
        raise ValueError(f"{name} must have at least 1 entry, got 0")
    if o[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {o[0]}")
    drop = np.flatnonzero(o[1:] < o[:-1])
    if drop.size:
        i = int(drop[0]) + 1
        raise ValueError(f"{name} must be non-decreasing, but {name}[{i}] = {o[i]} < {name}[{i - 1}] = {o[i - 1]}")
    if D is not None and o[-1] != D:
        raise ValueError(f"{name}[-1] must equal pooled_embs.shape[1] = {D}, got {o[-1]}")
    return o


@functools.cache
def _load_checks():
    from . import _checks_keyed_tensor

    return _checks_keyed_tensor


def _checks():
    """This family's compiled verdict (``ops/_checks_keyed_tensor.py``, loaded on first use), or None where
    the shared compiled checks are not (Numba missing, or ``v.compiled`` stubbed by a test)."""
    return _load_checks() if v.compiled() is not None else None


_POOLED_NAMES = ("offset_dim_list", "permute_list", "inv_offset_dim_list", "inv_permute_list")


def _pooled_rules(D, lists):
    """Every rule on the four lists of ``permute_pooled_embs``, in order, raising on the first
    broken one (on host copies read in one device-to-host copy; ``_checks_keyed_tensor.pooled_lists_ok``
    is the same rules as one verdict)."""
    offset_dim_list, _, inv_offset_dim_list, _ = lists
    offs_h, perm, inv_offs_h, inv = _read_together(lists)  # one read for the four lists
    offs = _cumsum_list("offset_dim_list", offset_dim_list, D, offs_h)
    T = offs.shape[0] - 1
    if perm.shape[0] != T:
        raise ValueError(f"permute_list must have len(offset_dim_list) - 1 = {T} entries, got {perm.shape[0]}")
    bad = np.flatnonzero((perm < 0) | (perm >= T))
    if bad.size:
        raise ValueError(f"permute_list[{bad[0]}] = {perm[bad[0]]} is not in [0, {T})")
    seen = np.full(T, -1, dtype=np.int64)
    for t, p in enumerate(perm.tolist()):
        if seen[p] >= 0:
            raise ValueError(f"permute_list[{t}] = {p} repeats permute_list[{seen[p]}]: it must be a permutation")
        seen[p] = t
    if inv.shape[0] != T:
        raise ValueError(f"inv_permute_list must have {T} entries, got {inv.shape[0]}")
    wrong = np.flatnonzero(inv != seen)
    if wrong.size:
        p = int(wrong[0])
        raise ValueError(f"inv_permute_list[{p}] = {inv[p]} but permute_list[{seen[p]}] = {p}: not the inverse")
    inv_offs = _cumsum_list("inv_offset_dim_list", inv_offset_dim_list, None, inv_offs_h)
    want = np.concatenate([[0], np.cumsum(np.diff(offs)[perm])]).astype(np.int64)
    if inv_offs.shape[0] != T + 1:
        raise ValueError(f"inv_offset_dim_list must have {T + 1} entries, got {inv_offs.shape[0]}")
    wrong = np.flatnonzero(inv_offs != want)
    if wrong.size:
        k = int(wrong[0])
        raise ValueError(f"inv_offset_dim_list[{k}] = {inv_offs[k]} but the permuted widths give {want[k]}")


@op("keyed_tensor", differentiable=("pooled_embs",))
def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    """Permute the ``T`` column groups of ``pooled_embs [B, D]``: output group ``t`` is input group
    ``permute_list[t]``, placed at column ``inv_offset_dim_list[t]``.

    pooled_embs: exactly 2-D, float16/32/64 or int32/64. The four lists: 1-D int32/int64,
    ``offset_dim_list [T+1]`` the cumsum of the group widths (ending at ``D``),
    ``permute_list [T]`` a permutation, ``inv_permute_list [T]`` its inverse,
    ``inv_offset_dim_list [T+1]`` the cumsum of the permuted widths. All four are validated.
    Output ``[B, D]``, dtype of ``pooled_embs`` (exact copies).

    Examples
    --------
    >>> embs = np.arange(6.0).reshape(2, 3)  # groups: column 0 | columns 1, 2
    >>> embnum.permute_pooled_embs(embs, np.array([0, 1, 3]), np.array([1, 0]), np.array([0, 2, 3]), np.array([1, 0]))
    array([[1., 2., 0.],
           [4., 5., 3.]])
    """
    v.array("pooled_embs", pooled_embs, ndim=2, dtypes=v.VALUE_DTYPES)
    D = pooled_embs.shape[1]
    lists = (offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list)
    for name, a in zip(_POOLED_NAMES, lists):
        v.index_array(name, a)
    checks = _checks()
    if not (
        checks is not None
        and type(offset_dim_list) is np.ndarray
        and type(permute_list) is np.ndarray
        and type(inv_offset_dim_list) is np.ndarray
        and type(inv_permute_list) is np.ndarray
        and checks.pooled_lists_ok(*lists, D)
    ):
        _pooled_rules(D, lists)  # device arrays, or a rule broken: the exact checks, which name it
    return (
        dict(
            pooled_embs=pooled_embs,
            offset_dim_list=offset_dim_list,
            permute_list=permute_list,
            inv_offset_dim_list=inv_offset_dim_list,
            inv_permute_list=inv_permute_list,
        ),
        (pooled_embs.shape, pooled_embs.dtype),
    )


# -- 2. kt_regroup_arguments -----------------------------------------------
def _str_lists(name, x):
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of lists of str, got {type(x).__name__}")
    for i, inner in enumerate(x):
        if not isinstance(inner, (list, tuple)):
            raise TypeError(f"{name}[{i}] must be a list of str, got {type(inner).__name__}")
        for j, k in enumerate(inner):
            if not isinstance(k, str):
                raise TypeError(f"{name}[{i}][{j}] must be a str, got {k!r}")
    return [list(inner) for inner in x]


_KEYS_OK = BoundedCache(256)  # key lists already validated -> their normalised form (tuples)


def _keys_key(keys, lengths, groups):
    """``keys``/``lengths``/``groups`` as nested tuples, a key of :data:`_KEYS_OK`, or None where
    they are not lists/tuples of lists/tuples with exactly-``int`` lengths (the cache is then not
    used). Why a hit is never wrong: validation is a function of the content alone, the key is the
    content (str keys compare as str; the lengths are exactly ``int``, so no ``96.0`` or ``True``
    can equal a validated ``96`` or ``1``), and a hit returns the normalised lists stored when the
    content was validated, not the caller's objects."""
    try:
        lens = tuple(map(tuple, lengths))
        for ls in lens:
            for n in ls:
                if type(n) is not int:
                    return None
        key = tuple(map(tuple, keys)), lens, tuple(map(tuple, groups))
        hash(key)
        return key
    except TypeError:  # not iterable, or an item not hashable: the full checks say what is wrong
        return None


def regroup_keys(keys, lengths, groups):
    """Validate ``keys``/``lengths``/``groups``; return them normalised (lists of lists, ints)."""
    return _regrouping(keys, lengths, groups)[:3]


def _regrouping(keys, lengths, groups):
    """:func:`regroup_keys` plus the widths it implies: ``(keys, lengths, groups, in_widths,
    out_widths)`` (``in_widths[i] = sum(lengths[i])``, ``out_widths[j]`` the width of group
    ``j``), from :data:`_KEYS_OK` when these key lists were validated before."""
    key = _keys_key(keys, lengths, groups) if type(keys) in (list, tuple) else None
    found = _KEYS_OK.get(key) if key is not None else None
    if found is not None:
        k, n, g, ins, outs = found
        return [list(x) for x in k], [list(x) for x in n], [list(x) for x in g], ins, outs
    keys, norm, groups = _regroup_keys(keys, lengths, groups)
    width = {k: n for ks, ls in zip(keys, norm) for k, n in zip(ks, ls)}
    ins = tuple(sum(ls) for ls in norm)
    outs = tuple(sum(width[k] for k in g) for g in groups)
    if key is not None:
        _KEYS_OK.put(key, (tuple(map(tuple, keys)), tuple(map(tuple, norm)), tuple(map(tuple, groups)), ins, outs))
    return keys, norm, groups, ins, outs


def _regroup_keys(keys, lengths, groups):
    """The rules of :func:`regroup_keys`, raising on the first broken one."""
    keys = _str_lists("keys", keys)
    groups = _str_lists("groups", groups)
    if not isinstance(lengths, (list, tuple)):
        raise TypeError(f"lengths must be a list of lists of ints, got {type(lengths).__name__}")
    if len(lengths) != len(keys):
        raise ValueError(f"lengths must have len(keys) = {len(keys)} lists, got {len(lengths)}")
    norm, where = [], {}
    for i, (ks, ls) in enumerate(zip(keys, lengths)):
        if not isinstance(ls, (list, tuple)):
            raise TypeError(f"lengths[{i}] must be a list of ints, got {type(ls).__name__}")
        if len(ls) != len(ks):
            raise ValueError(f"lengths[{i}] must have len(keys[{i}]) = {len(ks)} entries, got {len(ls)}")
        row = []
        for j, n in enumerate(ls):
            row.append(n if type(n) is int and 0 <= n <= v.MAX_SIZE else v.size(f"lengths[{i}][{j}]", n))
            k = ks[j]
            if k in where:
                raise ValueError(f"key {k!r} appears twice in keys: keys{list(where[k])} and keys[{i}][{j}]")
            where[k] = (i, j)
        if sum(row) > v.INT32_MAX:
            raise ValueError(f"input {i} is {sum(row)} columns wide, above 2**31 - 1")
        norm.append(row)
    for j, g in enumerate(groups):
        for m, k in enumerate(g):
            if k not in where:
                raise ValueError(f"groups[{j}][{m}] = {k!r} is not a key of any input")
        width = sum(norm[where[k][0]][where[k][1]] for k in g)
        if width > v.INT32_MAX:
            raise ValueError(f"output {j} is {width} columns wide, above 2**31 - 1")
    return keys, norm, groups


@op("keyed_tensor", returns="computed")
def kt_regroup_arguments(embs, keys, lengths, groups):
    """Build ``(permutes, in_shapes, out_shapes, out_lengths)`` for :func:`permute_multi_embedding`.

    embs: a NumPy/CuPy array or None; only its kind matters (the three arrays come back as
    NumPy for NumPy/None, CuPy for CuPy). keys: ``n_in`` lists of str; lengths: the widths,
    same nesting; groups: ``n_out`` lists of str. Returns int32 ``permutes [P, 6]`` (one row
    ``(in_tensor, out_tensor, in_offset, out_offset, length, next)`` per entry of the
    flattened groups), int32 ``in_shapes [n_in]``, int32 ``out_shapes [n_out]`` and the
    Python list ``out_lengths``. ``next`` links the rows of a key used several times
    (``docs/families/keyed_tensor.md``).

    Examples
    --------
    >>> keys, lengths, groups = [['a', 'b'], ['c']], [[2, 1], [3]], [['c', 'a'], ['b', 'a']]
    >>> permutes, in_shapes, out_shapes, out_lengths = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    >>> permutes
    array([[ 1,  0,  0,  0,  3,  0],
           [ 0,  0,  0,  3,  2,  3],
           [ 0,  1,  2,  0,  1,  0],
           [ 0,  1,  0,  1,  2, -4]], dtype=int32)
    >>> out_lengths
    [5, 3]
    """
    if embs is not None:
        v.array("embs", embs)
    keys, lengths, groups = regroup_keys(keys, lengths, groups)
    return (dict(embs=embs, keys=keys, lengths=lengths, groups=groups), None)


# -- 3. permute_multi_embedding --------------------------------------------
def _read_shapes_and_rows(in_shapes, out_shapes, permutes):
    """Host copies of the three index arrays, checked for kind and shape first, in one read."""
    v.index_array("in_shapes", in_shapes)
    v.index_array("out_shapes", out_shapes)
    _permutes_shape(permutes)
    return _read_together((in_shapes, out_shapes, permutes))


@op("keyed_tensor", returns="list", differentiable=("pooled_embs",))
def permute_multi_embedding(pooled_embs, permutes, in_shapes, out_shapes, out_lengths):
    """Copy column slices of several ``[B, D_i]`` arrays into several ``[B, E_j]`` outputs.

    pooled_embs: non-empty list of 2-D float16/32/64 arrays, one dtype, one ``B``.
    permutes: int32/int64 ``[P, 6]``: for each row ``(i, j, a, c, n, next)``,
    ``out[j][:, c:c+n] = pooled_embs[i][:, a:a+n]``. in_shapes/out_shapes: int32/int64
    ``[n_in]``/``[n_out]`` equal to the input widths / ``out_lengths``. out_lengths:
    ints ``>= 0``. Returns ``n_out`` arrays ``[B, out_lengths[j]]``; columns no row covers
    are 0. Every row is validated (ranges, widths, no overlapping writes).

    Examples
    --------
    >>> embs = [np.arange(6.0).reshape(2, 3), np.full((2, 1), 9.0)]  # keys a (2 columns), b | c
    >>> args = embnum.kt_regroup_arguments(None, [['a', 'b'], ['c']], [[2, 1], [1]], [['c', 'a']])
    >>> embnum.permute_multi_embedding(embs, *args)
    [array([[9., 0., 1.],
           [9., 3., 4.]])]
    """
    return _permute_plan(True, "pooled_embs", pooled_embs, "out_lengths", out_lengths, permutes, in_shapes, out_shapes)


@op("keyed_tensor", returns="list")
def permute_multi_embedding_backward(grad_outputs, permutes, in_shapes, out_shapes, in_lengths):
    """Adjoint of :func:`permute_multi_embedding`: ``n_in`` arrays ``[B, in_lengths[i]]``.

    Starting from zeros, for each row ``(i, j, a, c, n, next)`` in ascending row order,
    ``grad[i][:, a:a+n] += grad_outputs[j][:, c:c+n]`` rounded to the dtype after every
    addition (float16 included). Duplicated keys are summed in row order; columns no
    row covers (unused keys) are 0. ``next`` is range-checked, never followed.
    grad_outputs: non-empty list of ``[B, out_shapes[j]]`` float16/32/64 arrays;
    in_lengths: ints, equal to ``in_shapes``.

    Examples
    --------
    >>> keys, lengths, groups = [['a', 'b']], [[1, 1]], [['a'], ['a', 'b']]  # a is used twice
    >>> permutes, in_shapes, out_shapes, out_lengths = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    >>> grads = [np.ones((1, 1)), np.full((1, 2), 2.0)]
    >>> embnum.permute_multi_embedding_backward(grads, permutes, in_shapes, out_shapes, [2])  # a: 1 + 2
    [array([[3., 2.]])]
    """
    return _permute_plan(False, "grad_outputs", grad_outputs, "in_lengths", in_lengths, permutes, in_shapes, out_shapes)


def _sizes(name, x) -> list:
    """``v.int_list(name, x)``, with a plain list of Python ints in range taken in one loop."""
    if type(x) is list:
        for n in x:
            if type(n) is not int or n < 0 or n > v.MAX_SIZE:
                break
        else:
            return x
    return v.int_list(name, x)


def _permute_rules(forward, arrays_name, widths, lengths_name, lengths, permutes, in_shapes, out_shapes):
    """Every rule on the index arrays of :func:`permute_multi_embedding` (and its adjoint),
    raising on the first broken one; host copies read in one device-to-host copy."""
    got = dict(zip(("in_shapes", "out_shapes", "permutes"), _read_shapes_and_rows(in_shapes, out_shapes, permutes)))
    shapes = {"in_shapes": in_shapes, "out_shapes": out_shapes}
    arrays_shapes, lengths_shapes = ("in_shapes", "out_shapes") if forward else ("out_shapes", "in_shapes")
    _shapes(arrays_shapes, shapes[arrays_shapes], widths, f"the widths of {arrays_name}", got[arrays_shapes])
    _shapes(lengths_shapes, shapes[lengths_shapes], lengths, lengths_name, got[lengths_shapes])
    sides = [(widths, arrays_name), (lengths, lengths_name)]
    (in_widths, in_name), (out_widths, out_name) = sides if forward else sides[::-1]
    _rows(permutes, in_widths, out_widths, in_name, out_name, got["permutes"])


def _permute_plan(forward, arrays_name, arrays, lengths_name, lengths, permutes, in_shapes, out_shapes):
    """The checks and plan of :func:`permute_multi_embedding` (``forward``: ``arrays`` are the
    inputs, ``lengths`` the output widths) and of its adjoint (``arrays`` are the output
    gradients, ``lengths`` the input widths): one rule, the two sides swapped. Returns one
    ``[B, w]`` output per entry of ``lengths``."""
    arrays, B, dtype = _float_list(arrays_name, arrays)
    widths = [a.shape[1] for a in arrays]  # Python ints (NumPy and CuPy shapes)
    lengths = _sizes(lengths_name, lengths)
    if type(permutes) is np.ndarray and type(in_shapes) is np.ndarray and type(out_shapes) is np.ndarray:
        # The verdict of the checks below is a function of exactly these values: the three arrays'
        # dtypes (compared by ==, as index_array compares them: '>i8' is not int64), shapes and
        # bytes, which fix their contents; the widths and lengths as Python ints. So a cached
        # verdict can never be stale (an array changed in place has other bytes), and a hit skips
        # the array checks too (the type is tested above, the ndim and P x 6 are in the shapes).
        key = (
            forward,
            permutes.dtype,
            permutes.shape,
            permutes.tobytes(),
            in_shapes.dtype,
            in_shapes.shape,
            in_shapes.tobytes(),
            out_shapes.dtype,
            out_shapes.shape,
            out_shapes.tobytes(),
            tuple(widths),
            tuple(lengths),
        )
        if not _VALID.get(key):
            v.index_array("in_shapes", in_shapes)
            v.index_array("out_shapes", out_shapes)
            _permutes_shape(permutes)
            _permute_rules(forward, arrays_name, widths, lengths_name, lengths, permutes, in_shapes, out_shapes)
            _VALID.put(key, True)
    else:
        v.index_array("in_shapes", in_shapes)
        v.index_array("out_shapes", out_shapes)
        _permutes_shape(permutes)
        _permute_rules(forward, arrays_name, widths, lengths_name, lengths, permutes, in_shapes, out_shapes)
    args = {arrays_name: arrays, "permutes": permutes, "in_shapes": in_shapes, "out_shapes": out_shapes}
    args[lengths_name] = lengths
    return (args, [((B, w), dtype) for w in lengths])


# -- 4. regroup_keyed_tensor -----------------------------------------------
@op("keyed_tensor", returns="list", differentiable=("pooled_embs",))
def regroup_keyed_tensor(pooled_embs, keys, lengths, groups):
    """``permute_multi_embedding(pooled_embs, *kt_regroup_arguments(pooled_embs[0], keys, lengths, groups))``.

    pooled_embs: ``len(keys)`` 2-D float16/32/64 arrays, ``pooled_embs[i].shape[1] ==
    sum(lengths[i])``. Returns one ``[B, width]`` array per group.

    Examples
    --------
    >>> embs = [np.arange(6.0).reshape(2, 3), np.full((2, 1), 9.0)]
    >>> embnum.regroup_keyed_tensor(embs, [['a', 'b'], ['c']], [[2, 1], [1]], [['c', 'a'], ['b']])
    [array([[9., 0., 1.],
           [9., 3., 4.]]), array([[2.],
           [5.]])]
    """
    pooled_embs, B, dtype = _float_list("pooled_embs", pooled_embs)
    keys, lengths, groups, in_widths, out_widths = _regrouping(keys, lengths, groups)
    if len(pooled_embs) != len(keys):
        raise ValueError(f"pooled_embs must hold len(keys) = {len(keys)} arrays, got {len(pooled_embs)}")
    for i, (a, w) in enumerate(zip(pooled_embs, in_widths)):
        if a.shape[1] != w:
            raise ValueError(f"pooled_embs[{i}] has {a.shape[1]} columns but sum(lengths[{i}]) = {w}")
    return (
        dict(pooled_embs=pooled_embs, keys=keys, lengths=lengths, groups=groups),
        [((B, w), dtype) for w in out_widths],
    )


# -- oracle comparison for the backward --------------------------------------
check(permute_multi_embedding_backward)(same_bits)  # NaNs match any NaN (payloads of NaN sums are not specified)
