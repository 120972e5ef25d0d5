"""Numba-CUDA kernels of the quant family.

Same contract as ``embnum.cpu.quant``: validated arguments plus ``out``,
filled completely.

Shapes (``LANES`` = 32 on a GPU, one warp; ``_common.LANES`` under the simulator):

* row quantizers (8-bit and n-bit, float -> rows): one lane group per row, lanes
  over the columns (loads of ``x`` coalesced across the group); each lane keeps the
  first minimum and maximum of its columns, and the group combines them with
  ``shfl_xor`` butterflies (min/max are exact, and ties go to the lower column, so the
  result is the oracle's "first minimal / maximal element" whatever the lane count; a lane
  loads four of its columns before comparing the first, so four loads are in flight);
  then every lane encodes its own columns (n-bit: its own output bytes) and stores
  them coalesced, and lane 0 stores the row's scale and bias. The loop over rows is
  block-uniform (every thread takes the same number of trips), as the shuffles need.
* row dequantizers (rows -> float): one lane group per row, lanes over the output
  columns; scale and bias are one broadcast load per group.
* the element-wise codecs give one element to one thread.

Arithmetic is float32 where the documented formula rounds with ``fl32`` and float64
for the dequantizers' ``q * scale + bias`` (written as a separate multiply
and add, so the result equals the oracle's; the documented tolerance would also allow the
fused form). Float16 is read and written as uint16 bit patterns through
``embnum._half`` (compiled in ``._common``), so the kernels need no device float16 support.
No atomics anywhere.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import _qrow
from .._jit import cuda_kernel
from ._common import (
    LANES,
    TPB,
    bits_to_float32,
    blocks,
    contiguous,
    float32_bits_to_half_bits,
    float32_to_bits,
    float_to_half_bits,
    half_bits_to_float,
    launch,
    rne,
    shfl_xor,
    xp,
)

_put_u32 = cuda.jit(device=True)(_qrow.put_u32)


def _launch(n):
    return blocks(n, TPB), TPB


def _row_groups(R):
    """Grid of one lane group per row."""
    return blocks(R, TPB // LANES), TPB


def _float32_rows(a, D):
    return xp().ascontiguousarray(a, dtype=np.float32).reshape(-1, D)


@cuda.jit(device=True)
def _take(v, c, D, bad, mn, imn, mx, imx):
    """The lane's running ``(bad, min, its column, max, its column)`` after column ``c`` (value ``v``;
    columns taken in increasing order, so a tie keeps the first)."""
    if v != v:
        bad = 1
    if imn == D or v < mn:
        mn = v
        imn = c
    if imx == D or v > mx:
        mx = v
        imx = c
    return bad, mn, imn, mx, imx


@cuda.jit(device=True)
def _min_max(x, r, active, lane):
    """(min, max) of row ``r`` of ``x`` over the lane group, every lane gets them; NaN for both
    if the row holds a NaN. Every thread of the block calls it (``active`` False: no reads).
    A lane loads four of its columns before comparing the first (four loads in flight)."""
    D = x.shape[1]
    mn = np.float32(0.0)
    mx = np.float32(0.0)
    imn = D  # column of the lane's first minimum, D while it has none
    imx = D
    bad = 0
    if active:
        c = lane
        while c + 3 * LANES < D:
            v0 = np.float32(x[r, c])
            v1 = np.float32(x[r, c + LANES])
            v2 = np.float32(x[r, c + 2 * LANES])
            v3 = np.float32(x[r, c + 3 * LANES])
            bad, mn, imn, mx, imx = _take(v0, c, D, bad, mn, imn, mx, imx)
            bad, mn, imn, mx, imx = _take(v1, c + LANES, D, bad, mn, imn, mx, imx)
            bad, mn, imn, mx, imx = _take(v2, c + 2 * LANES, D, bad, mn, imn, mx, imx)
            bad, mn, imn, mx, imx = _take(v3, c + 3 * LANES, D, bad, mn, imn, mx, imx)
            c += 4 * LANES
        while c < D:
            bad, mn, imn, mx, imx = _take(np.float32(x[r, c]), c, D, bad, mn, imn, mx, imx)
            c += LANES
    off = LANES // 2
    while off > 0:
        omn = np.float32(shfl_xor(mn, off))
        oimn = np.int64(shfl_xor(imn, off))
        omx = np.float32(shfl_xor(mx, off))
        oimx = np.int64(shfl_xor(imx, off))
        bad |= np.int64(shfl_xor(bad, off))
        if oimn < D and (imn == D or omn < mn or (omn == mn and oimn < imn)):
            mn = omn
            imn = oimn
        if oimx < D and (imx == D or omx > mx or (omx == mx and oimx < imx)):
            mx = omx
            imx = oimx
        off //= 2
    if bad:
        mn = np.float32(np.nan)
        mx = mn
    return mn, mx


@cuda.jit(device=True)
def _code(p, Q):
    """``clamp(rne(p), 0, Q)``; NaN -> 0."""
    if not p > np.float32(0.0):
        p = np.float32(0.0)
    if p > Q:
        p = Q
    return np.uint8(rne(np.float64(p)))


@cuda.jit(device=True)
def _get_u32(row, at):
    return (
        np.int64(row[at]) | (np.int64(row[at + 1]) << 8) | (np.int64(row[at + 2]) << 16) | (np.int64(row[at + 3]) << 24)
    )


# -- 1. fused 8-bit row-wise ----------------------------------------------------
@cuda_kernel
def _quantize_8bit(x, out):
    """out ``[R, D + 8]`` uint8: lane group per row (block-uniform loop over rows)."""
    R, D = x.shape
    Q = np.float32(255.0)
    lane = cuda.threadIdx.x % LANES
    per_block = cuda.blockDim.x // LANES
    for r0 in range(cuda.blockIdx.x * per_block, R, cuda.gridDim.x * per_block):
        r = r0 + cuda.threadIdx.x // LANES
        active = r < R
        mn, mx = _min_max(x, r, active, lane)
        if active:
            rng = np.float32(mx - mn)
            inv = np.float32(Q / np.float32(rng + np.float32(1e-8)))
            for c in range(lane, D, LANES):
                out[r, c] = _code(np.float32(np.float32(x[r, c] - mn) * inv), Q)
            if lane == 0:
                o = out[r]
                _put_u32(o, D, float32_to_bits(np.float32(rng / Q)))
                _put_u32(o, D + 4, float32_to_bits(mn))


def float_to_fused_8bit_rowwise(input, out):
    D = input.shape[-1]
    x = _float32_rows(input, D)
    if x.shape[0]:
        launch(_quantize_8bit, *_row_groups(x.shape[0]), x, out.reshape(-1, D + 8))


@cuda.jit(device=True)
def _store(out16, out32, r, c, v):
    """Write the float32 value ``v`` to the float32 output, or its float16 rounding to the bits output."""
    if out16.shape[0] > 0:
        out16[r, c] = np.uint16(float_to_half_bits(np.float32(v)))
    else:
        out32[r, c] = np.float32(v)


@cuda_kernel
def _dequantize_8bit(q, D, out16, out32):
    """out ``[R, D]``: lane group per row, lanes over the columns."""
    R = q.shape[0]
    lane = cuda.threadIdx.x % LANES
    for r in range(cuda.grid(1) // LANES, R, cuda.gridsize(1) // LANES):
        row = q[r]
        scale = bits_to_float32(_get_u32(row, D))
        bias = bits_to_float32(_get_u32(row, D + 4))
        for c in range(lane, D, LANES):
            prod = np.float64(row[c]) * scale
            _store(out16, out32, r, c, prod + bias)


def _outputs(out, output_dtype, D):
    """(uint16 [R, D] view or an empty stand-in, float32 [R, D] view or an empty stand-in)."""
    flat = out.reshape(-1, D)
    if output_dtype == np.float16:
        return flat.view(np.uint16), xp().empty((0, 1), np.float32)
    return xp().empty((0, 1), np.uint16), flat


def fused_8bit_rowwise_to_float(input, output_dtype, out):
    C = input.shape[-1]
    D = C - 8
    q = contiguous(input).reshape(-1, C)
    if q.shape[0] and D:
        launch(_dequantize_8bit, *_row_groups(q.shape[0]), q, D, *_outputs(out, output_dtype, D))


# -- 2. fused N-bit row-wise ----------------------------------------------------
@cuda_kernel
def _quantize_nbit(x, bit_rate, out):
    """out ``[R, D / (8 / bit_rate) + 4]`` uint8: lane group per row, lanes over the output bytes
    (each packs ``8 / bit_rate`` adjacent columns); block-uniform loop over rows."""
    R, D = x.shape
    k = 8 // bit_rate
    nbytes = D // k
    Q = np.float32(2**bit_rate - 1)
    lane = cuda.threadIdx.x % LANES
    per_block = cuda.blockDim.x // LANES
    for r0 in range(cuda.blockIdx.x * per_block, R, cuda.gridDim.x * per_block):
        r = r0 + cuda.threadIdx.x // LANES
        active = r < R
        mn, mx = _min_max(x, r, active, lane)
        if active:
            bias16 = float_to_half_bits(mn)
            b = np.float32(half_bits_to_float(bias16))
            rng = np.float32(mx - b)
            scale = np.float32(1.0) if rng == 0 else np.float32(rng / Q)
            scale16 = float_to_half_bits(scale)
            s = np.float32(half_bits_to_float(scale16))
            if s == 0:
                scale16 = np.int64(0x3C00)
                s = np.float32(1.0)
            inv = np.float32(np.float32(1.0) / s)
            for j in range(lane, nbytes, LANES):
                acc = 0
                for i in range(k):
                    acc |= np.int64(_code(np.float32(np.float32(x[r, j * k + i] - b) * inv), Q)) << (bit_rate * i)
                out[r, j] = np.uint8(acc)
            if lane == 0:
                out[r, nbytes] = np.uint8(scale16 & 0xFF)
                out[r, nbytes + 1] = np.uint8((scale16 >> 8) & 0xFF)
                out[r, nbytes + 2] = np.uint8(bias16 & 0xFF)
                out[r, nbytes + 3] = np.uint8((bias16 >> 8) & 0xFF)


def float_to_fused_nbit_rowwise(input, bit_rate, out):
    x = _float32_rows(input, input.shape[1])
    if x.shape[0]:
        launch(_quantize_nbit, *_row_groups(x.shape[0]), x, bit_rate, out)


@cuda_kernel
def _dequantize_nbit(q, bit_rate, out16, out32):
    """out ``[R, D]``: lane group per row, lanes over the output columns."""
    R, C = q.shape
    k = 8 // bit_rate
    nbytes = C - 4
    D = nbytes * k
    mask = (1 << bit_rate) - 1
    lane = cuda.threadIdx.x % LANES
    for r in range(cuda.grid(1) // LANES, R, cuda.gridsize(1) // LANES):
        row = q[r]
        scale = half_bits_to_float(np.int64(row[nbytes]) | (np.int64(row[nbytes + 1]) << 8))
        bias = half_bits_to_float(np.int64(row[nbytes + 2]) | (np.int64(row[nbytes + 3]) << 8))
        for c in range(lane, D, LANES):
            code = (np.int64(row[c // k]) >> (bit_rate * (c % k))) & mask
            prod = scale * np.float64(code)
            _store(out16, out32, r, c, prod + bias)


def fused_nbit_rowwise_to_float(input, bit_rate, output_dtype, out):
    q = contiguous(input)
    D = out.shape[1]
    if q.shape[0] and D:
        launch(_dequantize_nbit, *_row_groups(q.shape[0]), q, bit_rate, *_outputs(out, output_dtype, D))


# -- 3. bfloat16 ------------------------------------------------------------------
@cuda_kernel
def _to_bfloat16(u, out):
    for i in range(cuda.grid(1), u.shape[0], cuda.gridsize(1)):
        x = np.int64(u[i])
        if (x & 0x7FFFFFFF) > 0x7F800000:
            out[i] = np.uint16((x >> 16) | 0x0040)
        else:
            out[i] = np.uint16((x + 0x8000) >> 16)


def _flat(a, dtype):
    return contiguous(a).reshape(-1).view(dtype)


def float_to_bfloat16(input, out):
    if out.size:
        launch(_to_bfloat16, *_launch(out.size), _flat(input, np.uint32), out.reshape(-1))


@cuda_kernel
def _from_bfloat16(h, out):
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        out[i] = np.uint32(np.int64(h[i]) << 16)


def bfloat16_to_float(input, out):
    if out.size:
        launch(_from_bfloat16, *_launch(out.size), _flat(input, np.uint16), out.reshape(-1).view(np.uint32))


# -- 4. float16 -------------------------------------------------------------------
@cuda_kernel
def _to_fp16(u, saturate, out):
    for i in range(cuda.grid(1), u.shape[0], cuda.gridsize(1)):
        x = np.int64(u[i])
        a = x & 0x7FFFFFFF
        if saturate and a > 0x477FE000 and a <= 0x7F800000:  # beyond 65504, not NaN
            x = (x & 0x80000000) | 0x477FE000
        out[i] = np.uint16(float32_bits_to_half_bits(x))


def float_to_fp16(input, saturate, out):
    if out.size:
        launch(_to_fp16, *_launch(out.size), _flat(input, np.uint32), saturate, out.reshape(-1).view(np.uint16))


@cuda_kernel
def _from_fp16(h, out):
    for i in range(cuda.grid(1), h.shape[0], cuda.gridsize(1)):
        out[i] = np.float32(half_bits_to_float(h[i]))


def fp16_to_float(input, out):
    if out.size:
        launch(_from_fp16, *_launch(out.size), _flat(input, np.uint16), out.reshape(-1))


# -- 5. HFP8 ----------------------------------------------------------------------
@cuda_kernel
def _to_hfp8(u, m, bias, max_bits, out):
    min_normal = np.int64(1 - bias + 127) << 23
    shift = 23 - m
    rebias = np.int64(127 - bias) << m
    for i in range(cuda.grid(1), u.shape[0], cuda.gridsize(1)):
        x = np.int64(u[i])
        sign = (x >> 24) & 0x80
        a = x & 0x7FFFFFFF
        if a > max_bits:  # fminf: inf and NaN saturate too
            a = max_bits
        if a >= min_normal:
            code = (a + ((np.int64(1) << (shift - 1)) - 1) + ((a >> shift) & 1)) >> shift
            code -= rebias
        else:
            code = np.int64(rne(math.ldexp(bits_to_float32(a), int(bias + m - 1))))
        out[i] = np.uint8(sign | code)


def float_to_hfp8(input, ebits, exponent_bias, max_pos, out):
    max_bits = int(np.array(max_pos, np.float32).view(np.uint32))
    if out.size:
        launch(
            _to_hfp8, *_launch(out.size), _flat(input, np.uint32), 7 - ebits, exponent_bias, max_bits, out.reshape(-1)
        )


@cuda_kernel
def _from_hfp8(c, ebits, bias, out):
    m = 7 - ebits
    for i in range(cuda.grid(1), c.shape[0], cuda.gridsize(1)):
        code = np.int64(c[i])
        E = (code >> m) & ((1 << ebits) - 1)
        M = code & ((1 << m) - 1)
        if E > 0:
            v = math.ldexp(np.float64(M + (1 << m)), int(E - bias - m))
        else:
            v = math.ldexp(np.float64(M), int(1 - bias - m))
        out[i] = np.float32(-v if code & 0x80 else v)


def hfp8_to_float(input, ebits, exponent_bias, out):
    if out.size:
        launch(_from_hfp8, *_launch(out.size), _flat(input, np.uint8), ebits, exponent_bias, out.reshape(-1))
