"""The KeyedJaggedTensor family on torch tensors (docs/families/kjt.md): the bridge's gradients
(scatter-add) and bfloat16, and (optional tier) fbgemm_gpu's permute gradient."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from harness import fbgemm, tensor
from tables.kjt import BI, BL, I32, L2D, STRATEGIES, arr, index_select_args, permute_2d_args

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


def _float_case(args, rng):
    """The drawn case with float64 values and weights that require grad."""
    n = np.asarray(args["values"]).shape[0]
    v = torch.tensor(rng.standard_normal(n), requires_grad=True)
    w = torch.tensor(rng.standard_normal(n), requires_grad=True)
    return v, w


@pytest.mark.parametrize("name", ["permute_2d_sparse_data", "permute_1d_sparse_data"])
@settings(max_examples=10)
@given(data=st.data())
def test_gradcheck_permutes(name, data):
    args = data.draw(STRATEGIES[name](small=True))
    v, w = _float_case(args, np.random.default_rng(0))
    perm, lengths = tensor(args["permute"]), tensor(args["lengths"])
    fn = getattr(tb, name)
    assert torch.autograd.gradcheck(lambda x, y: fn(perm, lengths, x, y)[1:], (v, w))


@settings(max_examples=10)
@given(args=index_select_args(small=True))
def test_gradcheck_keyed_jagged_index_select(args):
    v, w = _float_case(args, np.random.default_rng(1))
    rest = [tensor(args[k]) for k in ("lengths", "offsets", "indices")]
    fn = tb.keyed_jagged_index_select_dim1
    assert torch.autograd.gradcheck(lambda x, y: tuple(fn(x, *rest, args["batch_size"], y)[::2]), (v, w))


@pytest.mark.parametrize("backend", ["ref", "cpu", "cuda"])
def test_permute_gradient_sums_repeated_keys(backend):
    """Key 1 taken twice gets both gradients, dropped key 0 gets zeros (fbgemm inverts the permute)."""
    v = torch.arange(10.0, requires_grad=True)
    out = tb.permute_2d_sparse_data(torch.tensor([1, 1, 2]), tensor(L2D), v, backend=backend)
    g = torch.arange(float(out[1].shape[0]))
    out[1].backward(g)
    want = np.zeros(10)
    for o, src in enumerate([3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 9]):
        want[src] += float(g[o])
    np.testing.assert_array_equal(v.grad.numpy(), want)


def test_bridge_bfloat16_moves_bits_and_keeps_none_slots():
    w = torch.randn(9).to(torch.bfloat16)
    r = tb.block_bucketize_sparse_features(tensor(BL), tensor(BI), False, True, tensor(arr(4, 5)), 3, w)
    assert r[3] is None and r[2].dtype == torch.bfloat16
    want = embnum.block_bucketize_sparse_features(BL, BI, False, True, arr(4, 5), 3, w.float().numpy())
    np.testing.assert_array_equal(r[2].float().numpy(), want[2])
    np.testing.assert_array_equal(r[4].numpy(), want[4])


@pytest.mark.fbgemm
@settings(max_examples=15)
@given(args=permute_2d_args(small=True), seed=st.integers(0, 2**32 - 1))
def test_fbgemm_permute_2d_gradient_on_true_permutations(args, seed):
    """Where fbgemm's inverse-permute backward is right (a true permutation), the gradients agree."""
    fbgemm()
    T = args["lengths"].shape[0]
    rng = np.random.default_rng(seed)
    perm = torch.from_numpy(rng.permutation(T).astype(I32))
    lengths = tensor(args["lengths"])
    n = int(lengths.sum())
    values = rng.standard_normal(n).astype(np.float32)
    g = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    grads = []
    for fn in (tb.permute_2d_sparse_data, torch.ops.fbgemm.permute_2D_sparse_data):
        v = torch.tensor(values, requires_grad=True)
        fn(perm, lengths, v, None, n)[1].backward(g)
        grads.append(v.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
