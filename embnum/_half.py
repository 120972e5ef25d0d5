"""IEEE binary16 rounding in plain Python, compiled by whichever fast path needs it
(``numba.njit`` on the host, where Numba has no float16 type).

``half_bits(x)`` is the bit pattern (0..65535) of ``float16(x)`` for a float64
``x``: round to nearest, ties to even, overflow to inf, NaN to the quiet NaN
0x7E00 (sign kept). With exact float64 inputs (e.g. the sum of two float16
values, which float64 holds exactly) this is the correctly rounded float16
result, the same as NumPy's ``float16 + float16``.
"""
import math

import numpy as np


def half_bits(x):
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    if x != x:
        return sign | 0x7E00
    a = abs(x)
    if a == math.inf:
        return sign | 0x7C00
    if a < 6.103515625e-05:  # below 2**-14: subnormal, in units of 2**-24 (1024 rounds up to the smallest normal)
        return sign | int(np.rint(a * 16777216.0))
    f, e = math.frexp(a)  # a = f * 2**e, 0.5 <= f < 1
    m = int(np.rint((2.0 * f - 1.0) * 1024.0))  # exact scaling; 1024 carries into the exponent
    biased = e - 1 + 15 + (m >> 10)
    if biased >= 31:
        return sign | 0x7C00
    return sign | (biased << 10) | (m & 0x3FF)
