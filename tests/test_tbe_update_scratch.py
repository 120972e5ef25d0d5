"""The cuda row-wise update's gradient scratch (LAMB, partial row-wise, LARS-SGD, max_norm) is sized
by the touched rows' bound from the layout (``embnum.cuda.tbe.values_bound``), not ``N x max_dim``.

Without a device read the exact size (the dims of the distinct rows touched) is unknown; the bound
is the smaller of ``N x max_dim`` and, over the tables, ``min(N, rows) x dim``. Here: the exact size
never exceeds the bound on drawn layouts and lookups (tables shared by several features included),
the bound is reached when every row is touched, and the update with it equals the cpu backend's
while its scratch is smaller than ``N x max_dim`` for tables smaller than the batch.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from embnum.cuda import tbe as cuda_tbe


@st.composite
def _layout_and_lookups(draw):
    n_tables = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 5), min_size=n_tables, max_size=n_tables))
    dims = draw(st.lists(st.integers(1, 6), min_size=n_tables, max_size=n_tables))
    shares = draw(st.lists(st.integers(1, 2), min_size=n_tables, max_size=n_tables))  # features per table
    ftm = [t for t, c in enumerate(shares) for _ in range(c)]
    B = draw(st.integers(1, 3))
    lay = embnum.tbe_layout(rows, dims, ftm)
    lengths = draw(st.lists(st.integers(0, 4), min_size=len(ftm) * B, max_size=len(ftm) * B))
    ids = [draw(st.integers(0, rows[ftm[k // B]] - 1)) for k in range(len(ftm) * B) for _ in range(lengths[k])]
    return lay, rows, dims, ftm, B, np.array(ids, np.int64), lengths


@settings(max_examples=200, deadline=None)
@given(_layout_and_lookups())
def test_the_bound_holds_the_touched_rows(case):
    lay, rows, dims, ftm, B, ids, lengths = case
    N = ids.shape[0]
    feature_rows = np.array([rows[t] for t in ftm])
    bound = cuda_tbe.values_bound(N, lay.D_offsets, lay.hash_size_cumsum, feature_rows)
    bag_feature = np.repeat(np.arange(len(ftm) * B) // B, lengths)
    touched = {(ftm[f], int(r)) for f, r in zip(bag_feature, ids)}  # distinct (table, row)
    exact = sum(dims[t] for t, _ in touched)
    assert exact <= bound <= N * max(dims[t] for t in ftm)
    every = sum(r * d for t, (r, d) in enumerate(zip(rows, dims)) if t in ftm)  # every table has a feature
    assert cuda_tbe.values_bound(10**6, lay.D_offsets, lay.hash_size_cumsum, feature_rows) == every


def test_the_update_scratch_follows_small_tables_and_equals_the_cpu_update(monkeypatch):
    rows, dims, B, L = [3, 4], [8, 2], 4, 5  # 40 lookups into 7 rows: N x max_dim = 320 values, the bound 32
    lay = embnum.tbe_layout(rows, dims)
    rng = np.random.default_rng(0)
    offsets = np.arange(0, 2 * B * L + 1, L, dtype=np.int64)
    ids = np.concatenate([rng.integers(0, rows[t], B * L) for t in range(2)])
    grad = rng.standard_normal((B, sum(dims)), dtype=np.float32)
    sizes = []
    real = cuda_tbe._sparse

    def sparse(*a, **k):
        got = real(*a, **k)
        sizes.append(got[1].shape[0])
        return got

    monkeypatch.setattr(cuda_tbe, "_sparse", sparse)
    for opt in (
        embnum.TBEOptimizer("lamb", learning_rate=0.01),
        embnum.TBEOptimizer("sgd", learning_rate=0.1, max_norm=0.5),
    ):
        results = {}
        for backend in ("cpu", "cuda"):
            w = np.linspace(-1, 1, lay.num_weights, dtype=np.float32)
            state = opt.state_sizes(lay.num_weights, int(lay.hash_size_cumsum[-1]))
            m1 = np.zeros(state["momentum1"], np.float32) if "momentum1" in state else None
            m2 = np.zeros(state["momentum2"], np.float32) if "momentum2" in state else None
            embnum.tbe_backward_update(
                grad, w, *lay.arrays(), ids, offsets, "sum", optimizer=opt, momentum1=m1, momentum2=m2,
                step=1 if opt.uses_step else None, backend=backend,
            )  # fmt: skip
            results[backend] = w
        np.testing.assert_allclose(results["cuda"], results["cpu"], rtol=1e-5, atol=1e-6)
    assert sizes == [sum(r * d for r, d in zip(rows, dims))] * 2  # 32, not 40 x 8 = 320
