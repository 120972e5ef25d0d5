"""In-place ops' alias check (``_validate.no_alias``): each array's byte span
is computed once (``_validate_numba.array_span``) and the spans compared; the verdict must be
``np.may_share_memory``'s default (bounds) verdict for every pair, identity included, with the
exact pairwise rule (and its message, naming the first pair in argument order) on any doubt.
Drawn: views, slices, negative strides, transposes, zero-size arrays, disjoint and overlapping
slices of one base, float16 and dtypes the compiled span does not take, lists of arrays,
CuPy-like arrays (their rule: byte spans, :func:`_validate.overlaps`); hostile strides apart
(an example printed by Hypothesis would read them)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embnum import _validate as v
from embnum import _validate_numba

# dtypes the compiled span takes (float16 as a uint16 view), and (sometimes) ones it leaves to the exact rule
COMMON = [np.float32, np.int64, np.float16, np.int8, np.complex128]
DTYPES = st.one_of(st.sampled_from(COMMON), st.sampled_from(COMMON + [">i4", "U2"]))


class FakeCupyArray:
    """A CuPy-like array over a NumPy one's memory (only what the span rule reads)."""

    __module__ = "cupy._core.core"
    __cuda_array_interface__ = {}

    def __init__(self, a):
        self._a = a
        self.shape, self.strides, self.itemsize, self.size = a.shape, a.strides, a.itemsize, a.size

        class _Data:
            ptr = a.__array_interface__["data"][0]

        self.data = _Data()


@st.composite
def views(draw, base):
    """A view of ``base`` (1-D): a slice with any step (empty ones too), maybe as 2-D, transposed."""
    n = base.shape[0]
    step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    if draw(st.integers(0, 7)) == 0:  # any slice, often an empty one
        a = base[draw(st.integers(-n - 1, n + 1)) : draw(st.integers(-n - 1, n + 1)) : step]
    else:  # a non-empty run [i, j)
        i = draw(st.integers(0, n - 1))
        j = draw(st.integers(i + 1, n))
        a = base[i:j:step] if step > 0 else base[j - 1 : (i - 1 if i else None) : step]
    if a.shape[0] % 2 == 0 and a.shape[0] and draw(st.booleans()):
        a = a.reshape(2, -1)
        if draw(st.booleans()):
            a = a.T
        if draw(st.booleans()):
            a = a[:, ::-1]
    return a


@st.composite
def argument_sets(draw):
    """``(arguments, written)``: 2-5 array arguments viewed from 1-2 bases (or fresh), maybe a list
    of arrays, a CuPy-like array, a scalar and None; ``written`` a drawn subset of the names."""
    bases = [np.zeros(draw(st.integers(1, 12)), dtype=draw(DTYPES)) for _ in range(draw(st.integers(1, 2)))]
    arguments = {}
    for i in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(["view"] * 8 + ["fresh", "same"]))
        if kind == "same" and arguments:
            a = arguments[draw(st.sampled_from(sorted(arguments)))]  # one array passed twice
        elif kind == "fresh":
            a = np.ones(draw(st.integers(0, 4)), dtype=draw(DTYPES))
        else:
            a = draw(views(draw(st.sampled_from(bases))))
        if draw(st.integers(0, 15)) == 0 and isinstance(a, np.ndarray):
            a = FakeCupyArray(a)
        arguments[f"a{i}"] = a
    if draw(st.integers(0, 7)) == 0:
        arguments["group"] = [draw(views(bases[0])), 3]
    arguments.update(step=draw(st.sampled_from([None, 2, 1.5, "sum"])))
    names = sorted(arguments)
    written = tuple(k for k in names if draw(st.booleans()))
    return arguments, written


def oracle(arguments: dict, written):
    """The first pair (in argument order, list items named ``k[i]``) with a written member that
    is one object or may share memory by bounds (``np.may_share_memory``, CuPy-like: spans)."""
    arrays = []
    for k, x in arguments.items():
        if isinstance(x, (np.ndarray, FakeCupyArray)):
            arrays.append((k, x))
        elif isinstance(x, list):
            arrays += [(f"{k}[{i}]", y) for i, y in enumerate(x) if isinstance(y, np.ndarray)]
    for i, (k, a) in enumerate(arrays):
        for m, b in arrays[i + 1 :]:
            if k not in written and m not in written:
                continue
            if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
                shared = np.may_share_memory(a, b)
            else:
                shared = v.overlaps(a, b)
            if a is b or shared:
                return f"{k} shares memory with {m}: an in-place op needs its arrays apart"
    return None


@given(argument_sets())
def test_no_alias_follows_may_share_memory(case):
    arguments, written = case
    want = oracle(arguments, written)
    if want is None:
        v.no_alias(arguments, written)
    else:
        with pytest.raises(ValueError) as e:
            v.no_alias(arguments, written)
        assert str(e.value) == want


@given(argument_sets())
def test_span_verdict_is_sound_and_taken(case):
    """The shortcut says "apart" only when the rule finds no pair, and says it whenever every
    array argument is a plain NumPy array of a dtype it takes with a non-empty span."""
    arguments, written = case
    apart = v._spans_apart(arguments, written, _validate_numba.array_span)
    if apart:
        assert oracle(arguments, written) is None
    plain = [x for x in arguments.values() if type(x) is np.ndarray]
    takes = all(x.size and (id(x.dtype) in v._SPAN_DTYPES or x.dtype == np.float16) for x in plain)
    only_plain = len(plain) == len(v.arrays_in(arguments))
    if takes and only_plain and oracle(arguments, written) is None:
        assert apart


@given(st.data())
def test_array_span_pairs_equal_may_share_memory(data):
    base = np.zeros(data.draw(st.integers(1, 12)), dtype=data.draw(st.sampled_from([np.float32, np.int64, np.int8])))
    a, b = data.draw(views(base)), data.draw(views(base))
    (a0, a1), (b0, b1) = _validate_numba.array_span(a), _validate_numba.array_span(b)
    assert (a0 < b1 and b0 < a1 and a0 < a1 and b0 < b1) == np.may_share_memory(a, b)
    assert (a0 < a1) == (a.size > 0)


@pytest.mark.parametrize("stride", [2**61, 2**62, -(2**62), 2**63 - 1])
def test_hostile_strides_take_the_exact_rule(stride):
    """Spans past 2**62 are left to the exact rule, whose verdict (NumPy's, even where its sums
    wrap) stands."""
    base = np.zeros(4, np.float32)
    far = np.lib.stride_tricks.as_strided(base[:1], shape=(3,), strides=(stride,))
    lo, hi = _validate_numba.array_span(far)
    assert lo < hi if abs(stride) <= 2**61 else (lo, hi) == (0, 0)  # unsure: never a wrapped span
    arguments = {"w": base, "far": far}
    if np.may_share_memory(base, far):
        with pytest.raises(ValueError, match="w shares memory with far"):
            v.no_alias(arguments, ("w",))
    else:
        v.no_alias(arguments, ("w",))
