"""Small TBE calls: the forward's feature grouping cached by the
content of ``D_offsets`` (``embnum.cpu.tbe._feature_groups``) gives exactly the groups the
rule says, also after ``D_offsets`` is changed in place (a hit is never stale), and the cpu
forward with the cache matches the reference."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum

pytest.importorskip("numba")
from embnum.cpu import tbe as cpu_tbe  # noqa: E402

DIMS = st.sampled_from([1, 3, 8, 16, 32, 64, 40, 128])


def _expected(doff):
    """The rule, written independently: each specialised dim present, in SPECIALISED_DIMS order,
    with its features in order; then every other feature (the generic kernel)."""
    dims = [int(b - a) for a, b in zip(doff[:-1], doff[1:])]
    found = [(D, [t for t, d in enumerate(dims) if d == D]) for D in cpu_tbe.SPECIALISED_DIMS]
    found.append((0, [t for t, d in enumerate(dims) if d not in cpu_tbe.SPECIALISED_DIMS]))
    return [(D, feats) for D, feats in found if feats]


def _as_lists(groups):
    return [(D, feats.tolist()) for D, feats in groups]


@given(st.lists(DIMS, min_size=1, max_size=6), st.lists(DIMS, min_size=1, max_size=6))
def test_feature_groups_follow_the_rule_and_never_go_stale(dims_a, dims_b):
    doff = np.concatenate([[0], np.cumsum(dims_a)]).astype(np.int64)
    assert _as_lists(cpu_tbe._feature_groups(doff)) == _expected(doff)
    assert _as_lists(cpu_tbe._feature_groups(doff)) == _expected(doff)  # the cached entry
    # the same array changed in place (same length: the other dims' prefix sums, cut or padded)
    other = np.concatenate([[0], np.cumsum((dims_b * len(dims_a))[: len(dims_a)])]).astype(np.int64)
    doff[:] = other
    assert _as_lists(cpu_tbe._feature_groups(doff)) == _expected(other)
    for _, feats in cpu_tbe._feature_groups(doff):
        assert feats.dtype == np.int64 and feats.flags.c_contiguous


@given(st.lists(DIMS, min_size=1, max_size=4), st.integers(0, 4), st.sampled_from(["sum", "mean"]))
def test_forward_with_cached_groups_matches_the_reference(dims, B, pooling):
    lay = embnum.tbe_layout([3] * len(dims), dims)
    rng = np.random.default_rng(len(dims) * 7 + B)
    weights = rng.standard_normal(lay.num_weights).astype(np.float32)
    lengths = rng.integers(0, 3, len(dims) * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, 3, int(offsets[-1])).astype(np.int64)
    for _ in range(2):  # the second call takes the cached grouping
        got = embnum.tbe_forward(weights, *lay.arrays(), indices, offsets, pooling, backend="cpu")
        want = embnum.tbe_forward(weights, *lay.arrays(), indices, offsets, pooling, backend="ref")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 300)), min_size=1, max_size=6))
def test_compiled_starts_and_value_offsets_match_numpy(tables_drawn):
    """``_starts_of`` / ``_value_offsets`` (the sparse gradient's prefix sums, compiled) against
    the NumPy formulas they replace, on drawn touched-row counts and table dims."""
    counts = np.array([c for c, _ in tables_drawn], dtype=np.int64)
    tables = np.zeros((len(tables_drawn), 8), dtype=np.int64)
    tables[:, cpu_tbe.DIM] = [d for _, d in tables_drawn]
    row_start, value_start = cpu_tbe._starts_of(counts, tables)
    assert row_start.tolist() == [0, *np.cumsum(counts).tolist()]
    assert value_start.tolist() == [0, *np.cumsum(counts * tables[:, cpu_tbe.DIM]).tolist()]
    want = np.zeros(int(row_start[-1]) + 1, dtype=np.int64)
    np.cumsum(np.repeat(tables[:, cpu_tbe.DIM], np.diff(row_start)), out=want[1:])
    got = cpu_tbe._value_offsets(row_start, tables)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
