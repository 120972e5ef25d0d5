"""NumPy oracle of the quant family (``docs/families/quant.md``).

Arguments arrive validated (``embnum.ops.quant``). Float32 arithmetic is done
on float32 NumPy arrays, so every operation rounds to float32 as the documented
``fl32`` does; ``np.rint`` rounds ties to even.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
CANONICAL_NAN = np.uint32(0x7FC00000)


def _rows(a, D):
    return np.ascontiguousarray(a).astype(F32).reshape(-1, D)  # float16 widens exactly


def _min_max(x):
    """Row minima and maxima of ``x`` [R, D]: the first minimal/maximal element of each row
    (which zero a row of signed zeros gives is fbgemm's), NaN when the row holds a NaN."""
    if x.shape[0] == 0:
        return np.zeros(0, F32), np.zeros(0, F32)
    rows = np.arange(x.shape[0])
    return x[rows, x.argmin(axis=1)], x[rows, x.argmax(axis=1)]


def _codes(p, Q):
    """``clamp(rne(p), 0, Q)`` with NaN -> 0, as uint8."""
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(p), 0, Q)
    return np.where(np.isnan(q), 0, q).astype(np.uint8)


def _float32_bytes(x):
    """``x`` (float32 [R]) as 4 little-endian bytes per row; NaN stored as 0x7FC00000."""
    bits = np.where(np.isnan(x), CANONICAL_NAN, x.astype(F32).view(np.uint32))
    return bits.astype("<u4").view(np.uint8).reshape(-1, 4)


def _float16_bytes(x):
    return x.astype("<f2").view(np.uint8).reshape(-1, 2)


# -- 1. fused 8-bit row-wise ----------------------------------------------------
def float_to_fused_8bit_rowwise(input):
    D = input.shape[-1]
    x = _rows(input, D)
    with np.errstate(invalid="ignore", over="ignore"):
        mn, mx = _min_max(x)
        rng = mx - mn
        scale = rng / F32(255)
        inv = F32(255) / (rng + F32(1e-8))
        q = _codes((x - mn[:, None]) * inv[:, None], 255)
    out = np.concatenate([q, _float32_bytes(scale), _float32_bytes(mn)], axis=1)
    return out.reshape(*input.shape[:-1], D + 8)


def _dequantize(q, scale, bias, output_dtype):
    """``fl32(q * scale + bias)`` in float64 (``q`` [R, D], ``scale``/``bias`` [R])."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = q.astype(np.float64) * scale.astype(np.float64)[:, None] + bias.astype(np.float64)[:, None]
        return v.astype(F32).astype(output_dtype)


def fused_8bit_rowwise_to_float(input, output_dtype):
    C = input.shape[-1]
    rows = np.ascontiguousarray(input).reshape(-1, C)
    sb = np.ascontiguousarray(rows[:, C - 8 :]).view("<f4")
    out = _dequantize(rows[:, : C - 8], sb[:, 0], sb[:, 1], output_dtype)
    return out.reshape(*input.shape[:-1], C - 8)


# -- 2. fused N-bit row-wise ----------------------------------------------------
def float_to_fused_nbit_rowwise(input, bit_rate):
    x = _rows(input, input.shape[1])
    R, D = x.shape
    k, Q = 8 // bit_rate, 2**bit_rate - 1
    with np.errstate(invalid="ignore", over="ignore"):
        mn, mx = _min_max(x)
        bias16 = mn.astype(np.float16)
        b = bias16.astype(F32)
        rng = mx - b
        scale = np.where(rng == 0, F32(1), rng / F32(Q))
        scale16 = scale.astype(np.float16)
        scale16 = np.where(scale16 == 0, np.float16(1), scale16)
        inv = F32(1) / scale16.astype(F32)
        q = _codes((x - b[:, None]) * inv[:, None], Q)
    packed = np.zeros((R, D // k), dtype=np.uint8)
    for j in range(k):  # element c -> byte c // k, bits bit_rate * (c % k)
        packed |= (q[:, j::k] << (bit_rate * j)).astype(np.uint8)
    return np.concatenate([packed, _float16_bytes(scale16), _float16_bytes(bias16)], axis=1)


def fused_nbit_rowwise_to_float(input, bit_rate, output_dtype):
    rows = np.ascontiguousarray(input)
    R, C = rows.shape
    k = 8 // bit_rate
    data = rows[:, : C - 4]
    q = np.empty((R, (C - 4) * k), dtype=np.uint8)
    for j in range(k):
        q[:, j::k] = (data >> (bit_rate * j)) & (2**bit_rate - 1)
    sb = np.ascontiguousarray(rows[:, C - 4 :]).view("<f2")
    return _dequantize(q, sb[:, 0], sb[:, 1], output_dtype)


# -- 3. bfloat16 ------------------------------------------------------------------
def float_to_bfloat16(input):
    u = np.asarray(input, order="C").view(np.uint32)
    rounded = (u.astype(np.uint64) + 0x8000) >> 16  # ties away from zero; no wrap for non-NaNs
    quiet_nan = (u >> 16) | 0x0040
    return np.where(np.isnan(input), quiet_nan, rounded).astype(np.uint16)


def bfloat16_to_float(input):
    return (np.asarray(input).astype(np.uint32) << 16).view(F32)


# -- 4. float16 -------------------------------------------------------------------
def float_to_fp16(input, saturate):
    x = np.asarray(input, dtype=F32)
    if saturate:
        x = np.where(np.isnan(x), x, np.clip(x, F32(-65504), F32(65504)))
    with np.errstate(over="ignore"):
        return x.astype(np.float16)


def fp16_to_float(input):
    return np.asarray(input).astype(F32)


# -- 5. HFP8 ----------------------------------------------------------------------
def float_to_hfp8(input, ebits, exponent_bias, max_pos):
    x = np.asarray(input, dtype=F32)
    m, bias = 7 - ebits, exponent_bias
    sign = (np.signbit(x).astype(np.uint8) << 7).astype(np.uint8)
    a = np.where(np.isnan(x), max_pos, np.minimum(np.abs(x), max_pos)).astype(np.float64)
    normal = a >= 2.0 ** (1 - bias)
    e = np.where(normal, np.frexp(a)[1] - 1, 0)  # floor(log2(a)), exactly
    step = np.ldexp(1.0, (e - m).astype(np.int64))
    r = np.rint(a / step) * step  # m mantissa bits; may carry to 2**(e+1)
    er = np.frexp(r)[1] - 1
    E = er + bias
    M = r / np.ldexp(1.0, er.astype(np.int64)) * 2**m - 2**m
    normal_code = (E.astype(np.int64) << m) | M.astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        sub_code = np.where(normal, 0, np.rint(a / 2.0 ** (1 - bias - m))).astype(np.int64)
    code = np.where(normal, normal_code, sub_code)
    return (sign | code.astype(np.uint8)).astype(np.uint8)


def hfp8_to_float(input, ebits, exponent_bias):
    c = np.asarray(input).astype(np.int64)
    m, bias = 7 - ebits, exponent_bias
    E = (c >> m) & (2**ebits - 1)
    M = c & (2**m - 1)
    normal = np.ldexp(1.0 + M / 2**m, E - bias)
    sub = np.ldexp(M / 2**m, np.full_like(E, 1 - bias))
    v = np.where(E > 0, normal, sub)
    return np.where(c & 0x80, -v, v).astype(F32)
