"""Half precision, once for every family and backend.

Bit-level float conversions, written once in plain Python and compiled by
both fast paths (``numba.njit`` in ``embnum.cpu._common``,
``numba.cuda.jit(device=True)`` in ``embnum.cuda._common``: every kernel
takes them from there), where NumPy's float16 and ``view`` are not available.

The accumulation rule (every family, every fast backend): float16 data is
widened exactly to float32, sums and dot products are accumulated in float32,
and the float32 result is rounded once to float16 at the end
(``float32_result`` / ``round_once`` in each backend's ``_common``). The one
deliberate exception is an op whose specification rounds after every
addition (``permute_multi_embedding_backward``: NumPy's float16 addition, as
fbgemm's CPU kernel does). The oracle (``embnum.ref``) may accumulate wider;
the op's check allows the difference.

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
* ``half_bits_to_float32_bits(h)``: binary16 bits -> the float32 bits of the same
  value (exact, integer arithmetic only; NaN payloads kept).
* ``float32_table()``: the float32 value of every binary16 pattern (65536 entries,
  built once, read-only); the fast paths widen float16 arrays through it.
"""

import functools
import math

import numpy as np


@functools.cache
def float32_table() -> np.ndarray:
    """``table[h]``: the float32 value of binary16 pattern ``h`` (NaN payloads kept), read-only."""
    table = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


def round_once(acc, out) -> None:
    """Write the float32 accumulator ``acc`` into the float16 ``out`` (NumPy or CuPy), rounding
    once, nearest-even, overflow to inf; nothing when ``acc is out`` (a float32 result)."""
    if acc is not out:
        with np.errstate(over="ignore"):
            out[...] = acc


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


def half_bits_to_float32_bits(h):
    """float16 bit pattern -> float32 bit pattern (int64; exact, NaN payload kept), integers only."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 31:
        return sign | 0x7F800000 | (m << 13)
    if e == 0:
        if m == 0:
            return sign
        shift = 0
        while m < 0x400:  # normalise the subnormal
            m <<= 1
            shift += 1
        return sign | ((113 - shift) << 23) | ((m & 0x3FF) << 13)
    return sign | ((e + 112) << 23) | (m << 13)
