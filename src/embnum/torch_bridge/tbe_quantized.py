"""Torch side of the quantized TBE lookup (forward only: an inference op, no gradient).

``weights_tys`` is an integer tensor of fbgemm ``SparseType`` codes here (0
fp32, 1 fp16, 2 int8, 3 int4, 4 int2, as fbgemm's inference module holds it);
``pooling_mode``, ``output_dtype`` and ``bounds_check_mode`` are strings. The
pooled width ``D_offsets[T]`` (or ``D`` for ``"none"``) lives in a tensor, so
the fake implementation gives it a dynamic size.
"""

from __future__ import annotations

import torch

from ._library import bridge
from .tbe import MODE_CODECS


def _fake(weights, weights_offsets, indices, offsets, pooling_mode, output_dtype, **_):
    width = torch.library.get_ctx().new_dynamic_size()
    dtype = torch.float16 if output_dtype == "float16" else torch.float32
    T = weights_offsets.shape[0]
    rows = indices.shape[0] if str(pooling_mode).lower() == "none" else (offsets.shape[0] - 1) // T
    return weights.new_empty((rows, width), dtype=dtype)


bridge(
    "tbe_forward_quantized",
    types={
        "pooling_mode": "str",
        "per_sample_weights": "Tensor?",
        "row_alignment": "int",
        "output_dtype": "str",
        "bounds_check_mode": "str",
    },
    fake=_fake,
    codecs=MODE_CODECS,  # the NumPy API's rules and errors, before the schema sees the values
)
