"""The quant declarations' per-call shortcuts agree with the exact rules they skip: the
cached HFP8 formats, the output-dtype names and the bit rates give the same values, and the same
error types and messages, on drawn arguments valid and not (a format's first call fills the cache,
so each case is asked twice)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from embnum import _validate
from embnum.ops import quant

EXAMPLES = settings(max_examples=150)
ODD = st.sampled_from([True, 4.0, np.int64(4), np.int8(3), "4", None, -(2**63), 2**64])


def _outcome(fn, *args):
    try:
        return fn(*args)
    except (ValueError, TypeError) as e:
        return type(e).__name__, str(e)


@EXAMPLES
@given(st.one_of(st.integers(-2, 9), ODD), st.one_of(st.integers(-140, 140), ODD))
def test_cached_hfp8_formats_match_the_exact_rules(ebits, bias):
    def exact(e, b):
        fmt = quant.hfp8_format(e, b)
        return fmt, quant.hfp8_largest(fmt[0], fmt[1])

    want = _outcome(exact, ebits, bias)
    assert _outcome(quant._hfp8, ebits, bias) == want
    assert _outcome(quant._hfp8, ebits, bias) == want  # from the cache when valid


@EXAMPLES
@given(
    st.one_of(
        st.sampled_from(["float32", "float16", "FLOAT32", "f4", "bfloat16", "float64", np.float32, np.float16]),
        st.sampled_from([np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64), 3, None]),
    ),
    st.one_of(st.sampled_from([2, 4, 8]), st.integers(-1, 9), ODD),
)
def test_output_dtype_and_bit_rate_shortcuts_match_the_exact_rules(output_dtype, bit_rate):
    assert _outcome(quant._output_dtype, output_dtype) == _outcome(_validate.output_dtype, output_dtype)

    def exact_bit_rate(b):
        b = _validate.integer("bit_rate", b, what="an int (2, 4 or 8)")
        if b not in quant.BIT_RATES:
            raise ValueError(f"bit_rate must be 2, 4 or 8, got {b}")
        return b

    assert _outcome(quant._bit_rate, bit_rate) == _outcome(exact_bit_rate, bit_rate)


@EXAMPLES
@given(
    st.one_of(st.floats(), st.integers(-5, 500), st.sampled_from([3.3e38, 3.5e38, -3.5e38, 1e300, True])),
    st.sampled_from([(4, 7), (5, 15), (3, 3)]),
)
def test_hfp8_max_pos_shortcut_matches_the_exact_rule(max_pos, fmt):
    x = np.zeros(3, np.float32)
    decl = embnum.float_to_hfp8.op.declaration
    got = _outcome(decl, x, *fmt, max_pos)
    want = _outcome(lambda: _exact_max_pos(fmt, max_pos))
    if isinstance(want, tuple):
        assert got == want
    else:
        assert got[0]["max_pos"].tobytes() == want.tobytes()


def _exact_max_pos(fmt, max_pos):
    _validate.real("max_pos", max_pos)
    with np.errstate(over="ignore"):
        mp = np.float32(max_pos)
    largest = quant.hfp8_largest(*fmt)
    if not (np.isfinite(mp) and 0 < mp <= largest):
        raise ValueError(
            f"max_pos must be finite, > 0 and at most {largest} (the largest value of this format), got {max_pos!r}"
        )
    return mp


def test_bfloat16_input_shortcut_keeps_the_other_dtypes_rules():
    bits = np.array([0x3F80], np.uint16)
    assert embnum.bfloat16_to_float.op.declaration(bits)[0]["input"] is bits
    with pytest.raises(TypeError, match="uint16"):
        embnum.bfloat16_to_float.op.declaration(bits.astype(np.int16))
