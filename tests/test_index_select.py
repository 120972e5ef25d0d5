"""The batch index selects keep the layout of recent table lists (``ops.index_select._LAYOUTS``): calls
that repeat the lists with other indices, in or out of range, answer as computed from the lists."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum


@st.composite
def repeated_lists(draw):
    T = draw(st.integers(1, 4))
    num = draw(st.lists(st.integers(0, 5), min_size=T, max_size=T))
    if draw(st.booleans()):
        num = [num[0]] * T  # one batch size: permute_output_dim_0_1 may be set
    rows = draw(st.lists(st.integers(1, 6), min_size=T, max_size=T))
    cols = draw(st.lists(st.integers(0, 3), min_size=T, max_size=T))
    permute = len(set(num)) == 1 and draw(st.booleans())
    calls = []
    for _ in range(draw(st.integers(2, 3))):
        idx = [draw(st.integers(-1, r)) for n, r in zip(num, rows) for _ in range(n)]  # -1 and r: out of range
        calls.append(np.array(idx, dtype=draw(st.sampled_from([np.int32, np.int64]))))
    return num, rows, cols, permute, calls


def _expected(name, args, num, rows, cols, permute):
    """The op's answer computed here from the lists (not from the op's layout): the selected rows of
    each table, or their gradient added back in index order; IndexError when an index is out of range."""
    idx = np.split(args["indices"].astype(np.int64), np.cumsum(num)[:-1])
    if any(((i < 0) | (i >= r)).any() for i, r in zip(idx, rows)):
        return IndexError
    if name == "batch_index_select_dim0":
        tables = np.split(args["inputs"], np.cumsum([r * c for r, c in zip(rows, cols)])[:-1])
        picked = [t.reshape(r, c)[i] for t, r, c, i in zip(tables, rows, cols, idx)]
        if permute:
            return np.concatenate(picked, axis=1).reshape(-1) if picked else np.zeros(0, np.float32)
        return np.concatenate([p.reshape(-1) for p in picked])
    g = args["grad_output"]
    if permute:
        parts = np.split(g.reshape(num[0], sum(cols)), np.cumsum(cols)[:-1], axis=1)
    else:
        parts = [
            p.reshape(n, c)
            for p, n, c in zip(np.split(g, np.cumsum([n * c for n, c in zip(num, cols)])[:-1]), num, cols)
        ]
    out = []
    for part, i, r, c in zip(parts, idx, rows, cols):
        acc = np.zeros((r, c), np.float32)
        np.add.at(acc, i, part)
        out.append(acc.reshape(-1))
    return np.concatenate(out)


@pytest.mark.parametrize("name", ["batch_index_select_dim0", "batch_index_select_dim0_backward"])
@settings(max_examples=60, deadline=None)
@given(case=repeated_lists(), seed=st.integers(0, 2**16))
def test_repeated_lists_answer_as_computed_from_them(name, case, seed):
    num, rows, cols, permute, calls = case
    rng = np.random.default_rng(seed)
    for idx in calls:
        args = dict(indices=idx, input_num_indices=list(num), input_rows=list(rows), input_columns=list(cols))
        args["permute_output_dim_0_1"] = permute
        if name == "batch_index_select_dim0":
            args["inputs"] = rng.standard_normal(sum(r * c for r, c in zip(rows, cols))).astype(np.float32)
        else:
            args["grad_output"] = rng.standard_normal(sum(n * c for n, c in zip(num, cols))).astype(np.float32)
        want = _expected(name, args, num, rows, cols, permute)
        for backend in ("ref", "cpu"):
            if want is IndexError:
                with pytest.raises(IndexError, match=r"input_rows\["):
                    getattr(embnum, name)(**args, backend=backend)
            else:
                assert np.array_equal(getattr(embnum, name)(**args, backend=backend), want)
