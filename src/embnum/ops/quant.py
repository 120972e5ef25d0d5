"""Declarations of the quant family (``docs/families/quant.md``): row-wise
quantization formats and element-wise communication codecs.

Each function below states an op's public signature and validates its
arguments; the registry turns it into ``embnum.<name>`` and finds the
implementations in ``embnum.{ref,cpu,cuda}.quant``. Encoders are bit-exact on
every backend; decoders too, except that a fused multiply-add may move a
dequantized value by 1 float32 ulp (``docs/families/quant.md``), which the checks allow.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as v
from .._compare import same_bits
from .._registry import check, op

F16, F32, U8, U16 = (np.dtype(t) for t in (np.float16, np.float32, np.uint8, np.uint16))
HALF_OR_FLOAT = (F16, F32)
BIT_RATES = (2, 4, 8)


# -- shared checks ---------------------------------------------------------
def _rows_input(name, a, *, dtypes, exactly_2d=False):
    v.array(name, a, dtypes=dtypes)
    if exactly_2d and a.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, columns], got shape {tuple(a.shape)}")
    if a.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dims (rows along the last one), got shape {tuple(a.shape)}")
    return a


def _bit_rate(bit_rate):
    if type(bit_rate) is int and bit_rate in BIT_RATES:  # the per-call case
        return bit_rate
    bit_rate = v.integer("bit_rate", bit_rate, what="an int (2, 4 or 8)")
    if bit_rate not in BIT_RATES:
        raise ValueError(f"bit_rate must be 2, 4 or 8, got {bit_rate}")
    return bit_rate


_OUTPUT_DTYPES = {"float32": F32, "float16": F16}  # the names callers pass, as v.output_dtype reads them


def _output_dtype(value):
    """``v.output_dtype(value)``, without NumPy's dtype parsing for the usual names and dtypes."""
    if value is F32 or value is F16:
        return value
    if type(value) is str:
        dt = _OUTPUT_DTYPES.get(value)
        if dt is not None:
            return dt
    return v.output_dtype(value)


_HFP8_FORMATS: dict = {}  # (ebits, exponent_bias) Python ints -> (hfp8_format's result, the largest value)


def _hfp8(ebits, exponent_bias):
    """``(hfp8_format(...), hfp8_largest(...))``, looked up for Python ints already seen valid."""
    if type(ebits) is int and type(exponent_bias) is int:
        known = _HFP8_FORMATS.get((ebits, exponent_bias))
        if known is not None:
            return known
    fmt = hfp8_format(ebits, exponent_bias)
    known = fmt, hfp8_largest(fmt[0], fmt[1])
    if type(ebits) is int and type(exponent_bias) is int and len(_HFP8_FORMATS) < 256:
        _HFP8_FORMATS[(ebits, exponent_bias)] = known
    return known


def hfp8_format(ebits, exponent_bias):
    """Validated ``(ebits, exponent_bias, m)`` of an HFP8 format (``docs/families/quant.md``)."""
    ebits = v.integer("ebits", ebits)
    exponent_bias = v.integer("exponent_bias", exponent_bias)
    if not 1 <= ebits <= 7:
        raise ValueError(f"ebits must be in 1..7, got {ebits}")
    m = 7 - ebits
    lo, hi = 1 - exponent_bias - m, 2**ebits - 1 - exponent_bias
    if lo < -126 or hi > 127:
        raise ValueError(
            f"exponent_bias = {exponent_bias} with ebits = {ebits} gives codes from 2**{lo} to 2**{hi}, "
            "outside the normal float32 range 2**-126 .. 2**127"
        )
    return ebits, exponent_bias, m


def hfp8_largest(ebits, exponent_bias):
    """The largest value an HFP8 format encodes: ``(2 - 2**-m) * 2**(2**ebits - 1 - bias)``."""
    m = 7 - ebits
    return (2 - 2.0**-m) * 2.0 ** (2**ebits - 1 - exponent_bias)


def hfp8_usual_max_pos(ebits, exponent_bias):
    """The customary ``max_pos`` (TorchRec, fbgemm tests): the top exponent code left unused."""
    m = 7 - ebits
    return (2 - 2.0**-m) * 2.0 ** (2**ebits - 2 - exponent_bias)


def _bfloat16_bits(name, a):
    """A uint16 array, or an ``ml_dtypes.bfloat16`` array read as uint16."""
    if type(a) is np.ndarray and a.dtype == U16:  # the per-call case: no dtype name built
        return a
    v.array(name, a)
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        return a.view(U16)
    if a.dtype != U16:
        raise TypeError(f"{name} must have dtype uint16 (bfloat16 bit patterns) or bfloat16, got {a.dtype}")
    return a


