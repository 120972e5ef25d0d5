"""The jagged family on torch tensors (docs/families/jagged.md): the bridge's values, gradients and
bfloat16, and (optional tier) fbgemm_gpu's gradients."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import embnum
from harness import fbgemm, tensor
from strategies import (
    float_dtypes,
)
from tables.jagged import O, segment_sum_args, to_dense_args, to_jagged_args

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


# -- torch bridge: values, gradients, bfloat16 ------------------------------------


@st.composite
def float_jagged(draw):
    """j2pd-style arguments with float64 values, for gradients."""
    args = draw(to_dense_args())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    args["values"] = rng.standard_normal(args["values"].shape)
    args["padding_value"] = 0.0
    return args


@settings(max_examples=15)
@given(args=float_jagged())
def test_gradcheck_jagged_to_padded_dense(args):
    assume(args["values"].size > 0)  # gradcheck needs elements (empty outputs: test_empty_output_...)
    v = tensor(args["values"]).requires_grad_()
    offs = [tensor(o) for o in args["offsets"]]
    assert torch.autograd.gradcheck(lambda x: tb.jagged_to_padded_dense(x, offs, args["max_lengths"], 0.0), (v,))


@settings(max_examples=15)
@given(args=to_jagged_args())
def test_gradcheck_dense_to_jagged(args):
    assume(args["dense"].size > 0)
    d = tensor(np.random.default_rng(0).standard_normal(args["dense"].shape)).requires_grad_()
    offs = [tensor(o) for o in args["offsets"]]
    assert torch.autograd.gradcheck(lambda x: tb.dense_to_jagged(x, offs, args["total_L"]), (d,))


@settings(max_examples=15)
@given(args=segment_sum_args())
def test_gradcheck_segment_sum_csr(args):
    assume(args["values"].size > 0)
    v = tensor(np.random.default_rng(0).standard_normal(args["values"].shape)).requires_grad_()
    csr = tensor(args["csr_seg"])
    assert torch.autograd.gradcheck(lambda x: tb.segment_sum_csr(args["batch_size"], csr, x), (v,))


def test_gradcheck_1d_and_2d():
    v1 = torch.arange(6.0, dtype=torch.float64, requires_grad=True)
    v2 = torch.arange(12.0, dtype=torch.float64).reshape(6, 2).requires_grad_()
    o = tensor(O)
    assert torch.autograd.gradcheck(lambda x: tb.jagged_1d_to_dense(x, o, 2, -1.0), (v1,))
    assert torch.autograd.gradcheck(lambda x: tb.jagged_2d_to_dense(x, o, 2), (v2,))


@pytest.mark.parametrize("flavor", ["ref", "cpu", "cuda"])
@settings(max_examples=10)
@given(args=float_jagged(), seed=st.integers(0, 2**32 - 1), dtype=float_dtypes)
def test_bridge_gradient_is_the_reference_adjoint(flavor, args, seed, dtype):
    """grad of jagged_to_padded_dense on every backend == ref dense_to_jagged of grad_out."""
    if flavor == "cuda" and not embnum._backend.BACKENDS["cuda"].available():
        pytest.skip("cuda backend unavailable")
    values = args["values"].astype(dtype)
    v = tensor(values).requires_grad_()
    offs = [tensor(o) for o in args["offsets"]]
    out = tb.jagged_to_padded_dense(v, offs, args["max_lengths"], 0.0, backend=flavor)
    grad_out = np.random.default_rng(seed).standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(tensor(grad_out))
    dense = grad_out if values.ndim == 2 else grad_out[..., None]
    want = embnum.dense_to_jagged(dense, args["offsets"], len(values), backend="ref").reshape(values.shape)
    np.testing.assert_array_equal(v.grad.numpy(), want)


def test_empty_output_stays_on_the_graph():
    v = torch.zeros((0, 3), requires_grad=True)
    out = tb.jagged_to_padded_dense(v, [torch.zeros(1, dtype=torch.int64)], [4])
    assert out.shape == (0, 4, 3) and out.requires_grad
    out.sum().backward()
    assert v.grad.shape == (0, 3)


@given(args=to_dense_args(max_J=2))
@settings(max_examples=20)
def test_bfloat16_is_bit_exact(args):
    """bfloat16 moves bit for bit; the padding is rounded like torch rounds it."""
    vals = np.ascontiguousarray(args["values"]).astype(np.float32)
    v = tensor(vals).to(torch.bfloat16)
    offs = [tensor(o) for o in args["offsets"]]
    pad = args["padding_value"] if np.dtype(args["values"].dtype).kind == "f" else float(args["padding_value"])
    got = tb.jagged_to_padded_dense(v, offs, args["max_lengths"], pad)
    # reference: the same op on the float32 widening, which is exact, then narrowed
    with np.errstate(over="ignore"):  # a drawn padding beyond float32 rounds to +-inf, as torch's does
        pad32 = np.float32(pad)
    want = embnum.jagged_to_padded_dense(vals, args["offsets"], args["max_lengths"], pad32, backend="ref")
    want_t = torch.from_numpy(want).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    same = got.view(torch.int16) == want_t.view(torch.int16)
    nan_both = torch.isnan(got) & torch.isnan(want_t)
    assert bool((same | nan_both).all())
    dense = got if vals.ndim == 2 else got.unsqueeze(-1)
    back = tb.dense_to_jagged(dense, offs, len(vals))
    want_back = embnum.dense_to_jagged(dense.float().numpy(), args["offsets"], len(vals), backend="ref")
    b, w = back.float(), torch.from_numpy(want_back)
    assert back.dtype == torch.bfloat16
    assert bool(((b == w) | (torch.isnan(b) & torch.isnan(w))).all())


def test_bfloat16_segment_sum_rounds_once():
    v = torch.ones(3000, dtype=torch.bfloat16)
    got = tb.segment_sum_csr(1, torch.tensor([0, 3000]), v)
    assert got.dtype == torch.bfloat16 and float(got) == float(torch.tensor(3000.0).to(torch.bfloat16))


@pytest.mark.fbgemm
@settings(max_examples=20)
@given(args=float_jagged(), seed=st.integers(0, 2**32 - 1))
def test_fbgemm_gradients(args, seed):
    fbgemm()
    values = args["values"].astype(np.float32)
    assume(values.ndim == 2 and values.size > 0)
    offs = [tensor(o.astype(np.int64)) for o in args["offsets"]]
    grads = []
    for fn in (tb.jagged_to_padded_dense, torch.ops.fbgemm.jagged_to_padded_dense):
        v = tensor(values).requires_grad_()
        out = fn(v, offs, args["max_lengths"], 0.0)
        g = np.random.default_rng(seed).standard_normal(tuple(out.shape)).astype(np.float32)
        out.backward(tensor(g))
        grads.append(v.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
