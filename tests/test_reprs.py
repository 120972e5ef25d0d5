"""The torch modules print their tables: ``print(module)`` tells what it holds."""

import pytest

import embnum

torch = pytest.importorskip("torch")
from embnum.modules import TBE, FusedTBE, PermuteMultiEmbedding  # noqa: E402


def test_tbe_repr_lists_every_table_and_its_features():
    text = repr(TBE([10, 5, 7], [4, 8, 2], [0, 0, 1, 2], pooling_mode="mean"))
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "TBE("
    assert lines[1:4] == [
        "table 0: 10 x 4, features [0, 1]",
        "table 1: 5 x 8, features [2]",
        "table 2: 7 x 2, features [3]",
    ]
    assert "pooling_mode='mean'" in lines[4] and "bounds_check_mode='fatal'" in lines[4]


def test_fused_tbe_repr_adds_the_optimizer_and_step():
    m = FusedTBE([3], [4], optimizer=embnum.TBEOptimizer("sgd", 0.5))
    lines = [line.strip() for line in repr(m).splitlines()]
    assert lines[0] == "FusedTBE(" and lines[1] == "table 0: 3 x 4, features [0]"
    assert lines[3].startswith("optimizer=TBEOptimizer(kind='sgd', learning_rate=0.5") and lines[3].endswith("step=0")
    m(torch.tensor([0, 2]), torch.tensor([0, 1, 2])).sum().backward()
    assert repr(m).splitlines()[-2].strip().endswith("step=1")


def test_permute_multi_embedding_repr_lists_inputs_and_groups():
    m = PermuteMultiEmbedding([["f1", "f2"], ["f3"]], [[3, 4], [5]], [["f3", "f1"], ["f2"]])
    assert [line.strip() for line in repr(m).splitlines()] == [
        "PermuteMultiEmbedding(",
        "in 0: f1:3, f2:4 (width 7)",
        "in 1: f3:5 (width 5)",
        "out 0: f3, f1 (width 8)",
        "out 1: f2 (width 4)",
        ")",
    ]
