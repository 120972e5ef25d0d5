"""Numba host kernels of the quant family.

Each public function takes the validated arguments of its op (see
``embnum.ops.quant``) plus ``out``, an uninitialised C-contiguous array that
it fills completely. Row quantizers run one row per ``prange`` iteration in
float32 arithmetic, exactly as the formulas of ``docs/families/quant.md`` write it (Numba keeps float32 op
float32 in float32 and never contracts to a fused multiply-add without
fastmath). Float16 has no Numba type on the CPU: float16 data is read and
written as uint16 bit patterns through ``embnum._half`` (compiled in ``._common``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import prange

from .. import _qrow
from .._jit import njit
from . import _pool
from ._common import (
    F16C,
    bits_to_float32,
    float32_bits_to_half_bits,
    float32_to_bits,
    half_bits_to_float32,
    half_table,
    narrow_half,
    rne,
    serial_bytes,
    serial_twin,
)

# The registry allocates this family's outputs with this (large ones reused across calls
# once the caller has dropped them; the rule: embnum.cpu._pool).
empty_output = _pool.empty

_jit = njit(cache=True, inline="always")
_put_u32 = _jit(_qrow.put_u32)


F32 = np.float32
_MAGIC = np.float32(8388608.0)  # 2**23: x + 2**23 - 2**23 rounds 0 <= x < 2**23 to an integer, ties to even


def _float32_rows(a, D):
    """``a`` as a C-contiguous float32 ``[R, D]`` array (float16 widened exactly)."""
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1, D)


@_jit
def _key(u):
    """An int32 whose order is the float order of the float32 with bits ``u`` (int32):
    -NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN."""
    return np.int32(u ^ ((u >> np.int32(31)) & np.int32(0x7FFFFFFF)))


@_jit
def _first_zero(row, fallback):
    for c in range(row.shape[0]):
        if row[c] == 0:
            return row[c]
    return fallback


@_jit
def _min_max(row, bits):
    """Row minimum and maximum (float32): the first minimal/maximal element (which matters
    only among signed zeros: fbgemm's choice); both NaN when the row holds a NaN.

    ``bits``: the row's int32 view (made by the caller, outside compiled code: an array ``view``
    is a compile of its own). The reduction runs on integer keys of the bit patterns, which the compiler
    vectorizes (a float min/max reduction it does not, without fast-math)."""
    kmin = np.int32(0x7FFFFFFF)
    kmax = np.int32(-0x80000000)
    for c in range(bits.shape[0]):
        k = _key(bits[c])
        kmin = k if k < kmin else kmin
        kmax = k if k > kmax else kmax
    if kmax > np.int32(0x7F800000) or kmin < np.int32(-0x7F800001):  # outside [-inf, +inf]: a NaN
        nan = np.float32(np.nan)
        return nan, nan
    mn = np.int32(_key(kmin)).view(np.float32)
    mx = np.int32(_key(kmax)).view(np.float32)
    if mn == 0:
        mn = _first_zero(row, mn)
    if mx == 0:
        mx = _first_zero(row, mx)
    return mn, mx


@njit(cache=True)
def _to_half(v):
    """``(h, value)``: the float16 bits (int64) of the float32 ``v``, nearest-even, and their float32
    value (``_common``'s conversions, compiled once here and called per row: inlined at each use
    they were most of the n-bit quantizer's compile)."""
    h = float32_bits_to_half_bits(np.float32(v).view(np.uint32))
    return h, half_bits_to_float32(h)


@_jit
def _qf(p, Q):
    """``clamp(rne(p), 0, Q)`` as a float32 (NaN -> 0): codes combine into a byte exactly in float32."""
    p = p if p > np.float32(0) else np.float32(0)
    p = p if p < Q else Q
    return (p + _MAGIC) - _MAGIC


@_jit
def _code(p, Q):
    """``clamp(rne(p), 0, Q)`` as a uint8; NaN -> 0 (``p`` float32)."""
    return np.uint8(_qf(p, Q))


@_jit
def _get_f32(row, at):
    """The little-endian float32 stored in ``row[at:at+4]``, as a float64."""
    u = (
        np.uint32(row[at])
        | (np.uint32(row[at + 1]) << 8)
        | (np.uint32(row[at + 2]) << 16)
        | (np.uint32(row[at + 3]) << 24)
    )
    return np.float64(np.uint32(u).view(np.float32))


# -- 1. fused 8-bit row-wise ----------------------------------------------------
@njit(cache=True, parallel=True)
def _quantize_8bit(x, xi, out):
    R, D = x.shape
    Q = np.float32(255.0)
    for r in prange(R):
        row = x[r]
        o = out[r]
        mn, mx = _min_max(row, xi[r])
        rng = np.float32(mx - mn)
        scale = np.float32(rng / Q)
        inv = np.float32(Q / np.float32(rng + np.float32(1e-8)))
        if math.isfinite(rng):  # then 0 <= (x - mn) * inv <= 255 * (1 + 2 eps): no clamp needed
            for c in range(D):
                o[c] = np.uint8(np.rint(np.float32(np.float32(row[c] - mn) * inv)))
        else:  # inf or NaN in the row
            for c in range(D):
                o[c] = _code(np.float32(np.float32(row[c] - mn) * inv), Q)
        _put_u32(o, D, float32_to_bits(scale))
        _put_u32(o, D + 4, float32_to_bits(mn))


# Serial twins (the same code, prange run as range): a call the registry's small-call rule puts on
# one thread takes them, so a small first call on a cold cache compiles no parallel kernel (Numba's
# parfor passes, then the body once more as a gufunc: 2-3x the serial compile). Only small calls:
# on large rows the twin ran 1.7-2x slower than the parallel kernel on one thread (whose body, a
# function of its own, gets no-alias arguments).
_quantize_8bit_serial = serial_twin(_quantize_8bit)


def _small(name, *arrays):
    """Whether the call's arrays are below the kernel's one-thread threshold (``serial_bytes``)."""
    return sum(a.nbytes for a in arrays) < serial_bytes(name)


# The quantizers' twins vectorize their code loops worse than the parallel body (1.7x slower at
# [2048, 64] on one thread, 10% at [256, 128]): they take only calls where the parallel region's
# entry matters, and a small first call still compiles no parallel kernel.
_QUANTIZE_TWIN_BYTES = 1 << 15


def _quantize_twin(name, x, out):
    """Whether a quantizer call takes its serial twin (tiny and below the one-thread threshold)."""
    return x.nbytes + out.nbytes < _QUANTIZE_TWIN_BYTES and _small(name, x, out)


def float_to_fused_8bit_rowwise(input, out):
    D = input.shape[-1]
    if input.size == 0:
        return
    x = _float32_rows(input, D)
    kernel = _quantize_8bit_serial if _quantize_twin("float_to_fused_8bit_rowwise", x, out) else _quantize_8bit
    kernel(x, x.view(np.int32), out.reshape(-1, D + 8))


@njit(cache=True, parallel=True)
def _dequantize_8bit(q, out):
    R, D = out.shape
    for r in prange(R):
        row = q[r]
        scale = _get_f32(row, D)
        bias = _get_f32(row, D + 4)
        o = out[r]
        for c in range(D):
            o[c] = np.float32(row[c] * scale + bias)  # float64: exact product, one rounding, then to float32


def _float_then(out, output_dtype, fill):
    """Run ``fill(float32 out)``; a float16 ``out`` is filled from a float32 scratch (rounded by NumPy)."""
    if output_dtype == np.float32:
        fill(out)
    else:
        tmp = np.empty(out.shape, np.float32)
        fill(tmp)
        with np.errstate(over="ignore"):
            out[...] = tmp


_dequantize_8bit_serial = serial_twin(_dequantize_8bit)


def fused_8bit_rowwise_to_float(input, output_dtype, out):
    C = input.shape[-1]
    R = int(np.prod(input.shape[:-1]))
    q = np.ascontiguousarray(input).reshape(R, C)
    kernel = _dequantize_8bit_serial if _small("fused_8bit_rowwise_to_float", q, out) else _dequantize_8bit
    _float_then(out, output_dtype, lambda o: kernel(q, o.reshape(R, C - 8)))


# -- 2. fused N-bit row-wise ----------------------------------------------------
def _make_quantize_nbit(bit_rate):
    """The n-bit quantizer of one ``bit_rate`` (a compile-time constant: a call compiles one
    rate's code loop, not all three)."""
    k = 8 // bit_rate  # codes per byte

    @njit(cache=True, parallel=True)
    def kernel(x, xi, out):
        R, D = x.shape
        nbytes = D // k
        Q = np.float32(2**bit_rate - 1)
        for r in prange(R):
            row = x[r]
            o = out[r]
            mn, mx = _min_max(row, xi[r])
            bias16, b = _to_half(mn)
            rng = np.float32(mx - b)
            scale = np.float32(1.0) if rng == 0 else np.float32(rng / Q)
            scale16, s = _to_half(scale)
            if s == 0:  # float16 underflow
                scale16 = np.int64(0x3C00)
                s = np.float32(1.0)
            inv = np.float32(np.float32(1.0) / s)
            # codes stay float32 (exact small integers) and are combined into a byte arithmetically:
            # one simple loop per rate, which the compiler vectorizes
            if k == 1:
                for j in range(nbytes):
                    o[j] = np.uint8(_qf(np.float32(np.float32(row[j] - b) * inv), Q))
            elif k == 2:
                for j in range(nbytes):
                    lo = _qf(np.float32(np.float32(row[2 * j] - b) * inv), Q)
                    hi = _qf(np.float32(np.float32(row[2 * j + 1] - b) * inv), Q)
                    o[j] = np.uint8(lo + hi * np.float32(16.0))
            else:
                for j in range(nbytes):
                    c0 = _qf(np.float32(np.float32(row[4 * j] - b) * inv), Q)
                    c1 = _qf(np.float32(np.float32(row[4 * j + 1] - b) * inv), Q)
                    c2 = _qf(np.float32(np.float32(row[4 * j + 2] - b) * inv), Q)
                    c3 = _qf(np.float32(np.float32(row[4 * j + 3] - b) * inv), Q)
                    o[j] = np.uint8((c0 + c1 * np.float32(4.0)) + (c2 * np.float32(16.0) + c3 * np.float32(64.0)))
            o[nbytes] = np.uint8(scale16 & 0xFF)
            o[nbytes + 1] = np.uint8(scale16 >> 8)
            o[nbytes + 2] = np.uint8(bias16 & 0xFF)
            o[nbytes + 3] = np.uint8((bias16 >> 8) & 0xFF)

    return kernel


_QUANTIZE_NBIT = {r: _make_quantize_nbit(r) for r in (2, 4, 8)}
_QUANTIZE_NBIT_SERIAL = {r: serial_twin(kernel) for r, kernel in _QUANTIZE_NBIT.items()}


def float_to_fused_nbit_rowwise(input, bit_rate, out):
    x = _float32_rows(input, input.shape[1])
    kernels = _QUANTIZE_NBIT_SERIAL if _quantize_twin("float_to_fused_nbit_rowwise", x, out) else _QUANTIZE_NBIT
    kernels[bit_rate](x, x.view(np.int32), out)


@njit(cache=True, parallel=True)
def _dequantize_nbit(q, bit_rate, out):
    R, C = q.shape
    nbytes = C - 4
    for r in prange(R):
        row = q[r]
        scale = np.float64(half_bits_to_float32(np.int64(row[nbytes]) | (np.int64(row[nbytes + 1]) << 8)))
        bias = np.float64(half_bits_to_float32(np.int64(row[nbytes + 2]) | (np.int64(row[nbytes + 3]) << 8)))
        o = out[r]
        # float64: exact product, one rounding, then to float32; one loop per rate keeps it vectorizable
        if bit_rate == 8:
            for j in range(nbytes):
                o[j] = np.float32(row[j] * scale + bias)
        elif bit_rate == 4:
            for j in range(nbytes):
                byte = np.int32(row[j])
                o[2 * j] = np.float32((byte & 15) * scale + bias)
                o[2 * j + 1] = np.float32((byte >> 4) * scale + bias)
        else:
            for j in range(nbytes):
                byte = np.int32(row[j])
                o[4 * j] = np.float32((byte & 3) * scale + bias)
                o[4 * j + 1] = np.float32(((byte >> 2) & 3) * scale + bias)
                o[4 * j + 2] = np.float32(((byte >> 4) & 3) * scale + bias)
                o[4 * j + 3] = np.float32((byte >> 6) * scale + bias)


_dequantize_nbit_serial = serial_twin(_dequantize_nbit)


def fused_nbit_rowwise_to_float(input, bit_rate, output_dtype, out):
    q = np.ascontiguousarray(input)
    kernel = _dequantize_nbit_serial if _small("fused_nbit_rowwise_to_float", q, out) else _dequantize_nbit
    _float_then(out, output_dtype, lambda o: kernel(q, bit_rate, o))


# -- 3. bfloat16 ------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _to_bfloat16(u, out):
    for i in prange(u.shape[0]):
        x = u[i]
        if (x & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it a NaN
            out[i] = np.uint16((x >> 16) | 0x0040)
        else:
            out[i] = np.uint16((x + 0x8000) >> 16)  # ties away from zero (fbgemm)


_to_bfloat16_serial = serial_twin(_to_bfloat16)


def float_to_bfloat16(input, out):
    u, o = np.ascontiguousarray(input).reshape(-1).view(np.uint32), out.reshape(-1)
    (_to_bfloat16_serial if _small("float_to_bfloat16", u, o) else _to_bfloat16)(u, o)


@njit(cache=True, parallel=True)
def _from_bfloat16(h, out):
    for i in prange(h.shape[0]):
        out[i] = np.uint32(h[i]) << 16


_from_bfloat16_serial = serial_twin(_from_bfloat16)


def bfloat16_to_float(input, out):
    h, o = np.ascontiguousarray(input).reshape(-1), out.reshape(-1).view(np.uint32)
    (_from_bfloat16_serial if _small("bfloat16_to_float", h, o) else _from_bfloat16)(h, o)


# -- 4. float16 -------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _to_fp16(u, saturate, out):
    for i in prange(u.shape[0]):
        x = np.int64(u[i])
        if saturate and 0x477FE000 < (x & 0x7FFFFFFF) <= 0x7F800000:  # beyond 65504, not NaN
            x = (x & 0x80000000) | 0x477FE000
        out[i] = np.uint16(float32_bits_to_half_bits(x))


_to_fp16_serial = serial_twin(_to_fp16)


_HALF_MAX = np.float32(65504.0)


@njit(cache=True)
def _to_fp16_f16c(x, saturate, out):
    """:func:`_to_fp16` by the CPU's conversion (8 lanes an instruction: memory-bound on one
    thread, so no parallel region); ``x`` float32."""
    for i in range(x.shape[0]):
        v = x[i]
        if saturate and abs(v) > _HALF_MAX:  # beyond 65504 (inf too), not NaN
            v = _HALF_MAX if v > 0 else -_HALF_MAX
        out[i] = narrow_half(v)


def float_to_fp16(input, saturate, out):
    flat, o = np.ascontiguousarray(input).reshape(-1), out.reshape(-1).view(np.uint16)
    if F16C:
        _to_fp16_f16c(flat, saturate, o)
        return
    u = flat.view(np.uint32)
    (_to_fp16_serial if _small("float_to_fp16", u, o) else _to_fp16)(u, saturate, o)


@njit(cache=True, parallel=True)
def _gather(table, codes, out):
    for i in prange(codes.shape[0]):
        out[i] = table[codes[i]]


_gather_serial = serial_twin(_gather)


def _gather_codes(name, table, codes, out):
    (_gather_serial if _small(name, codes, out) else _gather)(table, codes, out)


def fp16_to_float(input, out):
    _gather_codes(
        "fp16_to_float", half_table(), np.ascontiguousarray(input).reshape(-1).view(np.uint16), out.reshape(-1)
    )


# -- 5. HFP8 ----------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _to_hfp8(u, m, bias, max_bits, out):
    min_normal = np.int64(1 - bias + 127) << 23  # bits of 2**(1 - bias)
    shift = 23 - m
    rebias = np.int64(127 - bias) << m
    sub_scale = 2.0 ** (bias + m - 1)
    for i in prange(u.shape[0]):
        x = np.int64(u[i])
        sign = (x >> 24) & 0x80
        a = x & 0x7FFFFFFF
        a = a if a < max_bits else max_bits  # fminf: inf and NaN (larger bit patterns) saturate too
        if a >= min_normal:  # round the float32 mantissa to m bits; a carry moves into the exponent
            r = (a + ((np.int64(1) << (shift - 1)) - 1) + ((a >> shift) & 1)) >> shift
            code = r - rebias
        else:
            code = np.int64(rne(bits_to_float32(a) * sub_scale))
        out[i] = np.uint8(sign | code)


_to_hfp8_serial = serial_twin(_to_hfp8)


def float_to_hfp8(input, ebits, exponent_bias, max_pos, out):
    max_bits = np.int64(np.array(max_pos, np.float32).view(np.uint32))
    u, o = np.ascontiguousarray(input).reshape(-1).view(np.uint32), out.reshape(-1)
    (_to_hfp8_serial if _small("float_to_hfp8", u, o) else _to_hfp8)(u, 7 - ebits, exponent_bias, max_bits, o)


@functools.lru_cache(maxsize=64)
def _hfp8_table(ebits, bias):
    """The float32 value of each of the 256 codes (read-only): a power of two times a fraction of
    ``7 - ebits`` bits, exact in float64, rounded once to float32 (past its range: inf). NumPy,
    once per format: a compiled loop cost the op's cold first call 0.5 s."""
    m = 7 - ebits
    c = np.arange(256)
    E = (c >> m) & ((1 << ebits) - 1)
    M = c & ((1 << m) - 1)
    v = np.ldexp(np.where(E > 0, 1.0, 0.0) + M / 2.0**m, np.maximum(E, 1) - bias)
    with np.errstate(over="ignore"):
        t = np.where(c & 0x80, -v, v).astype(np.float32)
    t.flags.writeable = False
    return t


def hfp8_to_float(input, ebits, exponent_bias, out):
    _gather_codes(
        "hfp8_to_float", _hfp8_table(ebits, exponent_bias), np.ascontiguousarray(input).reshape(-1), out.reshape(-1)
    )
