"""fbgemm's quantized lookup operator, ``torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function``,
on embnum's ``tbe_forward_quantized`` (defined by :func:`register_operators` at ``install()``).

fbgemm's inference module calls it with its buffers (a model scripted or traced with fbgemm holds
the call); the stand-in's own module calls embnum's operator directly, with its row counts and its
bounds-check mode. fbgemm's operator is not told the row count of a table: here each table holds
the whole rows that fit between its byte offset and the next table's (or the end of the buffer), so
an id past them is an ``IndexError`` where fbgemm reads past the buffer, and an id in a table's
padding reads the padding's bytes, as fbgemm does. fbgemm checks ids in a separate operator
(``bounds_check_indices``, not defined here). The ``max_*_D`` arguments (fbgemm's kernel choice) are
not read; cached rows (``lxu_cache_weights``), unified-memory placements and fp8 rows raise
``NotImplementedError`` naming them.
"""

from __future__ import annotations

import functools

import torch

from ..ops.tbe_quantized import raw_row_bytes
from . import _checks

__all__ = ["SCHEMA", "int_nbit_lookup", "register_operators"]

NAME = "int_nbit_split_embedding_codegen_lookup_function"
SCHEMA = (
    "(Tensor dev_weights, Tensor uvm_weights, Tensor weights_placements, Tensor weights_offsets, "
    "Tensor weights_tys, Tensor D_offsets, SymInt total_D, int max_int2_D, int max_int4_D, int max_int8_D, "
    "int max_float16_D, int max_float32_D, Tensor indices, Tensor offsets, int pooling_mode, "
    "Tensor? indice_weights, int output_dtype=1, Tensor? lxu_cache_weights=None, "
    "Tensor? lxu_cache_locations=None, int? row_alignment=None, int? max_float8_D=0, "
    "int? fp8_exponent_bits=-1, int? fp8_exponent_bias=-1) -> Tensor"
)
_POOLING = {0: "sum", 1: "mean", 2: "none"}
_OUTPUT = {0: "float32", 1: "float16"}  # fbgemm's SparseType codes FP32 and FP16
_PLACED = (0, 3)  # EmbeddingLocation.DEVICE and HOST: the rows are in dev_weights


