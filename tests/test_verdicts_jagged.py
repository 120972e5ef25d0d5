"""The jagged declarations' compiled one-pass verdicts (``_validate_numba``) give the same
outcome as their exact Python rules on drawn inputs, valid and broken (an entry replaced by a
negative, a huge or an int32-edge value, an offsets array shortened or lengthened, sizes and
paddings at their limits): the same plan when valid, the same error type and message when not.
The exact rules run with ``_validate.compiled`` stubbed to None (no compiled checks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from verdicts import INDEX, cast_index, maybe_break, same_both_ways

pytest.importorskip("numba")

SIZES = st.one_of(st.integers(0, 8), st.sampled_from([2**31 - 1, 2**31, 2**48, 2**48 + 1, -1]))
EXAMPLES = settings(max_examples=150)  # declarations only: ~1 ms an example


def _offsets(draw, n_bags, max_len=3):
    lens = draw(st.lists(st.integers(0, max_len), min_size=n_bags, max_size=n_bags))
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


def _levels(draw, J, B):
    levels, n = [], B
    for _ in range(J):
        o = _offsets(draw, n)
        levels.append(o)
        n = int(o[-1])
    return maybe_break(draw, levels), n


@EXAMPLES
@given(st.data())
def test_offsets_range_verdict_matches_the_exact_rules(data):
    draw = data.draw
    dt = draw(INDEX)
    (offsets,) = maybe_break(draw, [_offsets(draw, draw(st.integers(0, 4)))])
    size = draw(st.one_of(st.just(int(offsets[-1]) if offsets.size else 0), SIZES))
    same_both_ways(embnum.offsets_range.op.declaration, cast_index(dt, offsets), size)


@EXAMPLES
@given(st.data(), st.booleans())
def test_segment_sum_csr_verdicts_match_the_exact_rules(data, backward):
    draw = data.draw
    dt = draw(INDEX)
    (csr,) = maybe_break(draw, [_offsets(draw, draw(st.integers(0, 4)))])
    batch = draw(st.one_of(st.integers(0, 3), SIZES))
    n = draw(st.one_of(st.integers(0, 12), SIZES))
    S = max(csr.shape[0] - 1 + draw(st.sampled_from([0, 0, 0, -1, 1])), 0)
    if backward:
        grad = np.ones(S, draw(st.sampled_from([np.float32, np.int64])))
        same_both_ways(embnum.segment_sum_csr_backward.op.declaration, batch, cast_index(dt, csr), grad, n)
    else:
        values = np.ones(max(n, 0) if n < 100 else 7, draw(st.sampled_from([np.float16, np.int32])))
        same_both_ways(embnum.segment_sum_csr.op.declaration, batch, cast_index(dt, csr), values)


@EXAMPLES
@given(st.data(), st.sampled_from(["padded", "1d", "2d"]))
def test_to_dense_verdicts_match_the_exact_rules(data, which):
    draw = data.draw
    dt = draw(INDEX)
    J = draw(st.integers(1, 3)) if which == "padded" else 1
    B = draw(st.integers(0, 3))
    levels, n = _levels(draw, J, B)
    rows = max(n + draw(st.sampled_from([0, 0, 0, -1, 1])), 0)
    ndim = 2 if which == "2d" else 1 if which == "1d" else draw(st.sampled_from([1, 2]))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.int32, np.int64]))
    values = np.zeros((rows, 2) if ndim == 2 else (rows,), dtype)
    lengths = draw(st.lists(SIZES, min_size=J, max_size=J))
    pad = draw(st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.sampled_from([2**31, 1e6, -(2**63), 0.5])))
    levels = [cast_index(dt, o) for o in levels]
    if which == "padded":
        levels = draw(st.sampled_from([levels, tuple(levels), levels[:-1]]))
        same_both_ways(embnum.jagged_to_padded_dense.op.declaration, values, levels, lengths, pad)
    elif which == "1d":
        same_both_ways(embnum.jagged_1d_to_dense.op.declaration, values, levels[0], lengths[0], pad)
    else:
        same_both_ways(embnum.jagged_2d_to_dense.op.declaration, values, levels[0], lengths[0])


@EXAMPLES
@given(st.data())
def test_dense_to_jagged_verdict_matches_the_exact_rules(data):
    draw = data.draw
    dt = draw(INDEX)
    J = draw(st.integers(1, 3))
    B = draw(st.integers(0, 3))
    levels, n = _levels(draw, J, B)
    shape = [B + draw(st.sampled_from([0, 0, 0, 1]))] + [2] * J + [3]
    if draw(st.booleans()):
        shape = shape[:-1]
    dense = np.zeros(shape, draw(st.sampled_from([np.float32, np.int64])))
    total = draw(st.one_of(st.none(), st.just(n), SIZES))
    same_both_ways(embnum.dense_to_jagged.op.declaration, dense, [cast_index(dt, o) for o in levels], total)
