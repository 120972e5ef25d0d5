"""The keyed_tensor family on torch tensors (docs/families/keyed_tensor.md): the bridge's gradients
and bfloat16, the PermuteMultiEmbedding module, and (optional tier) fbgemm_gpu's gradients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import embnum
from harness import fbgemm, tensor
from strategies import float_dtypes
from tables.keyed_tensor import POOLED_FBGEMM, POOLED_LISTS, pooled_fbgemm_domain, regroupings

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


# -- torch bridge: gradients, bfloat16, the training module ----------------------------
from embnum.modules import PermuteMultiEmbedding  # noqa: E402


@st.composite
def float64_regroup(draw):
    keys, lengths, groups = draw(regroupings())
    B = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return [rng.standard_normal((B, sum(ls))) for ls in lengths], keys, lengths, groups


@settings(max_examples=15)
@given(case=float64_regroup())
def test_gradcheck(case):
    embs, keys, lengths, groups = case
    assume(all(x.size for x in embs) and any(groups))  # gradcheck needs elements on both sides
    xs = tuple(tensor(x).requires_grad_() for x in embs)
    perm, ins, outs, ol = (
        tensor(a) if isinstance(a, np.ndarray) else a for a in embnum.kt_regroup_arguments(None, keys, lengths, groups)
    )
    assert torch.autograd.gradcheck(lambda *v: tb.regroup_keyed_tensor(list(v), keys, lengths, groups), xs)
    assert torch.autograd.gradcheck(lambda *v: tb.permute_multi_embedding(list(v), perm, ins, outs, ol), xs)


def test_gradcheck_permute_pooled_embs():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    lists = [torch.tensor(v) for v in ([0, 2, 5, 6], [2, 0, 1], [0, 1, 3, 6], [1, 2, 0])]
    assert torch.autograd.gradcheck(lambda x: tb.permute_pooled_embs(x, *lists), (x,))


@pytest.mark.parametrize("flavor", ["ref", "cpu", "cuda"])
@settings(max_examples=10)
@given(case=float64_regroup(), dtype=float_dtypes, seed=st.integers(0, 2**32 - 1))
def test_bridge_gradient_is_the_reference_adjoint(flavor, case, dtype, seed):
    """Every backend's autograd gradient == the oracle's backward (duplicates summed, unused keys 0)."""
    if flavor == "cuda" and not embnum._backend.BACKENDS["cuda"].available():
        pytest.skip("cuda backend unavailable")
    embs, keys, lengths, groups = case
    xs = [tensor(x.astype(dtype)).requires_grad_() for x in embs]
    outs = tb.regroup_keyed_tensor(xs, keys, lengths, groups, backend=flavor)
    assume(outs)
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(tuple(o.shape)).astype(dtype) for o in outs]
    torch.autograd.backward(outs, [tensor(g) for g in grads])
    perm, ins, o_shapes, _ = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    want = embnum.permute_multi_embedding_backward(grads, perm, ins, o_shapes, ins.tolist(), backend="ref")
    for x, w in zip(xs, want):
        got = x.grad.numpy() if x.grad is not None else np.zeros_like(w)
        np.testing.assert_array_equal(got, w)


def test_unused_key_gets_zero_gradient():
    x = torch.randn(4, 5, requires_grad=True)
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[2, 3]], [["b"], ["b"]])
    torch.autograd.backward(out, [torch.ones(4, 3), torch.full((4, 3), 2.0)])
    assert (x.grad[:, :2] == 0).all() and (x.grad[:, 2:] == 3).all()


def test_bfloat16_forward_is_bit_exact():
    x = torch.randn(5, 7).to(torch.bfloat16)
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[3, 4]], [["b", "a"], ["a"]])
    assert out[0].dtype == torch.bfloat16
    assert torch.equal(out[0].view(torch.int16), torch.cat([x[:, 3:], x[:, :3]], 1).view(torch.int16))
    x.requires_grad_()
    out = tb.regroup_keyed_tensor([x], [["a", "b"]], [[3, 4]], [["b", "a"], ["a"]])
    torch.autograd.backward(out, [torch.ones(5, 7, dtype=torch.bfloat16), torch.ones(5, 3, dtype=torch.bfloat16)])
    assert x.grad.dtype == torch.bfloat16 and (x.grad[:, :3] == 2).all() and (x.grad[:, 3:] == 1).all()


def test_bfloat16_backward_rounds_after_every_addition():
    """A key used three times: ((g1 + g2) rounded + g3) rounded, as fbgemm's CPU kernel does."""
    x = torch.zeros(1, 1, dtype=torch.bfloat16, requires_grad=True)
    outs = tb.regroup_keyed_tensor([x], [["a"]], [[1]], [["a"], ["a"], ["a"]])
    g = [torch.tensor([[v]], dtype=torch.bfloat16) for v in (256.0, 1.0, 1.0)]
    torch.autograd.backward(outs, g)
    assert float(x.grad) == 256.0  # 256 + 1 rounds back to 256 twice; summed at once it would be 258
    rng = np.random.default_rng(0)
    keys, lengths, groups = [["a", "b"], ["c"]], [[3, 2], [4]], [["a", "c", "a"], ["b", "a"], ["c"]]
    xs = [torch.tensor(rng.standard_normal((3, sum(ls))), dtype=torch.bfloat16, requires_grad=True) for ls in lengths]
    outs = tb.regroup_keyed_tensor(xs, keys, lengths, groups)
    gs = [torch.tensor(rng.standard_normal(tuple(o.shape)) * 100, dtype=torch.bfloat16) for o in outs]
    torch.autograd.backward(outs, gs)
    perm = embnum.kt_regroup_arguments(None, keys, lengths, groups)[0].tolist()
    want = [torch.zeros_like(x) for x in xs]
    for i, j, a, c, n, _ in perm:  # the spec, literally
        want[i][:, a : a + n] = (want[i][:, a : a + n].float() + gs[j][:, c : c + n].float()).to(torch.bfloat16)
    for x, w in zip(xs, want):
        assert torch.equal(x.grad.view(torch.int16), w.view(torch.int16))