def _ints(name, t, n=None):
    """The 1-D integer tensor ``t`` as Python ints (``n`` of them when given), else ``TypeError``/``ValueError``."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex:
        got = t.dtype if isinstance(t, torch.Tensor) and t.dim() == 1 else getattr(t, "shape", type(t).__name__)
        raise TypeError(f"{name} must be a 1-D integer tensor, got {got}")
    if t.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer tensor, got {t.dtype}")
    if n is not None and t.numel() != n:
        raise ValueError(f"{name} must hold {n} entries (one per feature), got {t.numel()}")
    return t.tolist()


def _rows_that_fit(size, woffs, codes, D_offsets, row_alignment):
    """Per feature, the whole rows of its table between its offset and the next table's start."""
    starts = sorted(set(woffs)) + [size]
    rows = []
    for t, (start, code) in enumerate(zip(woffs, codes)):
        if code not in range(10):
            raise ValueError(f"weights_tys[{t}] = {code} is not a SparseType code (0..9)")
        if code not in range(5):
            raise NotImplementedError(f"weights_tys[{t}] = {code}: only fp32, fp16, int8, int4 and int2 rows (0..4)")
        width = -(-raw_row_bytes(code, D_offsets[t + 1] - D_offsets[t]) // row_alignment) * row_alignment
        end = next((s for s in starts if s > start), size)
        rows.append(max(end - start, 0) // max(width, 1))
        if rows[-1] < 1 and 0 <= start:
            raise ValueError(
                f"weights_offsets[{t}] = {start}: no whole row of {width} bytes of feature {t}'s table fits "
                f"before the next table or the end of dev_weights ({size} bytes; row_alignment {row_alignment})"
            )
    return rows


def int_nbit_lookup(
    dev_weights,
    uvm_weights,
    weights_placements,
    weights_offsets,
    weights_tys,
    D_offsets,
    total_D,
    max_int2_D,
    max_int4_D,
    max_int8_D,
    max_float16_D,
    max_float32_D,
    indices,
    offsets,
    pooling_mode,
    indice_weights,
    output_dtype=1,
    lxu_cache_weights=None,
    lxu_cache_locations=None,
    row_alignment=None,
    max_float8_D=0,
    fp8_exponent_bits=-1,
    fp8_exponent_bias=-1,
):
    """fbgemm's quantized lookup on ``tbe_forward_quantized``: ``[B, total_D]`` (``[N, D]`` for
    pooling mode 2) in float32 (``output_dtype`` 0) or float16 (1)."""
    from ..torch_bridge import tbe_forward_quantized

    if lxu_cache_weights is not None and lxu_cache_weights.numel() > 0:
        raise NotImplementedError("lxu_cache_weights: cached rows are not available in embnum's stand-in")
    if max_float8_D:
        raise NotImplementedError(f"max_float8_D = {max_float8_D}: fp8 rows are not available in embnum")
    woffs = _ints("weights_offsets", weights_offsets)
    codes = _ints("weights_tys", weights_tys, len(woffs))
    D_list = _ints("D_offsets", D_offsets, len(woffs) + 1)
    placements = _ints("weights_placements", weights_placements, len(woffs))
    for t, p in enumerate(placements):
        if p not in range(5):
            raise ValueError(f"weights_placements[{t}] = {p} is not an EmbeddingLocation (0..4)")
    if any(p not in _PLACED for p in placements):
        raise NotImplementedError(
            f"weights_placements = {placements}: only DEVICE (0) and HOST (3) rows; unified memory (1, 2) "
            "is not available in embnum's stand-in"
        )
    if pooling_mode not in _POOLING:
        raise ValueError(f"pooling_mode must be 0 (sum), 1 (mean) or 2 (none), got {pooling_mode}")
    if output_dtype not in _OUTPUT:
        raise ValueError(f"output_dtype must be 0 (FP32) or 1 (FP16) in embnum, got {output_dtype}")
    if D_list[-1] != total_D:
        raise ValueError(f"total_D = {total_D} must equal D_offsets[-1] = {D_list[-1]}")
    if row_alignment is None:
        row_alignment = 1 if dev_weights.device.type == "cpu" else 16
    if row_alignment < 1:
        raise ValueError(f"row_alignment must be >= 1, got {row_alignment}")
    if dev_weights.dim() != 1 or dev_weights.dtype != torch.uint8:
        raise TypeError(
            f"dev_weights must be a 1-D uint8 tensor (packed rows), got {dev_weights.dtype} {list(dev_weights.shape)}"
        )
    rows = _rows_that_fit(dev_weights.numel(), woffs, codes, D_list, row_alignment)
    weights = _checks.float_weights("indice_weights", indice_weights)
    if weights is not None and tuple(weights.shape) != tuple(indices.shape):
        raise ValueError(
            f"indice_weights must have the shape of indices {list(indices.shape)}, got {list(weights.shape)}"
        )
    return tbe_forward_quantized(
        dev_weights,
        weights_offsets,
        weights_tys,
        D_offsets,
        torch.tensor(rows, dtype=torch.int64, device=dev_weights.device),
        indices,
        offsets,
        _POOLING[pooling_mode],
        weights,
        row_alignment=row_alignment,
        output_dtype=_OUTPUT[output_dtype],
        bounds_check_mode="fatal",
    )


@functools.cache
def register_operators() -> torch.library.Library:
    """Define ``torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function`` (fbgemm's schema)
    on :func:`int_nbit_lookup`, once per process. Refuses (``RuntimeError``) where the name is taken
    (fbgemm_gpu loaded: its own operator holds it)."""
    try:
        getattr(torch.ops.fbgemm, NAME)
    except (AttributeError, RuntimeError):
        pass
    else:
        raise RuntimeError(f"torch.ops.fbgemm.{NAME} is defined already (fbgemm_gpu loaded?): it keeps the name")
    lib = torch.library.Library("fbgemm", "FRAGMENT")
    lib.define(NAME + SCHEMA)
    lib.impl(NAME, int_nbit_lookup, "CompositeImplicitAutograd")
    return lib
