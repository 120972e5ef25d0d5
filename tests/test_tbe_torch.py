"""The TBE family on torch tensors (docs/families/tbe.md): the bridge's gradcheck, the TBE and
FusedTBE modules (training, checkpoints, errors), and (optional tier) fbgemm_gpu's TBE module."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum
from embnum import TBEOptimizer, tbe_layout
from harness import fbgemm
from tables.tbe import BASE, GRAD, IND, LAY, OFF, OPTIMIZERS, W12

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")


# -- torch bridge: gradcheck, the two modules ------------------------------------


@pytest.mark.filterwarnings("ignore:Input #[01] requires gradient and is not a double")  # float32 on purpose
def test_bridge_gradcheck_weights_and_per_sample_weights():
    """gradcheck in float32: TBE weights are float32/float16 (float64 is not a TBE dtype), and the
    op is linear in weights and in per_sample_weights, so a large step is exact."""
    lay = tbe_layout([4, 3], [3, 2], [0, 0, 1])
    T = torch.from_numpy
    w = torch.randn(lay.num_weights, dtype=torch.float32, requires_grad=True)
    indices = torch.tensor([0, 3, 3, 1, 2, 2, 0, 1, 1])
    offsets = torch.tensor([0, 2, 3, 3, 6, 7, 9])
    psw = torch.randn(9, dtype=torch.float32, requires_grad=True)

    def f(w, psw):
        return tb.tbe_forward(
            w, T(lay.weights_offsets), T(lay.D_offsets), T(lay.hash_size_cumsum), indices, offsets, "sum", psw
        )

    assert torch.autograd.gradcheck(f, (w, psw), eps=1e-2, atol=1e-3, rtol=1e-3)
    g = lambda w: tb.tbe_forward(
        w, T(lay.weights_offsets), T(lay.D_offsets), T(lay.hash_size_cumsum), indices, offsets, "mean"
    )  # noqa: E731
    assert torch.autograd.gradcheck(g, (w,), eps=1e-2, atol=1e-3, rtol=1e-3)


def _torch_batches(torch, n, T, B, rows, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        lengths = rng.integers(0, 5, T * B)
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
        indices = torch.tensor(rng.integers(0, rows, int(lengths.sum())))
        yield indices, offsets


def test_plain_module_trains_with_a_torch_optimizer():
    from embnum.modules import TBE

    torch.manual_seed(0)
    emb = TBE([30, 30], [4, 4], [0, 0, 1], pooling_mode="mean")
    head = torch.nn.Linear(12, 1)
    opt = torch.optim.Adagrad(list(emb.parameters()) + list(head.parameters()), lr=0.3)
    losses = []
    for indices, offsets in _torch_batches(torch, 40, 3, 8, 30):
        target = (indices[offsets[:-1].clamp(max=len(indices) - 1)][:8] % 2).float() if len(indices) else torch.zeros(8)
        loss = ((head(emb(indices, offsets)).squeeze(1) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        assert emb.weights.grad is not None and emb.weights.grad.shape == emb.weights.shape
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: f"{o.kind}-{o.weight_decay_mode}")
def test_fused_module_matches_tbe_backward_update(opt):
    """The fused module's backward applies exactly ``tbe_backward_update`` (weights, state, step)."""
    from embnum.modules import FusedTBE

    mod = FusedTBE([20, 10], [4, 2], [0, 1, 1], optimizer=opt, pooling_mode="sum")
    w = mod.weights.detach().numpy().copy()
    state = {
        k: (None if getattr(mod, k) is None else getattr(mod, k).numpy().copy()) for k in ("momentum1", "momentum2")
    }
    rng = np.random.default_rng(1)
    for step, (indices, offsets) in enumerate(_torch_batches(torch, 3, 3, 5, 10), start=1):
        psw = torch.tensor(rng.standard_normal(len(indices)).astype(np.float32), requires_grad=True)
        out = mod(indices, offsets, psw)
        g = torch.tensor(rng.standard_normal(tuple(out.shape)).astype(np.float32))
        out.backward(g)
        assert mod.weights.grad is None and mod.step == step
        want_psw = embnum.tbe_grad_per_sample_weights(
            np.clip(g.numpy(), -(opt.max_gradient or np.inf), opt.max_gradient or np.inf),
            w,
            *[b.numpy() for b in mod.layout()],
            indices.numpy(),
            offsets.numpy(),
        )
        np.testing.assert_allclose(psw.grad.numpy(), want_psw, rtol=1e-5, atol=1e-6)
        embnum.tbe_backward_update(
            g.numpy(),
            w,
            *[b.numpy() for b in mod.layout()],
            indices.numpy(),
            offsets.numpy(),
            "sum",
            psw.detach().numpy(),
            optimizer=opt,
            step=step if opt.uses_step else None,
            **state,
        )
        np.testing.assert_allclose(mod.weights.detach().numpy(), w, rtol=1e-6, atol=1e-7)
        for k, v in state.items():
            if v is not None:
                np.testing.assert_allclose(getattr(mod, k).numpy(), v, rtol=1e-6)


