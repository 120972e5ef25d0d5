"""Tour and benchmark inputs of the quant family (``@example``; see ``embnum.examples``)."""

from __future__ import annotations

import numpy as np

from .._registry import Example, example
from ..ops.quant import (
    bfloat16_to_float,
    float_to_bfloat16,
    float_to_fp16,
    float_to_fused_8bit_rowwise,
    float_to_fused_nbit_rowwise,
    float_to_hfp8,
    fp16_to_float,
    fused_8bit_rowwise_to_float,
    fused_nbit_rowwise_to_float,
    hfp8_to_float,
)

_ROWS = {"small": (6, 16), "large": (4096, 128)}


def embedding_rows(rng, R, D, dtype=np.float32):
    """Rows like a trained embedding table: per-row scale varies over decades."""
    scale = 10.0 ** rng.uniform(-3, 1, size=(R, 1))
    return (rng.standard_normal((R, D)) * scale).astype(dtype)


def _float_rows(rng, size):
    """The input of every op that encodes float32 rows alone (no other argument)."""
    R, D = _ROWS[size]
    return Example(dict(input=embedding_rows(rng, R, D)), f"[{R}, {D}] float32")


for _encoder in (float_to_fused_8bit_rowwise, float_to_bfloat16, float_to_fp16):
    example(_encoder)(_float_rows)


@example(fused_8bit_rowwise_to_float)
def _(rng, size):
    R, D = _ROWS[size]
    q = float_to_fused_8bit_rowwise(embedding_rows(rng, R, D), backend="ref")
    return Example(dict(input=q), f"[{R}, {D + 8}] uint8")


@example(float_to_fused_nbit_rowwise)
def _(rng, size):
    R, D = _ROWS[size]
    return Example(dict(input=embedding_rows(rng, R, D), bit_rate=4), f"[{R}, {D}] float32, 4-bit")


@example(fused_nbit_rowwise_to_float)
def _(rng, size):
    R, D = _ROWS[size]
    q = float_to_fused_nbit_rowwise(embedding_rows(rng, R, D), 4, backend="ref")
    return Example(dict(input=q, bit_rate=4), f"[{R}, {q.shape[1]}] uint8, 4-bit")


@example(bfloat16_to_float)
def _(rng, size):
    R, D = _ROWS[size]
    return Example(dict(input=float_to_bfloat16(embedding_rows(rng, R, D), backend="ref")), f"[{R}, {D}] bfloat16 bits")


@example(fp16_to_float)
def _(rng, size):
    R, D = _ROWS[size]
    return Example(dict(input=embedding_rows(rng, R, D, np.float16)), f"[{R}, {D}] float16")


_HFP8 = dict(ebits=4, exponent_bias=7, max_pos=480.0)


@example(float_to_hfp8)
def _(rng, size):
    R, D = _ROWS[size]
    return Example(dict(input=embedding_rows(rng, R, D), **_HFP8), f"[{R}, {D}] float32, e4 bias 7")


@example(hfp8_to_float)
def _(rng, size):
    R, D = _ROWS[size]
    codes = rng.integers(0, 256, size=(R, D)).astype(np.uint8)
    return Example(dict(input=codes, ebits=4, exponent_bias=7), f"[{R}, {D}] uint8, e4 bias 7")
