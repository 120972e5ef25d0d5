"""The index_select family on torch tensors (docs/families/index_select.md): the bridge's
gradients and bfloat16, and (optional tier) fbgemm_gpu's group gradient."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import fbgemm, tensor
from tables.index_select import arr, batch_args, group_args

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


# -- torch bridge: gradients --------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(args=batch_args(small=True))
def test_gradcheck_batch_index_select(args):
    n = np.asarray(args["inputs"]).shape[0]
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    rest = [args[k] for k in ("input_num_indices", "input_rows", "input_columns", "permute_output_dim_0_1")]
    idx = tensor(args["indices"])
    assert torch.autograd.gradcheck(lambda x: tb.batch_index_select_dim0(x, idx, *rest), (x,))


@settings(max_examples=15, deadline=None)
@given(args=group_args(small=True))
def test_gradcheck_group_index_select(args):
    g = torch.Generator().manual_seed(1)
    shapes = [np.asarray(a).shape for a in args["input_group"]]
    xs = [torch.randn(s, dtype=torch.float64, generator=g).requires_grad_() for s in shapes]
    idx = [tensor(i) for i in args["indices_group"]]
    assert torch.autograd.gradcheck(lambda *xs: tuple(tb.group_index_select_dim0(list(xs), idx)), tuple(xs))


@pytest.mark.parametrize("backend", ["ref", "cpu", "cuda"])
def test_batch_gradient_adds_repeats_and_leaves_unselected_rows_zero(backend):
    x = torch.arange(12.0, requires_grad=True)
    out = tb.batch_index_select_dim0(x, tensor(arr(2, 2, 1, 1)), [2, 2], [3, 2], [2, 3], True, backend=backend)
    out.backward(torch.arange(1.0, 11.0))
    want = [0, 0, 0, 0, 1 + 6, 2 + 7, 0, 0, 0, 3 + 8, 4 + 9, 5 + 10]
    np.testing.assert_array_equal(x.grad.numpy(), np.array(want, np.float32))


def test_bridge_bfloat16_moves_bits():
    a = torch.randn(5, 3).to(torch.bfloat16)
    (r,) = tb.group_index_select_dim0([a], [torch.tensor([4, 0, 4])])
    assert r.dtype == torch.bfloat16 and torch.equal(r.view(torch.int16), a[[4, 0, 4]].view(torch.int16))


@pytest.mark.fbgemm
@settings(max_examples=15, deadline=None)
@given(G=st.integers(1, 4), rows=st.integers(1, 6), D=st.integers(1, 5), n=st.integers(1, 8), seed=st.integers(0, 99))
def test_fbgemm_group_gradient(G, rows, D, n, seed):
    """fbgemm's group backward against embnum's in float64, on the inputs TorchRec gives it: ``G``
    pooled-embedding arrays of one shape ``[rows, D]``, each with a non-empty selection (fbgemm
    1.8.0's backward fails or returns wrongly shaped gradients when shapes differ or a selection
    is empty; embnum's op takes those, tested against the oracle)."""
    fbgemm()
    rng = np.random.default_rng(seed)
    idx = [torch.tensor(rng.integers(0, rows, n)) for _ in range(G)]
    g = [torch.tensor(rng.standard_normal((n, D))) for _ in range(G)]
    grads = []
    for fn in (torch.ops.fbgemm.group_index_select_dim0, tb.group_index_select_dim0):
        xs = [torch.zeros((rows, D), dtype=torch.float64, requires_grad=True) for _ in range(G)]
        torch.autograd.backward(fn(xs, idx), g)
        grads.append([x.grad.numpy() for x in xs])
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