def test_module_caches_arguments_and_never_concatenates(monkeypatch):
    from embnum.examples.keyed_tensor import CLASSIC_GROUPS, CLASSIC_KEYS

    lengths = [[3, 4], [5, 6, 7], [8]]
    m = PermuteMultiEmbedding(CLASSIC_KEYS, lengths, CLASSIC_GROUPS)
    xs = [torch.randn(4, sum(ls), requires_grad=True) for ls in lengths]
    first = m.arguments("cpu")
    assert all(a is b for a, b in zip(first, m.arguments(torch.device("cpu"))))

    def no(*a, **k):
        raise AssertionError("the module must not concatenate its inputs")

    monkeypatch.setattr(torch, "cat", no)
    monkeypatch.setattr(torch, "concat", no)
    outs = m(xs)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    monkeypatch.undo()
    want = embnum.regroup_keyed_tensor(
        [x.detach().numpy() for x in xs], CLASSIC_KEYS, lengths, CLASSIC_GROUPS, backend="ref"
    )
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o.detach().numpy(), w)
    assert (xs[0].grad[:, :3] == 3).all()  # f1 is used three times
    with pytest.raises(ValueError, match="3 tensors"):
        m(xs[:2])


def test_module_compiles_fullgraph():
    lengths = [[3, 4], [5]]
    m = PermuteMultiEmbedding([["a", "b"], ["c"]], lengths, [["c", "a"], ["a", "b", "a"]])
    xs = [torch.randn(3, sum(ls), requires_grad=True) for ls in lengths]
    step = torch.compile(lambda v: sum(o.square().sum() for o in m(v)), backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(step(xs), xs)
    want = torch.autograd.grad(sum(o.square().sum() for o in m(xs)), xs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_module_on_cuda_keeps_arguments_on_the_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m = PermuteMultiEmbedding([["a", "b"]], [[2, 3]], [["b", "a"], ["a"]])
    x = torch.randn(4, 5, device="cuda", requires_grad=True)
    outs = m([x])
    assert all(a.device == x.device for a in m.arguments(x.device))
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert (x.grad[:, :2] == 2).all()


@pytest.mark.fbgemm
@settings(max_examples=40)
@given(args=POOLED_FBGEMM)
def test_fbgemm_permute_pooled_embs_gradient(args):
    """The bridge's gradient of permute_pooled_embs is fbgemm's (the forward is in FBGEMM)."""
    fbgemm()
    args = pooled_fbgemm_domain(args)
    assume(args is not None and args["pooled_embs"].size)
    x = args["pooled_embs"]
    lists = [tensor(args[k].astype(np.int64)) for k in POOLED_LISTS]
    g = tensor(np.arange(x.size, dtype=x.dtype).reshape(x.shape))
    grads = []
    for fn in (torch.ops.fbgemm.permute_pooled_embs_auto_grad, tb.permute_pooled_embs):
        xt = tensor(x).requires_grad_()
        grads.append(torch.autograd.grad(fn(xt, *lists), xt, g)[0].numpy())
    np.testing.assert_array_equal(grads[1], grads[0])


@pytest.mark.fbgemm
def test_fbgemm_bfloat16_gradient():
    fb = fbgemm()
    rng = np.random.default_rng(1)
    keys, lengths, groups = [["a", "b"], ["c"]], [[3, 2], [4]], [["a", "c", "a"], ["b", "a"], ["c"]]
    perm, ins, outs, ol = (
        tensor(a) if isinstance(a, np.ndarray) else a for a in embnum.kt_regroup_arguments(None, keys, lengths, groups)
    )
    xs = [torch.tensor(rng.standard_normal((5, sum(ls))), dtype=torch.bfloat16, requires_grad=True) for ls in lengths]
    want = fb.permute_multi_embedding(xs, perm, ins, outs, ol)
    got = tb.permute_multi_embedding(xs, perm, ins, outs, ol)
    gs = [torch.tensor(rng.standard_normal(tuple(o.shape)) * 100, dtype=torch.bfloat16) for o in want]
    for w, g in zip(want, got):
        assert torch.equal(w.view(torch.int16), g.view(torch.int16))
    for a, b in zip(torch.autograd.grad(want, xs, gs), torch.autograd.grad(got, xs, gs)):
        assert torch.equal(a, b)
