"""The kjt declarations' compiled one-pass verdicts (``_validate_numba``) give the same
outcome as their exact Python rules on drawn inputs, valid and broken (an entry replaced by a
negative, an out-of-range or a huge value near int64's or int32's end, an array shortened or
lengthened, a wrong hint): the same plan when valid, the same error type and message when not.
The exact rules run with ``_validate.compiled`` stubbed to None (no compiled checks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from verdicts import INDEX, cast_index, maybe_break, same_both_ways

pytest.importorskip("numba")


def _ints(draw, n, top=3):
    """``n`` drawn int64 entries in ``[0, top]``."""
    return np.array(draw(st.lists(st.integers(0, top), min_size=n, max_size=n)), np.int64)


def _keyed_lengths(draw, max_T, min_B):
    """The index dtype, T keys, B bags per key and the T*B drawn lengths (int64)."""
    dt = draw(INDEX)
    T = draw(st.integers(0, max_T))
    B = draw(st.integers(min_B, 3))
    return dt, T, B, _ints(draw, T * B)


def _total(draw, lengths):
    """A values count for ``lengths``: their (clipped) sum, sometimes one off."""
    return int(lengths.clip(0, 10).sum()) + draw(st.sampled_from([0, 0, 0, -1, 1]))


@settings(max_examples=150)  # declarations only: ~1 ms an example
@given(st.data(), st.booleans(), st.booleans())
def test_permute_verdicts_match_the_exact_rules(data, two_d, weighted):
    draw = data.draw
    dt, T, B, lengths = _keyed_lengths(draw, 4, 1)
    lengths = lengths.reshape(T, B) if two_d else lengths
    permute = np.array(draw(st.lists(st.integers(0, max(T * (1 if two_d else B) - 1, 0)), max_size=5)), np.int64)
    if T == 0:
        permute = permute[:0]
    permute, lengths = maybe_break(draw, [permute, lengths])
    N = _total(draw, lengths)
    values = np.arange(max(N, 0), dtype=draw(st.sampled_from([np.int64, np.float32])))
    weights = np.ones(max(N, 0), np.float32) if weighted else None
    hint = draw(st.one_of(st.none(), st.integers(0, 30)))
    decl = (embnum.permute_2d_sparse_data if two_d else embnum.permute_1d_sparse_data).op.declaration
    same_both_ways(decl, cast_index(dt, permute), cast_index(dt, lengths), values, weights, hint)


@settings(max_examples=150)  # declarations only: ~1 ms an example
@given(st.data(), st.booleans())
def test_index_select_verdict_matches_the_exact_rules(data, weighted):
    draw = data.draw
    dt, T, B, lengths = _keyed_lengths(draw, 3, 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = np.array(draw(st.lists(st.integers(0, B - 1), max_size=4)), np.int64)
    lengths, offsets, indices = maybe_break(draw, [lengths, offsets, indices])
    N = _total(draw, lengths)
    values = np.arange(max(N, 0), dtype=np.float64)
    weights = np.ones(max(N, 0), np.float16) if weighted else None
    batch = draw(st.one_of(st.just(B), st.sampled_from([0, 1, 2, 2**48 + 1])))
    hint = draw(st.one_of(st.none(), st.integers(0, 30)))
    decl = embnum.keyed_jagged_index_select_dim1.op.declaration
    same_both_ways(
        decl, values, cast_index(dt, lengths), cast_index(dt, offsets), cast_index(dt, indices), batch, weights, hint
    )


@settings(max_examples=150)  # declarations only: ~1 ms an example
@given(st.data())
def test_expand_permute_verdict_matches_the_exact_rules(data):
    draw = data.draw
    dt = draw(INDEX)
    T = draw(st.integers(0, 4))
    sizes = np.array(draw(st.lists(st.integers(0, 3), min_size=T, max_size=T)), np.int64)
    permute = np.array(draw(st.permutations(range(T))), np.int64)
    input_offset = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    output_offset = np.concatenate([[0], np.cumsum(sizes[permute])]).astype(np.int64)
    permute, input_offset, output_offset = maybe_break(draw, [permute, input_offset, output_offset])
    output_size = int(output_offset[-1]) if output_offset.size else 0
    output_size = draw(st.sampled_from([output_size, output_size, output_size + 1, 2**48 + 1]))
    decl = embnum.expand_into_jagged_permute.op.declaration
    same_both_ways(
        decl, cast_index(dt, permute), cast_index(dt, input_offset), cast_index(dt, output_offset), output_size
    )


@settings(max_examples=150)  # declarations only: ~1 ms an example
@given(st.data())
def test_invert_permute_verdict_matches_the_exact_rules(data):
    draw = data.draw
    dt, n = draw(INDEX), draw(st.integers(0, 6))
    (permute,) = maybe_break(draw, [np.array(draw(st.permutations(range(n))), np.int64)])
    same_both_ways(embnum.invert_permute.op.declaration, cast_index(dt, permute))


@settings(max_examples=150)  # declarations only: ~1 ms an example
@given(st.data(), st.booleans())
def test_bucketize_verdict_matches_the_exact_rules(data, weighted):
    draw = data.draw
    dt, T, B, lengths = _keyed_lengths(draw, 3, 0)
    block_sizes = _ints(draw, T, 6)
    lengths, block_sizes = maybe_break(draw, [lengths, block_sizes])
    N = _total(draw, lengths)
    indices = np.arange(max(N, 0), dtype=draw(INDEX))
    weights = np.ones(max(N, 0), np.float32) if weighted else None
    my_size = draw(st.one_of(st.integers(1, 3), st.integers(1, 3), st.sampled_from([0, -1, 2**31, 2**47, True])))
    odd = draw(st.integers(0, 5)) == 0  # mostly the plain case the compiled verdict serves
    flags = [draw(st.sampled_from([np.True_, 1, False] if odd else [True, False])) for _ in range(3)]
    max_B = draw(st.sampled_from([-1, 5, 2**63, np.int64(3)] if odd else [-1, 5]))
    pos = draw(st.sampled_from([None, []]))
    decl = embnum.block_bucketize_sparse_features.op.declaration
    same_both_ways(
        decl,
        cast_index(dt, lengths),
        indices,
        flags[0],
        flags[1],
        cast_index(dt, block_sizes),
        my_size,
        weights,
        max_B=max_B,
        block_bucketize_pos=pos,
        keep_orig_idx=flags[2],
    )


@settings(max_examples=150)
@given(st.data())
def test_unique_verdict_matches_the_exact_rules(data):
    draw = data.draw
    dt = draw(INDEX)
    n_tables = draw(st.integers(1, 3))
    per_table = draw(st.lists(st.integers(1, 2), min_size=n_tables, max_size=n_tables))
    T = sum(per_table)
    B = draw(st.integers(1, 2))
    sizes = draw(st.lists(st.integers(0, 5), min_size=n_tables, max_size=n_tables))
    hsc = np.concatenate([[0], np.cumsum(np.repeat(sizes, per_table))]).astype(np.int64)
    hsc = np.concatenate([np.repeat(np.concatenate([[0], np.cumsum(sizes)])[:-1], per_table), [sum(sizes)]])
    hso = np.concatenate([[0], np.cumsum(per_table)]).astype(np.int64)
    hso = np.repeat(hso, draw(st.lists(st.integers(1, 2), min_size=hso.shape[0], max_size=hso.shape[0])))
    hso = hso[: T + 1] if hso.shape[0] >= T + 1 else hso
    lengths = draw(st.lists(st.integers(0, 3), min_size=T * B, max_size=T * B))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    feature = np.repeat(np.arange(T * B) // B, lengths)
    table = np.searchsorted(np.concatenate([[0], np.cumsum(per_table)]), feature, side="right") - 1
    top = np.array(sizes + [1])[table]
    indices = np.array([draw(st.integers(0, max(int(h) - 1, 0))) for h in top], np.int64)
    hsc, hso, offsets, indices = maybe_break(draw, [hsc.astype(np.int64), hso.astype(np.int64), offsets, indices])
    decl = embnum.jagged_unique_indices.op.declaration
    same_both_ways(decl, cast_index(dt, hsc), cast_index(dt, hso), cast_index(dt, offsets), cast_index(dt, indices))
