"""Byte-level pieces of quantized rows, written once in plain Python and compiled
by both fast paths (``numba.njit`` in ``embnum.cpu``, ``numba.cuda.jit(device=True)``
in ``embnum.cuda``), as ``embnum._half`` is.

* ``put_u32(row, at, bits)``: store the low 32 bits of ``bits`` little-endian in
  the uint8 ``row[at:at+4]``.
* ``make_tbe_element(f16, f32)``: element ``c`` of a quantized TBE row
  (``docs/families/tbe_quantized.md``, row format), built on the target's own decoders
  ``f16(h)`` (float16 bit pattern -> its exact value) and ``f32(u)`` (float32
  bit pattern -> float32), which each target compiles first.
"""

import numpy as np


def put_u32(row, at, bits):
    """``row[at:at+4]`` (uint8) = the low 32 bits of ``bits``, little-endian."""
    for i in range(4):
        row[at + i] = np.uint8((bits >> (8 * i)) & 0xFF)


def make_tbe_element(f16, f32):
    """``element(weights, start, code, c)``: element ``c`` (float32) of the row of type
    ``code`` (0 fp32, 1 fp16, 2 int8, 3 int4, 4 int2) starting at byte ``start`` of the
    uint8 ``weights``; scale and bias (float16) lead the integer rows, and ``scale * q +
    bias`` is computed in float64 and rounded once."""

    def element(weights, start, code, c):
        if code == 0:
            at = start + 4 * c
            u = (
                np.int64(weights[at])
                | (np.int64(weights[at + 1]) << 8)
                | (np.int64(weights[at + 2]) << 16)
                | (np.int64(weights[at + 3]) << 24)
            )
            return np.float32(f32(u))
        if code == 1:
            at = start + 2 * c
            return np.float32(f16(np.int64(weights[at]) | (np.int64(weights[at + 1]) << 8)))
        scale = np.float64(f16(np.int64(weights[start]) | (np.int64(weights[start + 1]) << 8)))
        bias = np.float64(f16(np.int64(weights[start + 2]) | (np.int64(weights[start + 3]) << 8)))
        if code == 2:
            q = np.int64(weights[start + 4 + c])
        elif code == 3:
            q = (np.int64(weights[start + 4 + c // 2]) >> (4 * (c % 2))) & 15
        else:
            q = (np.int64(weights[start + 4 + c // 4]) >> (2 * (c % 4))) & 3
        prod = scale * np.float64(q)  # a statement of its own: no fused multiply-add
        return np.float32(prod + bias)

    return element
