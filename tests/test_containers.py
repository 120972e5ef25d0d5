"""The TorchRec-shaped containers (embnum.JaggedTensor, KeyedJaggedTensor, KeyedTensor)."""

from __future__ import annotations

import numpy as np
import pytest

import embnum

KJT, KT, JT = embnum.KeyedJaggedTensor, embnum.KeyedTensor, embnum.JaggedTensor


def _three():
    # a: [0] [1 2] []   b: [3 4] [5] []   c: [6 7 8] [] []
    return KJT.from_lengths_sync(
        ["a", "b", "c"], np.arange(9), np.array([1, 2, 0, 2, 1, 0, 3, 0, 0], np.int32), np.arange(9.0)
    )


def test_worked_example_numpy():
    k = _three()
    assert k.stride() == 3 and k.stride_per_key() == [3, 3, 3] and k.length_per_key() == [3, 3, 3]
    assert k.offsets().tolist() == [0, 1, 3, 3, 5, 6, 6, 9, 9, 9]
    p = k.permute([2, 0, 0])
    assert p.keys() == ["c", "a", "a"]
    assert p.values().tolist() == [6, 7, 8, 0, 1, 2, 0, 1, 2]
    assert p.lengths().tolist() == [3, 0, 0, 1, 2, 0, 1, 2, 0]
    assert k["b"].values().tolist() == [3, 4, 5] and k["b"].lengths().tolist() == [2, 1, 0]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(keys=["a", "a"], values=np.arange(2), lengths=np.array([1, 1])), ("keys", "'a'")),
        (dict(keys=["a"], values=np.arange(2), lengths=np.array([1, 2])), ("lengths", "3", "len(values)")),
        (dict(keys=["a", "b"], values=np.arange(3), lengths=np.array([1, 2, 0])), ("len(lengths) = 3",)),
        (dict(keys=["a", "b"], values=np.arange(3), lengths=np.array([1, 2]), stride=2), ("stride = 2",)),
        (dict(keys=["a"], values=np.arange(1), lengths=np.array([2, -1])), ("lengths", "-1")),
    ],
)
def test_bad_construction(kwargs, words):
    with pytest.raises(ValueError) as info:
        KJT(**kwargs)
    for w in words:
        assert w in str(info.value)
