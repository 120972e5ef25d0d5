"""Tour and benchmark inputs of the tbe_quantized family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.tbe_quantized import (
    TYPE_CODES,
    tbe_forward_quantized,
    tbe_pack_quantized,
)


@example(tbe_forward_quantized)
def _(rng, size):
    T, B, L, rows, D = (3, 4, 3, 20, 8) if size == "small" else (8, 512, 20, 10000, 64)
    tys = ["int4", "int8", "fp16", "int2", "fp32", "int4", "int8", "int4"][:T]
    tables = [rng.standard_normal((rows, D)).astype(np.float32) for _ in range(T)]
    weights, woffs = tbe_pack_quantized(tables, tys, backend="ref")  # the inputs compile no quantizer
    lengths = rng.integers(0, 2 * L + 1, size=T * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(-1, rows, size=int(offsets[-1])).astype(np.int64)  # -1: pruned rows
    return Example(
        dict(
            weights=weights,
            weights_offsets=woffs,
            weights_tys=np.array([TYPE_CODES[t] for t in tys], np.uint8),
            D_offsets=np.arange(T + 1, dtype=np.int64) * D,
            rows_per_table=np.full(T, rows, np.int64),
            indices=indices,
            offsets=offsets,
            pooling_mode="sum",
        ),
        f"T={T} B={B} L~{L} D={D} mixed types",
    )
