"""Stand-ins for fbgemm_gpu's inference TBE (``split_table_batched_embeddings_ops_inference``):
the row sizes of quantized tables and the quantized lookup module.

A quantized row holds its codes, then (int8/int4/int2) a float16 scale and a float16 bias
(``DEFAULT_SCALE_BIAS_SIZE_IN_BYTES``); fbgemm pads each row to ``row_alignment`` bytes.
"""

from __future__ import annotations

from .configs import DEFAULT_SCALE_BIAS_SIZE_IN_BYTES, SparseType, round_up
from .unavailable import _Unavailable

__all__ = ["IntNBitTableBatchedEmbeddingBagsCodegen", "rounded_row_size_in_bytes", "unpadded_row_size_in_bytes"]


def unpadded_row_size_in_bytes(
    dim: int, weight_ty: SparseType, scale_bias_size_in_bytes: int = DEFAULT_SCALE_BIAS_SIZE_IN_BYTES
) -> int:
    """Bytes of one row of ``dim`` elements stored as ``weight_ty`` (fp32, fp16, fp8, int8, int4, int2)."""
    codes = {"fp32": dim * 4, "fp16": dim * 2, "fp8": dim, "int8": dim, "int4": dim // 2, "int2": dim // 4}
    if weight_ty.value not in codes:
        raise ValueError(f"weight_ty must be one of {', '.join(codes)}, got {weight_ty}")
    return codes[weight_ty.value] + (scale_bias_size_in_bytes if weight_ty.value.startswith("int") else 0)


def rounded_row_size_in_bytes(
    dim: int,
    weight_ty: SparseType,
    row_alignment: int,
    scale_bias_size_in_bytes: int = DEFAULT_SCALE_BIAS_SIZE_IN_BYTES,
) -> int:
    """:func:`unpadded_row_size_in_bytes` rounded up to a multiple of ``row_alignment``."""
    return round_up(unpadded_row_size_in_bytes(dim, weight_ty, scale_bias_size_in_bytes), row_alignment)


class IntNBitTableBatchedEmbeddingBagsCodegen(_Unavailable):
    feature = "the quantized inference TBE (not yet provided by embnum's stand-in)"
