"""Bit-level float conversions, written once in plain Python and compiled by
both fast paths (``numba.njit`` in ``embnum.cpu``, ``numba.cuda.jit(device=True)``
in ``embnum.cuda``), where NumPy's float16 and ``view`` are not available.

Every function is a leaf (it calls no other function of this module), so each
target compiles them independently. All conversions are exact or round to
nearest, ties to even, as IEEE 754 does; they are checked against NumPy's
conversions in the tests.

* ``rne(x)``: round a float to the nearest integer, ties to even (as ``lrintf``).
* ``half_bits_to_float(h)``: binary16 bit pattern -> its exact value (float64).
* ``float_to_half_bits(v)``: a float value -> binary16 bits, one rounding
  (overflow gives inf, NaN gives the quiet NaN ``0x7E00`` with the sign kept).
* ``float32_bits_to_half_bits(u)``: the same from a float32 bit pattern
  (integer arithmetic only; NaN payloads kept as the hardware does).
* ``float32_to_bits(v)`` / ``bits_to_float32(u)``: a float32 value <-> its bit
  pattern (NaN becomes the canonical quiet NaN ``0x7FC00000``; decoding a NaN
  pattern gives a NaN without its payload).
"""

import math

import numpy as np


def rne(x):
    """The integer nearest to ``x`` (a finite float), ties to even, as a float."""
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r - 2.0 * math.floor(r * 0.5) == 1.0):
        r += 1.0
    return r


def half_bits_to_float(h):
    """binary16 bit pattern (any integer type) -> its exact value as a float64."""
    h = np.int64(h)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = math.ldexp(np.float64(m), (-24))
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(np.float64(m + 1024), int(e - 25))
    return -v if h & 0x8000 else v


def float_to_half_bits(v):
    """binary16 bits (int64) of ``v`` rounded once to nearest-even; overflow gives inf."""
    if v != v:
        return np.int64(0xFE00) if math.copysign(1.0, v) < 0 else np.int64(0x7E00)
    sign = np.int64(0x8000) if math.copysign(1.0, v) < 0 else np.int64(0)
    a = abs(np.float64(v))
    if a >= 65520.0:  # halfway between 65504 and 2**16 rounds (to even) to inf
        return sign | np.int64(0x7C00)
    if a < 6.103515625e-05:  # below 2**-14: subnormal step 2**-24
        x = a * 16777216.0
        r = math.floor(x)
        d = x - r
        if d > 0.5 or (d == 0.5 and r - 2.0 * math.floor(r * 0.5) == 1.0):
            r += 1.0
        return sign | np.int64(r)  # 1024 (the smallest normal) when it rounds up
    f, e = math.frexp(a)  # a = f * 2**e, 0.5 <= f < 1
    x = f * 2048.0
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and r - 2.0 * math.floor(r * 0.5) == 1.0):
        r += 1.0
    q = np.int64(r)
    biased = np.int64(e) + 14
    if q == 2048:
        q = np.int64(1024)
        biased += 1
    return sign | (biased << 10) | (q - 1024)


def float32_bits_to_half_bits(u):
    """binary16 bits (int64) of the float32 with bit pattern ``u``, nearest-even."""
    u = np.int64(u) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN: quiet, top payload bits kept
        return sign | 0x7E00 | ((a >> 13) & 0x3FF)
    if a >= 0x477FF000:  # >= 65520 (or inf)
        return sign | 0x7C00
    if a >= 0x38800000:  # >= 2**-14: normal; rebias the exponent, round 13 bits away
        a -= 0x38000000
        return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)
    e = a >> 23
    if e < 102:  # below 2**-25: rounds to zero
        return sign
    m = (a & 0x7FFFFF) | 0x800000
    shift = 126 - e
    r = m >> shift
    rem = m & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rem > half or (rem == half and (r & 1) == 1):
        r += 1
    return sign | r


def float32_to_bits(v):
    """The bit pattern (int64) of the float32 value ``v``; NaN -> 0x7FC00000."""
    if v != v:
        return np.int64(0x7FC00000)
    sign = np.int64(0x80000000) if math.copysign(1.0, v) < 0 else np.int64(0)
    a = abs(np.float64(v))
    if a == math.inf:
        return sign | np.int64(0x7F800000)
    if a < 1.1754943508222875e-38:  # float32 subnormal (or zero): step 2**-149
        return sign | np.int64(math.ldexp(a, 149))
    f, e = math.frexp(a)  # 24 significant bits: f * 2**24 is an integer
    return sign | (np.int64(e + 126) << 23) | (np.int64(math.ldexp(f, 24)) - 0x800000)


def bits_to_float32(u):
    """The value (float64, exactly a float32) of the float32 bit pattern ``u``."""
    u = np.int64(u) & 0xFFFFFFFF
    e = (u >> 23) & 0xFF
    m = u & 0x7FFFFF
    if e == 0:
        v = math.ldexp(np.float64(m), (-149))
    elif e == 255:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(np.float64(m + 0x800000), int(e - 150))
    return -v if u & 0x80000000 else v