# -- 1. fused 8-bit row-wise ------------------------------------------------
@op("quant")
def float_to_fused_8bit_rowwise(input):
    """Quantize each row (last axis) to 8-bit codes with a float32 scale and bias.

    input: float32 or float16 ``[..., D]``, ``ndim >= 2``, ``D >= 1``, any strides.
    Output: uint8 ``[..., D + 8]``: D codes, then scale and bias as
    little-endian float32. Rows holding inf/NaN (unspecified): every
    backend gives the same bytes; a NaN scale or bias is stored as
    ``0x7FC00000`` and a NaN code product gives code 0. ``min``/``max`` are the
    first minimal/maximal element of the row (so the sign of a zero bias is fbgemm's).

    Examples
    --------
    >>> q = embnum.float_to_fused_8bit_rowwise(np.array([[0.0, 1.0, 2.0, 3.5]], dtype=np.float32))
    >>> q[:, :4], q[:, 4:].view(np.float32)  # codes, then scale and bias
    (array([[  0,  73, 146, 255]], dtype=uint8), array([[0.01372549, 0.        ]], dtype=float32))
    """
    _rows_input("input", input, dtypes=HALF_OR_FLOAT)
    D = input.shape[-1]
    if D < 1:
        raise ValueError(f"input's last dim D must be >= 1, got shape {tuple(input.shape)}")
    return (dict(input=input), ((*input.shape[:-1], D + 8), U8))


@op("quant")
def fused_8bit_rowwise_to_float(input, *, output_dtype="float32"):
    """Dequantize fused 8-bit rows: ``out[c] = fl32(q[c] * scale + bias)`` (float64 arithmetic).

    input: uint8 ``[..., C]``, ``ndim >= 2``, ``C >= 8``. Output ``[..., C - 8]`` in
    ``output_dtype`` (``"float32"`` or ``"float16"``: the float32 result rounded
    to nearest-even).

    Examples
    --------
    >>> q = embnum.float_to_fused_8bit_rowwise(np.array([[0.0, 1.0, 2.0, 3.5]], dtype=np.float32))
    >>> embnum.fused_8bit_rowwise_to_float(q)
    array([[0.       , 1.0019608, 2.0039215, 3.5      ]], dtype=float32)
    """
    _rows_input("input", input, dtypes=(U8,))
    C = input.shape[-1]
    if C < 8:
        raise ValueError(f"input rows must hold at least 8 bytes (scale and bias), got {C}")
    dt = _output_dtype(output_dtype)
    return (dict(input=input, output_dtype=dt), ((*input.shape[:-1], C - 8), dt))


