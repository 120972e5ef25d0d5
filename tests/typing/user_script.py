"""A small user script that CI type-checks with mypy against the installed embnum
(``.ci/run``): the generated stub (``embnum/__init__.pyi``) and ``py.typed`` make the
ops visible to type checkers (without them mypy reports a missing library stub and
``embnum.complete_cumsum`` as unknown)."""

import numpy as np

import embnum

lengths = np.array([2, 0, 3], dtype=np.int64)
offsets: np.ndarray = embnum.complete_cumsum(lengths)
dense: np.ndarray = embnum.jagged_1d_to_dense(np.arange(5), offsets, 3, backend="cpu")
permutes, in_shapes, out_shapes, out_lengths = embnum.kt_regroup_arguments(None, [["a", "b"]], [[1, 2]], [["b"], ["a"]])
outs: list[np.ndarray] = embnum.permute_multi_embedding(
    [np.ones((2, 3), np.float32)], permutes, in_shapes, out_shapes, out_lengths
)
lay = embnum.tbe_layout([3, 2], [2, 3])
embnum.tbe_backward_update(
    np.zeros((1, 5), np.float32),
    np.zeros(lay.num_weights, np.float32),
    *lay.arrays(),
    np.array([0, 1], np.int64),
    np.array([0, 1, 2], np.int64),
    optimizer=embnum.TBEOptimizer("sgd", 0.1),
)
names: list[str] = [op.name for op in embnum.ops()]
print(offsets, dense.shape, [o.shape for o in outs], len(names))
