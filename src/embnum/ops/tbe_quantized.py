"""Declarations of the quantized TBE inference lookup (``docs/families/tbe_quantized.md``).

``tbe_pack_quantized`` is a host helper (NumPy in, NumPy out, no backend);
``tbe_forward_quantized`` is an op on every backend. Bounds checking is done
here, once, before any kernel runs, by ``embnum._tbe_bounds`` (docs/families/tbe_quantized.md, the lookup, with
the quantized lookup's own rule: ``-1`` is a pruned row in every mode,
``pruned_ok=True``): ``fatal``/``none`` raise,
``warning``/``ignore`` repair private copies of ``offsets`` and ``indices``,
so the kernels only ever see readable indices (or ``-1``).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

from .. import _tbe_bounds as tbe_bounds
from .. import _validate as v
from .._cache import BoundedCache
from .._compare import within
from .._registry import check, op
from .._tbe import NONE, POOLING_CODES
from .quant import float_to_fused_8bit_rowwise, float_to_fused_nbit_rowwise

# fbgemm SparseType codes of the row types (docs/families/tbe_quantized.md, row formats)
TYPE_CODES = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "int2": 4}
_TYPE_NAMES = {c: n for n, c in TYPE_CODES.items()}
HELPERS = ("tbe_pack_quantized",)


def raw_row_bytes(code: int, D: int) -> int:
    """Bytes of one row of type ``code`` and dim ``D`` before alignment."""
    return (4 * D, 2 * D, D + 4, D // 2 + 4, D // 4 + 4)[code]


def _round_up(n, a):
    return -(-n // a) * a


def _type_codes(weights_tys, T=None):
    """Type strings or fbgemm codes -> a list of codes 0..4."""
    if v.is_array(weights_tys):
        if weights_tys.ndim != 1 or weights_tys.dtype.kind not in "iu":
            raise TypeError(
                f"weights_tys must be a sequence of type names or a 1-D integer array,"
                f" got {weights_tys.dtype}{tuple(weights_tys.shape)}"
            )
        items = v.to_host(weights_tys).tolist()
    elif isinstance(weights_tys, (list, tuple)):
        items = list(weights_tys)
    else:
        raise TypeError(
            f"weights_tys must be a sequence of type names or a 1-D integer array, got {type(weights_tys).__name__}"
        )
    if T is not None and len(items) != T:
        raise ValueError(f"weights_tys must have {T} entries (one per feature), got {len(items)}")
    codes = []
    for i, ty in enumerate(items):
        if isinstance(ty, str):
            if ty.lower() not in TYPE_CODES:
                raise ValueError(f"weights_tys[{i}] = {ty!r} is not one of {sorted(TYPE_CODES)} (others are future)")
            codes.append(TYPE_CODES[ty.lower()])
        elif not isinstance(ty, (bool, np.bool_)) and isinstance(ty, numbers.Integral):
            if int(ty) not in _TYPE_NAMES:
                raise ValueError(
                    f"weights_tys[{i}] = {int(ty)} is not a supported SparseType code 0..4 (others are future)"
                )
            codes.append(int(ty))
        else:
            raise TypeError(f"weights_tys[{i}] must be a type name or an int code, got {ty!r}")
    return codes


def _check_dim(name, code, D):
    if code == TYPE_CODES["int4"] and D % 2:
        raise ValueError(f"{name}: int4 rows need an even D, got {D}")
    if code == TYPE_CODES["int2"] and D % 4:
        raise ValueError(f"{name}: int2 rows need D % 4 == 0, got {D}")


# -- the packing helper -----------------------------------------------------------
def tbe_pack_quantized(tables, weights_tys, *, row_alignment=1, table_alignment=1, backend=None):
    """Pack float tables into a quantized TBE buffer (fbgemm's inference layout, CPU).

    tables: list of 2-D float32/float16 NumPy arrays ``[rows_i >= 1, D_i >= 1]``;
    weights_tys: one type per table (``"fp32"``, ``"fp16"``, ``"int8"``,
    ``"int4"``, ``"int2"`` or fbgemm's codes 0..4). Returns ``(weights uint8[W],
    weights_offsets int64[len(tables)])``: table ``i`` starts at the end of table
    ``i - 1`` rounded up to ``table_alignment``; each row is padded (with zeros)
    to a multiple of ``row_alignment`` bytes; scale and bias come first (float16).
    int8 rows are ``float_to_fused_8bit_rowwise`` codes with its float32 scale and
    bias rounded to float16; int4/int2 rows are ``float_to_fused_nbit_rowwise`` with
    its trailing scale and bias moved to the front. Works for any ``D`` allowed by
    the row type (fbgemm's ``quantize_embs(INT8)`` needs ``D % 4 == 0``). ``backend``: the
    quantizers' (``"ref"``: the NumPy oracle's, which compiles nothing; default: the cpu's).
    """
    tables = v.array_list("tables", tables, min_len=1)
    codes = _type_codes(weights_tys, len(tables))
    row_alignment = v.positive("row_alignment", row_alignment)
    table_alignment = v.positive("table_alignment", table_alignment)
    if backend not in (None, "cpu", "ref"):
        raise ValueError(f"backend must be 'cpu' or 'ref' (tbe_pack_quantized is a host helper), got {backend!r}")
    blocks, offsets, end = [], [], 0
    for i, (t, code) in enumerate(zip(tables, codes)):
        name = f"tables[{i}]"
        v.array(name, t, ndim=2, dtypes=(np.dtype(np.float16), np.dtype(np.float32)))
        if not isinstance(t, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array (tbe_pack_quantized is a host helper)")
        rows, D = t.shape
        if rows < 1 or D < 1:
            raise ValueError(f"{name} must have at least one row and one column, got shape {t.shape}")
        _check_dim(name, code, D)
        if code in (3, 4) and D % (16 // (4 if code == 3 else 2)):  # the N-bit codec's own rule (quant.md 2)
            raise ValueError(
                f"{name}: packing {_TYPE_NAMES[code]} rows needs D % {16 // (4 if code == 3 else 2)} == 0, got {D}"
            )
        raw = raw_row_bytes(code, D)
        R = _round_up(raw, row_alignment)
        start = _round_up(end, table_alignment)
        block = np.zeros((rows, R), np.uint8)
        block[:, :raw] = _encode_rows(t, code, backend)
        blocks.append((start, block))
        offsets.append(start)
        end = start + rows * R
    weights = np.zeros(_round_up(end, table_alignment), np.uint8)
    for start, block in blocks:
        weights[start : start + block.size] = block.reshape(-1)
    return weights, np.array(offsets, dtype=np.int64)


def _encode_rows(t, code, backend):
    """uint8 ``[rows, raw]``: the rows of ``t`` in row type ``code``."""
    x = np.ascontiguousarray(t)
    if code == 0:
        return x.astype("<f4").view(np.uint8)
    if code == 1:
        with np.errstate(over="ignore"):
            return x.astype("<f2").view(np.uint8)
    if code == 2:
        q = float_to_fused_8bit_rowwise(x, backend=backend)
        D = x.shape[1]
        sb = np.ascontiguousarray(q[:, D:]).view("<f4")
        with np.errstate(over="ignore"):
            front = sb.astype("<f2").view(np.uint8)
        return np.concatenate([front, q[:, :D]], axis=1)
    q = float_to_fused_nbit_rowwise(x, {3: 4, 4: 2}[code], backend=backend)
    return np.concatenate([q[:, -4:], q[:, :-4]], axis=1)


# -- the lookup --------------------------------------------------------------------
def _int_array(name, a, ndim=1):
    return v.index_array(name, a, ndim=ndim)


_LAYOUTS = BoundedCache(64)  # validated layouts -> (D_offsets as a list, rows int64, layout int64), read-only


def _layout_key(weights, weights_offsets, weights_tys, D_offsets, rows_per_table, row_alignment):
    """The content of everything the layout's rules read (len(weights), the three index arrays
    with their dtypes and shapes, the row types, the alignment), or None where it is not plain
    NumPy arrays, exact ``str``/``int`` row types and an exact ``int`` alignment. A cached layout
    can never be stale: an array changed in place has other bytes; ``True``/``1.0`` cannot equal
    a validated ``1`` because only exact ``int``/``str`` items make a key."""
    if type(D_offsets) is not np.ndarray or type(rows_per_table) is not np.ndarray or type(row_alignment) is not int:
        return None
    if type(weights_tys) is np.ndarray:
        if weights_tys.dtype.hasobject:  # its bytes are addresses, not the names: no key
            return None
        tys = (weights_tys.dtype, weights_tys.shape, weights_tys.tobytes())
    elif type(weights_tys) in (list, tuple) and all(type(x) is str or type(x) is int for x in weights_tys):
        tys = tuple(weights_tys)
    else:
        return None
    # dtypes themselves (compared by ==, as the array checks compare them), not their one-letter
    # codes: '>i8' and '<i8' share the code 'l', and a hit skips D_offsets' and rows_per_table's checks
    return (
        weights.shape[0],
        weights_offsets.dtype,
        weights_offsets.tobytes(),
        tys,
        D_offsets.dtype,
        D_offsets.shape,
        D_offsets.tobytes(),
        rows_per_table.dtype,
        rows_per_table.shape,
        rows_per_table.tobytes(),
        row_alignment,
    )


def _layout_rules(weights, weights_offsets, codes, D_offsets, rows_per_table, row_alignment, T):
    """The rules of the tables (dims, row counts, the bytes each needs); returns ``(D_offsets as a
    list, rows int64 [T], layout int64 [T, 5])``, the arrays read-only (they are cached)."""
    Doffs, rows, woffs = (v.to_host(a).tolist() for a in (D_offsets, rows_per_table, weights_offsets))
    if Doffs[0] != 0:
        raise ValueError(f"D_offsets[0] must be 0, got {Doffs[0]}")
    row_bytes = []
    for t in range(T):
        D = Doffs[t + 1] - Doffs[t]
        if D < 1:
            raise ValueError(f"feature {t} has D = D_offsets[{t + 1}] - D_offsets[{t}] = {D}, must be >= 1")
        _check_dim(f"D_offsets[{t + 1}] - D_offsets[{t}] (feature {t})", codes[t], D)
        if rows[t] < 1:
            raise ValueError(f"rows_per_table[{t}] must be >= 1, got {rows[t]}")
        R = _round_up(raw_row_bytes(codes[t], D), row_alignment)
        if woffs[t] < 0 or woffs[t] + rows[t] * R > weights.shape[0]:
            raise ValueError(
                f"table of feature {t} (weights_offsets[{t}] = {woffs[t]}, {rows[t]} rows of {R} bytes) "
                f"does not fit the {weights.shape[0]} bytes of weights"
            )
        row_bytes.append(R)
    layout = np.array(
        [[woffs[t], codes[t], Doffs[t], Doffs[t + 1] - Doffs[t], row_bytes[t]] for t in range(T)], np.int64
    )
    rows = np.asarray(rows, np.int64)
    rows.flags.writeable = layout.flags.writeable = False
    return Doffs, rows, layout


def _layout_args(weights, weights_offsets, weights_tys, D_offsets, rows_per_table, indices, offsets, row_alignment):
    """The layout arguments' first rules, or a layout found in the cache (then only the lookups'
    kinds are checked): ``(T, key, found, codes, row_alignment)``, ``codes`` None when found."""
    codes = None
    v.array("weights", weights, ndim=1, dtypes=(np.dtype(np.uint8),))
    _int_array("weights_offsets", weights_offsets)
    T = int(weights_offsets.shape[0])
    if T < 1:
        raise ValueError("weights_offsets must have at least 1 entry (one per feature), got 0")
    key = _layout_key(weights, weights_offsets, weights_tys, D_offsets, rows_per_table, row_alignment)
    found = _LAYOUTS.get(key) if key is not None else None
    if found is None:  # the layout's rules, in order (indices and offsets are index-checked among them)
        codes = _type_codes(weights_tys, T)
        _int_array("D_offsets", D_offsets)
        _int_array("rows_per_table", rows_per_table)
        _int_array("indices", indices)
        _int_array("offsets", offsets)
        if D_offsets.shape[0] != T + 1:
            raise ValueError(f"D_offsets must have T + 1 = {T + 1} entries, got {D_offsets.shape[0]}")
        if rows_per_table.shape[0] != T:
            raise ValueError(f"rows_per_table must have T = {T} entries, got {rows_per_table.shape[0]}")
        row_alignment = v.positive("row_alignment", row_alignment)
    else:
        _int_array("indices", indices)
        _int_array("offsets", offsets)
    return T, key, found, codes, row_alignment


def _output_shape(per_sample_weights, pooling, N, B, Doffs, T):
    """The output's shape, ``(B, total_D)`` or ``(N, D)`` for ``"none"``, after the rules of
    ``per_sample_weights`` (float32 ``[N]``, not with ``"none"``) and of ``"none"`` (one ``D``)."""
    if per_sample_weights is not None:
        v.array("per_sample_weights", per_sample_weights, ndim=1, dtypes=(np.dtype(np.float32),))
        if per_sample_weights.shape[0] != N:
            raise ValueError(
                f"per_sample_weights must have len(indices) = {N} entries, got {per_sample_weights.shape[0]}"
            )
        if pooling == NONE:
            raise ValueError("per_sample_weights cannot be used with pooling_mode 'none'")
    if pooling == NONE:
        dims = {Doffs[t + 1] - Doffs[t] for t in range(T)}
        if len(dims) != 1:
            raise ValueError(f"pooling_mode 'none' needs one D for all features, got {sorted(dims)}")
        return (N, dims.pop())
    return (B, Doffs[T])


@op("tbe_quantized")
def tbe_forward_quantized(
    weights,
    weights_offsets,
    weights_tys,
    D_offsets,
    rows_per_table,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    *,
    row_alignment=1,
    output_dtype="float32",
    bounds_check_mode="fatal",
):
    """Pooled lookup of quantized rows (fbgemm's inference TBE on CPU).

    weights: uint8 ``[W]``; weights_offsets: int ``[T]`` byte offsets; weights_tys:
    ``T`` type names or fbgemm codes (``"fp32"`` 0, ``"fp16"`` 1, ``"int8"`` 2,
    ``"int4"`` 3, ``"int2"`` 4); D_offsets: int ``[T+1]``; rows_per_table: int
    ``[T]`` (each ``>= 1``); indices int ``[N]``; offsets int ``[T*B+1]``
    (feature-major bags). pooling_mode ``"sum"``/``"mean"``/``"none"`` (or 0/1/2);
    per_sample_weights float32 ``[N]`` or None (``"mean"`` with weights divides
    the weighted sum by the bag length). Output float32 (or float16:
    ``output_dtype="float16"``) ``[B, D_offsets[T]]``, or ``[N, D]`` for ``"none"``
    (one ``D`` for all features; indices outside every bag give zero rows).
    ``-1`` is a pruned row in every bounds mode: it adds nothing but counts in
    the ``"mean"`` divisor. Other bad indices/offsets: as ``bounds_check_mode`` says (``"fatal"``
    and ``"none"`` raise, ``"warning"``/``"ignore"`` repair a private copy).
    Accumulation in float32 (fast paths) or float64 (oracle).

    Examples
    --------
    >>> table = np.array([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], dtype=np.float32)
    >>> weights, weights_offsets = embnum.tbe_pack_quantized([table], ['fp16'])
    >>> D_offsets, rows_per_table = np.array([0, 4]), np.array([2])
    >>> indices, offsets = np.array([0, 1, -1]), np.array([0, 2, 3])  # -1: a pruned row
    >>> tys = ['fp16']
    >>> embnum.tbe_forward_quantized(weights, weights_offsets, tys, D_offsets, rows_per_table, indices, offsets, 'mean')
    array([[2., 3., 4., 5.],
           [0., 0., 0., 0.]], dtype=float32)
    """
    T, key, found, codes, row_alignment = _layout_args(
        weights, weights_offsets, weights_tys, D_offsets, rows_per_table, indices, offsets, row_alignment
    )
    pooling = v.choice("pooling_mode", pooling_mode, POOLING_CODES)
    bounds = tbe_bounds.bounds_mode(bounds_check_mode)
    out_dtype = v.output_dtype(output_dtype)
    if found is None:
        found = _layout_rules(weights, weights_offsets, codes, D_offsets, rows_per_table, row_alignment, T)
        if key is not None:
            _LAYOUTS.put(key, found)
    Doffs, rows, layout = found
    n_offsets = int(offsets.shape[0])
    if n_offsets < 1 or (n_offsets - 1) % T:
        raise ValueError(f"offsets must have T * B + 1 entries for T = {T}, got {n_offsets}")
    B = (n_offsets - 1) // T
    N = int(indices.shape[0])
    shape = _output_shape(per_sample_weights, pooling, N, B, Doffs, T)
    idx, offs = tbe_bounds.check(indices, offsets, B, rows, bounds, pruned_ok=True)
    xp = v.xp_of(weights)
    return (
        dict(
            weights=weights,
            layout=layout.copy() if xp is np else xp.asarray(layout),
            indices=idx,
            offsets=offs,
            B=B,
            pooling=pooling,
            per_sample_weights=per_sample_weights,
            output_dtype=out_dtype,
        ),
        (shape, out_dtype),
    )


@check(tbe_forward_quantized)
def _close(got, want, args):
    """tbe.md 5.3: rtol 1e-5 plus ``1e-5 * sum(|w_p| * max|row_p|)`` per bag (float16: plus 1 ulp)."""
    want = np.asarray(want)
    tol = 1e-5 * np.abs(want.astype(np.float64)) + 1e-5 * _bag_scale(args, want.shape)
    if want.dtype == np.float16:
        tol = tol + np.spacing(np.abs(want)).astype(np.float64)
    return within(got, want, tol)


def _bag_scale(args, shape):
    """Per output element: ``sum(|w_p| * max|row_p|)`` over its bag (rows dequantized by the oracle)."""
    from ..ref.tbe_quantized import bag_magnitudes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the repair modes warn again; the call itself warned already
        plan_args, _ = tbe_forward_quantized.op.declaration(**tbe_forward_quantized.op.bind((), dict(args)))
    return bag_magnitudes(plan_args, shape)