# -- 2. fused N-bit row-wise ------------------------------------------------
@op("quant")
def float_to_fused_nbit_rowwise(input, bit_rate):
    """Quantize each row to ``bit_rate``-bit codes (2, 4 or 8) with a float16 scale and bias.

    input: float32 or float16 ``[R, D]``, ``D`` a positive multiple of
    ``2 * (8 // bit_rate)``. Output: uint8 ``[R, D // k + 4]`` with
    ``k = 8 // bit_rate`` codes per byte (the first element in the lowest bits),
    then scale and bias as little-endian float16.

    Examples
    --------
    >>> embnum.float_to_fused_nbit_rowwise(np.array([[0, 1, 2, 3.5, -0.5, 0.25, 7, 1]], dtype=np.float32), 4)
    array([[ 49, 133,  32,  63,   0,  56,   0, 184]], dtype=uint8)
    """
    bit_rate = _bit_rate(bit_rate)
    _rows_input("input", input, dtypes=HALF_OR_FLOAT, exactly_2d=True)
    k = 8 // bit_rate
    D = input.shape[1]
    if D < 1 or D % (2 * k):
        raise ValueError(f"input's row width D must be a positive multiple of {2 * k} for bit_rate {bit_rate}, got {D}")
    return (dict(input=input, bit_rate=bit_rate), ((input.shape[0], D // k + 4), U8))


@op("quant")
def fused_nbit_rowwise_to_float(input, bit_rate, *, output_dtype="float32"):
    """Dequantize fused N-bit rows: ``out[c] = fl32(float64(scale) * q[c] + float64(bias))``.

    input: uint8 ``[R, C]``, ``C >= 4``; bit_rate 2, 4 or 8. Output
    ``[R, (C - 4) * (8 // bit_rate)]`` in ``output_dtype`` (``"float32"``/``"float16"``).

    Examples
    --------
    >>> q = embnum.float_to_fused_nbit_rowwise(np.array([[0, 1, 2, 3.5, -0.5, 0.25, 7, 1]], dtype=np.float32), 4)
    >>> embnum.fused_nbit_rowwise_to_float(q, 4)
    array([[ 0. ,  1. ,  2. ,  3.5, -0.5,  0.5,  7. ,  1. ]], dtype=float32)
    """
    bit_rate = _bit_rate(bit_rate)
    _rows_input("input", input, dtypes=(U8,), exactly_2d=True)
    C = input.shape[1]
    if C < 4:
        raise ValueError(f"input rows must hold at least 4 bytes (scale and bias), got {C}")
    dt = _output_dtype(output_dtype)
    return (dict(input=input, bit_rate=bit_rate, output_dtype=dt), ((input.shape[0], (C - 4) * (8 // bit_rate)), dt))


# -- 3. bfloat16 --------------------------------------------------------------
@op("quant")
def float_to_bfloat16(input):
    """float32 (any shape) -> bfloat16 bit patterns (uint16, same shape).

    ``(u + 0x8000) >> 16``: nearest, ties away from zero (fbgemm's rounding);
    NaN stays NaN: ``(u >> 16) | 0x0040``.

    Examples
    --------
    >>> [hex(b) for b in embnum.float_to_bfloat16(np.array([1.0, 1.00390625, -2.5e-3], dtype=np.float32))]
    ['0x3f80', '0x3f81', '0xbb24']
    """
    v.array("input", input, dtypes=(F32,))
    return (dict(input=input), (input.shape, U16))


@op("quant")
def bfloat16_to_float(input):
    """bfloat16 bit patterns (uint16, or an ``ml_dtypes.bfloat16`` array) -> float32, exact.

    Examples
    --------
    >>> embnum.bfloat16_to_float(np.array([0x3F80, 0x3F81, 0xBB24], dtype=np.uint16))
    array([ 1.        ,  1.0078125 , -0.00250244], dtype=float32)
    """
    bits = _bfloat16_bits("input", input)
    return (dict(input=bits), (bits.shape, F32))


# -- 4. float16 ---------------------------------------------------------------
@op("quant")
def float_to_fp16(input, *, saturate=True):
    """float32 (any shape) -> float16, nearest-even.

    ``saturate=True`` (TorchRec's FP16 codec): clamp to ``[-65504, 65504]`` first,
    so inf becomes the largest finite value; NaN stays NaN. ``saturate=False``:
    plain IEEE conversion (overflow gives inf).

    Examples
    --------
    >>> embnum.float_to_fp16(np.array([1.0, 1e-8, 1e6], dtype=np.float32))
    array([1.00e+00, 0.00e+00, 6.55e+04], dtype=float16)
    >>> embnum.float_to_fp16(np.array([1e6], dtype=np.float32), saturate=False)
    array([inf], dtype=float16)
    """
    v.array("input", input, dtypes=(F32,))
    return (dict(input=input, saturate=v.flag("saturate", saturate)), (input.shape, F16))


@op("quant")
def fp16_to_float(input):
    """float16 (any shape) -> float32, exact.

    Examples
    --------
    >>> embnum.fp16_to_float(np.array([1.0, 65504.0], dtype=np.float16))
    array([1.0000e+00, 6.5504e+04], dtype=float32)
    """
    v.array("input", input, dtypes=(F16,))
    return (dict(input=input), (input.shape, F32))


# -- 5. HFP8 ------------------------------------------------------------------
@op("quant")
def float_to_hfp8(input, ebits, exponent_bias, max_pos):
    """float32 (any shape) -> HFP8 codes (uint8, same shape): 1 sign bit, ``ebits``
    exponent bits, ``7 - ebits`` mantissa bits, nearest-even; magnitudes (and
    NaN) saturate to ``max_pos``.

    ``max_pos``: finite, ``> 0`` and at most the format's largest value.

    Examples
    --------
    >>> embnum.float_to_hfp8(np.array([0, 1, -1, 0.3, 100, 1000], dtype=np.float32), 4, 7, 480.0)
    array([  0,  56, 184,  42, 108, 127], dtype=uint8)
    """
    (ebits, exponent_bias, _), largest = _hfp8(ebits, exponent_bias)
    v.array("input", input, dtypes=(F32,))
    if type(max_pos) is float and -3e38 < max_pos < 3e38:  # the per-call case: no overflow to watch
        mp = np.float32(max_pos)
    else:
        v.real("max_pos", max_pos)
        with np.errstate(over="ignore"):
            mp = np.float32(max_pos)
    if not (math.isfinite(mp) and 0 < mp <= largest):
        raise ValueError(
            f"max_pos must be finite, > 0 and at most {largest} (the largest value of this format), got {max_pos!r}"
        )
    return (dict(input=input, ebits=ebits, exponent_bias=exponent_bias, max_pos=mp), (input.shape, U8))


@op("quant")
def hfp8_to_float(input, ebits, exponent_bias):
    """HFP8 codes (uint8, any shape) -> float32, exact.

    Examples
    --------
    >>> embnum.hfp8_to_float(np.array([0, 56, 184, 42, 108, 127], dtype=np.uint8), 4, 7)
    array([ 0.000e+00,  1.000e+00, -1.000e+00,  3.125e-01,  9.600e+01,
            4.800e+02], dtype=float32)
    """
    (ebits, exponent_bias, _), _ = _hfp8(ebits, exponent_bias)
    v.array("input", input, dtypes=(U8,))
    return (dict(input=input, ebits=ebits, exponent_bias=exponent_bias), (input.shape, F32))


# -- oracle comparisons -------------------------------------------------------
for _decoder in (fused_8bit_rowwise_to_float, fused_nbit_rowwise_to_float):
    check(_decoder)(lambda got, want, args: same_bits(got, want, args, ulps=1))
for _codec in (fp16_to_float, float_to_fp16, bfloat16_to_float, hfp8_to_float):
    check(_codec)(same_bits)