# one optimizer of every kind, the decays and max_norm included
EVERY_KIND = [
    TBEOptimizer("sgd", 0.1),
    TBEOptimizer("adagrad", 0.1),
    TBEOptimizer("rowwise_adagrad", 0.1, weight_decay=0.01, weight_decay_mode="l2", max_norm=0.5),
    TBEOptimizer("adam", 0.05, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lamb", 0.05, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("partial_rowwise_adam", 0.05),
    TBEOptimizer("partial_rowwise_lamb", 0.05, max_gradient=0.5),
    TBEOptimizer("lars_sgd", 0.5, eta=0.1, weight_decay=0.01, weight_decay_mode="l2"),
]


@pytest.mark.parametrize("opt", EVERY_KIND, ids=lambda o: o.kind)
def test_fused_module_checkpoint_resume_is_bit_identical(opt):
    """Train 2 steps, save (``torch.save`` of ``state_dict()``), train 3 more; a fresh module that
    loads the checkpoint and trains the same 3 steps ends bit-identical (weights, state, step)."""
    import io

    from embnum.modules import FusedTBE

    batches = list(_torch_batches(torch, 5, 3, 4, 10, seed=7))
    grads = [torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(5)]

    def train(mod, steps):
        for i in steps:
            mod(*batches[i]).backward(grads[i])

    a = FusedTBE([10, 10], [2, 2], [0, 0, 1], optimizer=opt, seed=1)
    train(a, range(2))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    assert "iter" in a.state_dict() and a.step == 2
    train(a, range(2, 5))
    b = FusedTBE([10, 10], [2, 2], [0, 0, 1], optimizer=opt, seed=2)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    assert b.step == 2
    train(b, range(2, 5))
    assert b.step == a.step == 5
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


@given(
    fused=st.booleans(),
    B=st.integers(1, 4),
    feature=st.integers(0, 2),
    data=st.data(),
)
def test_modules_name_an_id_outside_its_table_by_feature_table_and_sample(fused, B, feature, data):
    """TBE and FusedTBE (three features over two tables: 20 and 10 rows) report an id outside its
    table by feature position, table and sample, with the op's error as the cause."""
    from embnum.modules import TBE, FusedTBE

    rows, ftm = [20, 10], [0, 1, 1]
    mod = FusedTBE(rows, [4, 2], ftm, optimizer=TBEOptimizer("sgd", 0.1)) if fused else TBE(rows, [4, 2], ftm)
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=3 * B, max_size=3 * B))
    sample = data.draw(st.integers(0, B - 1))
    lengths[feature * B + sample] = max(1, lengths[feature * B + sample])
    ids = [data.draw(st.integers(0, rows[ftm[i // B]] - 1)) for i, n in enumerate(lengths) for _ in range(n)]
    R = rows[ftm[feature]]
    bad = data.draw(st.one_of(st.integers(R, 2**40), st.integers(-(2**40), -1)))
    ids[sum(lengths[: feature * B + sample]) + data.draw(st.integers(0, lengths[feature * B + sample] - 1))] = bad
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]))
    with pytest.raises(IndexError) as info:
        mod(torch.tensor(ids), offsets)
    want = f"feature {feature} (table {ftm[feature]}): id {bad} at sample {sample} is outside [0, {R})"
    assert str(info.value) == want
    assert isinstance(info.value.__cause__, IndexError) and "indices[" in str(info.value.__cause__)


def test_modules_leave_other_lookup_errors_as_the_op_gives_them():
    """Only an id outside its table is rephrased: for in-range ids, ids that are not integers and
    offsets the layout does not fit, ``out_of_range_error`` gives ``None`` and the op's error stands."""
    from embnum.modules import TBE

    mod = TBE([20, 10], [4, 2], [0, 1, 1])
    err = IndexError("the op's")
    ids = torch.tensor([1, 2, 3])
    for indices, offsets in [
        (ids, torch.tensor([0, 1, 2, 3])),  # every id in range
        (ids.float(), torch.tensor([0, 1, 2, 3])),
        (ids, torch.tensor([0, 1, 2, 3]).float()),
        (torch.tensor([1, 2, 99]), torch.tensor([0, 1, 2])),  # 2 offsets for 3 features
        (torch.tensor([1, 2, 99]), torch.tensor([0, 1, 2, 5])),  # past the ids
        (torch.tensor([1, 2, 99]), torch.tensor([0, 2, 1, 3])),  # decreasing
        (torch.tensor([1, 2, 99]), torch.tensor([-1, 1, 2, 3])),
    ]:
        assert mod.out_of_range_error(err, indices, offsets) is None, (indices, offsets)
    assert "id 99 at sample 0" in str(mod.out_of_range_error(err, torch.tensor([1, 2, 99]), torch.tensor([0, 1, 2, 3])))


def test_fused_module_training_loop_learns():
    from embnum.modules import FusedTBE

    torch.manual_seed(0)
    mod = FusedTBE([50, 40], [8, 8], optimizer=TBEOptimizer("rowwise_adagrad", 0.2), pooling_mode="mean")
    target = torch.randn(16)
    losses = []
    for indices, offsets in _torch_batches(torch, 50, 2, 16, 40, seed=3):
        loss = ((mod(indices, offsets) - target) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def _fbgemm_module(rows, dims, ftm, kind, pooling, lr):
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:  # noqa: BLE001
        pytest.skip("fbgemm_gpu is not importable")
    optim = {
        "sgd": EmbOptimType.EXACT_SGD,
        "adagrad": EmbOptimType.EXACT_ADAGRAD,
        "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    }[kind]
    mode = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[pooling]
    specs = [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(rows, dims)]
    return torch, SplitTableBatchedEmbeddingBagsCodegen(
        specs, feature_table_map=ftm, optimizer=optim, learning_rate=lr, eps=1e-8, pooling_mode=mode, device="cpu"
    )


@pytest.mark.fbgemm
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_fbgemm_module_forward_and_training_steps(kind, pooling):
    """Same weights, same batches: embnum's forward and fused update (cpu) track fbgemm's module for 3 steps."""
    rows, dims, ftm = [7, 5, 9], [4, 8, 12], [0, 0, 1, 2]  # the module needs D % 4 == 0
    torch, fb = _fbgemm_module(rows, dims, ftm, kind, pooling, lr=0.05)
    lay = tbe_layout(rows, dims, ftm)
    np.testing.assert_array_equal(fb.weights_offsets.numpy(), lay.weights_offsets)
    np.testing.assert_array_equal(fb.hash_size_cumsum.numpy(), lay.hash_size_cumsum)
    w = fb.weights_host.detach().numpy().copy()
    opt = TBEOptimizer(kind, 0.05)
    m1 = None if kind == "sgd" else np.zeros(fb.momentum1_host.shape[0], np.float32)
    rng = np.random.default_rng(0)
    E = embnum._tbe_bounds.rows_per_feature(lay.hash_size_cumsum)
    B = 6
    for _ in range(3):
        lengths = rng.integers(0, 5, len(ftm) * B)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        indices = np.concatenate([rng.integers(0, E[t], lengths[t * B : (t + 1) * B].sum()) for t in range(len(ftm))])
        out = fb(torch.from_numpy(indices), torch.from_numpy(offsets))
        mine = embnum.tbe_forward(w, *lay.arrays(), indices, offsets, pooling)
        np.testing.assert_allclose(mine, out.detach().numpy(), rtol=1e-5, atol=1e-6)
        g = rng.standard_normal(mine.shape).astype(np.float32)
        out.backward(torch.from_numpy(g))
        embnum.tbe_backward_update(g, w, *lay.arrays(), indices, offsets, pooling, optimizer=opt, momentum1=m1)
        np.testing.assert_allclose(w, fb.weights_host.detach().numpy(), rtol=1e-5, atol=1e-6)
        if m1 is not None:
            np.testing.assert_allclose(m1, fb.momentum1_host.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.fbgemm
def test_fbgemm_cpu_ops_backward_and_per_sample_weights():
    """fbgemm's indice-weights gradient CPU op on the spec's example layout."""
    fb = fbgemm()
    t = torch.from_numpy
    got = fb.split_embedding_codegen_grad_indice_weights_cpu(
        t(GRAD),
        t(W12),
        t(LAY.weights_offsets),
        t(LAY.D_offsets.astype(np.int32)),
        t(IND),
        t(OFF),
        t(np.ones(2, np.int32)),
    )
    np.testing.assert_allclose(embnum.tbe_grad_per_sample_weights(GRAD, *BASE), got.numpy(), rtol=1e-6)
