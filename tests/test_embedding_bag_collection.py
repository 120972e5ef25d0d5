"""embnum.modules.EmbeddingBagCollection: forward against a plain NumPy computation on drawn
collections and KJTs, gradients, fused training, TorchRec's state_dict names and a bit-identical
checkpoint round trip for every optimizer, and fbgemm's CPU training module as a peer."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import embnum  # noqa: E402
from collection_inputs import random_kjt, small_tables  # noqa: E402
from embnum import TBEOptimizer  # noqa: E402
from embnum.modules import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402

KJT = embnum.KeyedJaggedTensor

# one optimizer of every kind, their decays and max_norm included
EVERY_KIND = [
    TBEOptimizer("sgd", 0.1),
    TBEOptimizer("adagrad", 0.1),
    TBEOptimizer("rowwise_adagrad", 0.1, weight_decay=0.01, weight_decay_mode="decoupled", max_norm=0.5),
    TBEOptimizer("adam", 0.05, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lamb", 0.05),
    TBEOptimizer("partial_rowwise_adam", 0.05),
    TBEOptimizer("partial_rowwise_lamb", 0.05, weight_decay=0.01, weight_decay_mode="decoupled"),
    TBEOptimizer("lars_sgd", 0.5, eta=0.1),
]


def _expected(ebc, kjt, weighted=False):
    """The pooled output of every feature, by NumPy, in TorchRec's order."""
    d = kjt.to_dict()
    B = kjt.stride()
    cols = []
    for t, w in zip(ebc.embedding_bag_configs(), ebc.split_embedding_weights()):
        table = w.float().numpy().astype(np.float64)
        for f in t.feature_names:
            jt = d[f]
            lengths = jt.lengths().numpy()
            ids = jt.values().numpy()
            psw = jt.weights().numpy() if weighted else np.ones(ids.shape[0])
            out = np.zeros((B, t.embedding_dim))
            o = np.concatenate([[0], np.cumsum(lengths)])
            for b in range(B):
                rows = table[ids[o[b] : o[b + 1]]] * psw[o[b] : o[b + 1], None]
                out[b] = rows.sum(0) / (max(lengths[b], 1) if t.pooling == "mean" else 1)
            cols.append(out)
    return np.concatenate(cols, axis=1)


@st.composite
def collections(draw):
    n = draw(st.integers(1, 4))
    tables = []
    for i in range(n):
        k = draw(st.integers(1, 2))
        tables.append(
            EmbeddingBagConfig(
                num_embeddings=draw(st.integers(1, 6)),
                embedding_dim=draw(st.sampled_from([1, 2, 3, 8])),
                name=f"t{i}",
                feature_names=[f"t{i}f{j}" for j in range(k)],
                pooling=draw(st.sampled_from(["sum", "mean"])),
                data_type=draw(st.sampled_from(["fp32", "fp32", "fp16"])),
            )
        )
    return tables


@given(tables=collections(), B=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_forward_matches_numpy(tables, B, seed):
    rng = np.random.default_rng(seed)
    ebc = EmbeddingBagCollection(tables, seed=seed)
    kjt = random_kjt(rng, tables, B)
    kt = ebc(kjt)
    assert kt.keys() == [f for t in tables for f in t.feature_names]
    assert kt.length_per_key() == [t.embedding_dim for t in tables for _ in t.feature_names]
    np.testing.assert_allclose(kt.values().detach().numpy(), _expected(ebc, kjt), rtol=1e-5, atol=1e-6)


def test_forward_weighted_and_groups():
    tables = [t for t in small_tables() if t.pooling == "sum"]
    ebc = EmbeddingBagCollection(tables, is_weighted=True)
    assert len(ebc._groups) == 2  # fp32 tables t0 and t2 share a call, fp16 t3 has its own
    kjt = random_kjt(np.random.default_rng(1), tables, 5, weighted=True)
    np.testing.assert_allclose(ebc(kjt).values().detach().numpy(), _expected(ebc, kjt, True), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="weights"):
        ebc(random_kjt(np.random.default_rng(1), tables, 5))


def test_plain_autograd_gradients_and_torch_optimizer():
    """Without a fused optimizer every table's weight is a leaf with the dense gradient; the
    per-sample weights get theirs too."""
    tables = [t for t in small_tables() if t.data_type == "fp32"]
    ebc = EmbeddingBagCollection(tables)
    kjt = random_kjt(np.random.default_rng(2), tables, 4)
    out = ebc(kjt).values()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    out.backward(g)
    # the same gradient by differentiating the NumPy forward (it is linear): column blocks
    d = kjt.to_dict()
    col = 0
    for t in tables:
        want = np.zeros((t.num_embeddings, t.embedding_dim))
        for f in t.feature_names:
            jt = d[f]
            o = np.concatenate([[0], np.cumsum(jt.lengths().numpy())])
            for b in range(kjt.stride()):
                L = o[b + 1] - o[b]
                for i in jt.values().numpy()[o[b] : o[b + 1]]:
                    want[i] += g[b, col : col + t.embedding_dim].numpy() / (L if t.pooling == "mean" else 1)
            col += t.embedding_dim
        np.testing.assert_allclose(ebc.embedding_bags[t.name].weight.grad.numpy(), want, rtol=1e-5, atol=1e-6)
    opt = torch.optim.SGD(ebc.parameters(), lr=0.1)
    before = [w.clone() for w in ebc.split_embedding_weights()]
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, ebc.split_embedding_weights()))


def test_state_dict_names_views_and_write_through():
    opt = TBEOptimizer("partial_rowwise_adam", 0.1)
    ebc = EmbeddingBagCollection(small_tables(), optimizer=opt)
    sd = ebc.state_dict()
    names = {
        f"embedding_bags.{t}.{k}"
        for t in ("t0", "t1", "t2", "t3")
        for k in ("weight", "momentum1", "momentum2", "step")
    }
    assert set(sd) == names
    assert sd["embedding_bags.t1.weight"].shape == (7, 3) and sd["embedding_bags.t1.momentum1"].shape == (7, 3)
    assert sd["embedding_bags.t1.momentum2"].shape == (7,) and sd["embedding_bags.t3.weight"].dtype == torch.float16
    w = ebc.split_embedding_weights()
    assert [tuple(x.shape) for x in w] == [(10, 4), (7, 3), (5, 2), (6, 2)]
    states = ebc.split_optimizer_states()
    assert [[tuple(s.shape) for s in st_] for st_ in states][1] == [(7, 3), (7,)]
    # loading writes through the views into the flat buffers the lookup reads
    new = {k: (torch.full_like(v, 0.5) if k.endswith("weight") else v) for k, v in sd.items()}
    ebc.load_state_dict(new)
    kjt = random_kjt(np.random.default_rng(3), small_tables(), 3)
    np.testing.assert_allclose(ebc(kjt).values().detach().numpy(), _expected(ebc, kjt), rtol=1e-6)
    assert all(float(x.float().min()) == 0.5 == float(x.float().max()) for x in ebc.split_embedding_weights())
    text = repr(ebc)
    for t in ("t0", "t1", "t2", "t3", "10 x 4", "features=['f0', 'f1']", "pooling='mean'", "TBE calls=3"):
        assert t in text


def _train(ebc, batches, grads):
    for kjt, g in zip(batches, grads):
        ebc(kjt).values().backward(g)


@pytest.mark.parametrize("opt", EVERY_KIND, ids=lambda o: o.kind)
def test_checkpoint_round_trip_is_bit_identical(opt):
    """Train 2 steps, checkpoint (torch.save of state_dict), train 3 more; a fresh collection
    (another seed) that loads the checkpoint and trains the same 3 steps ends bit-identical."""
    rng = np.random.default_rng(4)
    batches = [random_kjt(rng, small_tables(), 4) for _ in range(5)]
    width = sum(t.embedding_dim * len(t.feature_names) for t in small_tables())
    grads = [torch.from_numpy(rng.standard_normal((4, width)).astype(np.float32)) for _ in range(5)]
    a = EmbeddingBagCollection(small_tables(), optimizer=opt, seed=1)
    _train(a, batches[:2], grads[:2])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    _train(a, batches[2:], grads[2:])
    b = EmbeddingBagCollection(small_tables(), optimizer=opt, seed=2)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    assert int(b.state_dict()["embedding_bags.t0.step"]) == 2
    _train(b, batches[2:], grads[2:])
    sa, sb = a.state_dict(), b.state_dict()
    assert int(sa["embedding_bags.t1.step"]) == 5
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_fused_training_learns_and_matches_the_flat_update():
    """The fused collection's first step equals tbe_backward_update on its flat buffer."""
    opt = TBEOptimizer("rowwise_adagrad", 0.2)
    tables = [t for t in small_tables() if t.data_type == "fp32" and t.pooling == "sum"]
    ebc = EmbeddingBagCollection(tables, optimizer=opt)
    (g,) = ebc._groups
    w = g.weights.detach().numpy().copy()
    m1 = np.zeros(int(g.hash_size_cumsum[-1]), np.float32)
    kjt = random_kjt(np.random.default_rng(5), tables, 6, extra=False, keys=["f0", "f1", "f3"])
    out = ebc(kjt).values()
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    embnum.tbe_backward_update(
        grad.numpy(),
        w,
        *[x.numpy() for x in g.layout()],
        kjt.values().numpy(),
        kjt.offsets().numpy(),
        optimizer=opt,
        momentum1=m1,
    )
    np.testing.assert_allclose(g.weights.detach().numpy(), w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ebc.split_optimizer_states()[0][0].numpy(), m1[:10], rtol=1e-6)


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: EmbeddingBagConfig(0, 4, "t"), ValueError, "num_embeddings"),
        (lambda: EmbeddingBagConfig(3, 4, ""), ValueError, "name"),
        (lambda: EmbeddingBagConfig(3, 4, "t", pooling="none"), ValueError, "pooling"),
        (lambda: EmbeddingBagConfig(3, 4, "t", data_type="int8"), ValueError, "data_type"),
        (lambda: EmbeddingBagConfig(3, 4, "t", weight_init_min=1.0, weight_init_max=0.0), ValueError, "weight_init"),
        (lambda: EmbeddingBagCollection([]), ValueError, "non-empty"),
        (lambda: EmbeddingBagCollection([EmbeddingBagConfig(3, 4, "t")] * 2), ValueError, "unique"),
        (
            lambda: EmbeddingBagCollection(
                [EmbeddingBagConfig(3, 4, "a", feature_names=["f"]), EmbeddingBagConfig(3, 4, "b", feature_names=["f"])]
            ),
            ValueError,
            "['f']",
        ),
        (lambda: EmbeddingBagCollection([EmbeddingBagConfig(3, 4, "t")], optimizer="sgd"), TypeError, "TBEOptimizer"),
        (
            lambda: EmbeddingBagCollection([EmbeddingBagConfig(3, 4, "t", pooling="mean")], is_weighted=True),
            ValueError,
            "is_weighted",
        ),
    ],
)
def test_rejects(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    assert words in str(info.value)


def test_forward_rejects_missing_keys_and_variable_batch():
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(3, 2, "t", feature_names=["a", "b"])])
    with pytest.raises(ValueError, match=r"\['b'\]"):
        ebc(KJT.from_lengths_sync(["a"], torch.tensor([0, 1]), torch.tensor([2])))
    vbe = KJT(["a", "b"], torch.tensor([0, 1, 2]), lengths=torch.tensor([1, 1, 1]), stride_per_key=[1, 2])
    with pytest.raises(ValueError, match="variable batch"):
        ebc(vbe)


@st.composite
def _one_bad_id(draw):
    """A KJT for ``small_tables()`` (batch B) with one id outside its feature's table, and where: the
    key, the table, its rows, the sample and the id."""
    tables = small_tables()
    keys = [f for t in tables for f in t.feature_names]
    rows = {f: t.num_embeddings for t in tables for f in t.feature_names}
    table_of = {f: t.name for t in tables for f in t.feature_names}
    B = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 3), min_size=len(keys) * B, max_size=len(keys) * B))
    k = draw(st.integers(0, len(keys) - 1))
    b = draw(st.integers(0, B - 1))
    lengths[k * B + b] = max(lengths[k * B + b], 1)
    values = [draw(st.integers(0, rows[keys[i // B]] - 1)) for i, n in enumerate(lengths) for _ in range(n)]
    bad = draw(st.one_of(st.integers(rows[keys[k]], 2**40), st.integers(-(2**40), -1)))
    values[sum(lengths[: k * B + b]) + draw(st.integers(0, lengths[k * B + b] - 1))] = bad
    kjt = KJT.from_lengths_sync(keys, torch.tensor(values), torch.tensor(lengths))
    return kjt, keys[k], table_of[keys[k]], rows[keys[k]], b, bad


@given(case=_one_bad_id(), fused=st.booleans())
def test_an_id_outside_its_table_is_named_by_key_table_and_sample(case, fused):
    """The error speaks of what the user passed (the key, the table, the sample), and keeps the
    op's message, in terms of the flat TBE call, as its cause."""
    kjt, key, table, rows, sample, bad = case
    ebc = EmbeddingBagCollection(small_tables(), optimizer=TBEOptimizer("sgd", 0.1) if fused else None)
    with pytest.raises(IndexError) as info:
        ebc(kjt)
    assert str(info.value) == f"feature {key!r} (table {table!r}): id {bad} at sample {sample} is outside [0, {rows})"
    assert isinstance(info.value.__cause__, IndexError) and "indices[" in str(info.value.__cause__)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_ids_that_are_not_integers_name_the_kjt_values(dtype):
    ebc = EmbeddingBagCollection(small_tables())
    keys = [f for t in small_tables() for f in t.feature_names]
    kjt = KJT.from_lengths_sync(keys, torch.ones(len(keys), dtype=dtype), torch.ones(len(keys), dtype=torch.int64))
    with pytest.raises(TypeError, match=rf"features\.values\(\) must hold int32 or int64 ids, got {dtype}") as info:
        ebc(kjt)
    assert isinstance(info.value.__cause__, TypeError) and "indices" in str(info.value.__cause__)


# -- optional differential tier: fbgemm_gpu's CPU training module -------------------------
@pytest.mark.fbgemm
@pytest.mark.parametrize("kind", ["exact_sgd", "exact_adagrad", "exact_row_wise_adagrad"])
def test_fbgemm_module_forward_and_training_steps(kind):
    """Same tables and weights as fbgemm's SplitTableBatchedEmbeddingBagsCodegen (CPU): the
    collection's output and its weights and state after each of 3 fused steps track fbgemm's."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:  # noqa: BLE001
        pytest.skip("fbgemm_gpu is not importable")
    tables = [  # one TBE call on each side (fbgemm's module has one pooling), dims % 4 == 0
        EmbeddingBagConfig(num_embeddings=12, embedding_dim=8, name="user", feature_names=["u0", "u1"]),
        EmbeddingBagConfig(num_embeddings=9, embedding_dim=4, name="item", feature_names=["i0"]),
    ]
    opt = TBEOptimizer(kind, 0.05)
    ebc = EmbeddingBagCollection(tables, optimizer=opt, seed=3)
    fb = SplitTableBatchedEmbeddingBagsCodegen(
        [(t.num_embeddings, t.embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for t in tables],
        feature_table_map=[0, 0, 1],
        optimizer={
            "exact_sgd": EmbOptimType.EXACT_SGD,
            "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
            "exact_row_wise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }[kind],
        learning_rate=0.05,
        eps=1e-8,
        pooling_mode=PoolingMode.SUM,
        device="cpu",
    )
    with torch.no_grad():
        for fw, w in zip(fb.split_embedding_weights(), ebc.split_embedding_weights()):
            fw.copy_(w)
    rng = np.random.default_rng(0)
    for _ in range(3):
        kjt = random_kjt(rng, tables, 5, keys=["i0", "u1", "u0"], extra=False)
        mine = ebc(kjt).values()
        ordered = kjt.permute([2, 1, 0])  # fbgemm's feature order: the tables' features
        theirs = fb(ordered.values(), ordered.offsets())
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
        g = torch.from_numpy(rng.standard_normal(tuple(mine.shape)).astype(np.float32))
        mine.backward(g)
        theirs.backward(g)
        for a, b in zip(ebc.split_embedding_weights(), fb.split_embedding_weights()):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
        if kind != "exact_sgd":
            for a, b in zip(ebc.split_optimizer_states(), fb.split_optimizer_states()):
                np.testing.assert_allclose(a[0].numpy().reshape(-1), b[0].numpy().reshape(-1), rtol=1e-5, atol=1e-7)


# -- optional differential tier: torchrec's own EmbeddingBagCollection ----------------------
@pytest.mark.torchrec
def test_torchrec_ebc_loads_our_state_dict_and_agrees():
    """TorchRec's (unsharded) EBC loads our state_dict strictly (same names and shapes) and
    then maps the same KJT (converted with to_torchrec) to the same KeyedTensor; our config
    takes torchrec's PoolingType / DataType enums."""
    pytest.importorskip("torchrec.sparse.jagged_tensor")
    try:
        from torchrec.modules.embedding_configs import DataType, PoolingType
        from torchrec.modules.embedding_configs import EmbeddingBagConfig as TorchrecConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchrecEBC
    except Exception:  # noqa: BLE001
        pytest.skip("torchrec's modules are not importable")
    specs = [(10, 4, "t0", ["f0", "f1"], "SUM"), (7, 3, "t1", ["f2"], "MEAN"), (5, 2, "t2", ["f3"], "SUM")]
    mine = EmbeddingBagCollection(
        [EmbeddingBagConfig(r, d, n, DataType.FP32, f, pooling=getattr(PoolingType, p)) for r, d, n, f, p in specs],
        seed=5,
    )
    theirs = TorchrecEBC(
        [
            TorchrecConfig(num_embeddings=r, embedding_dim=d, name=n, feature_names=f, pooling=getattr(PoolingType, p))
            for r, d, n, f, p in specs
        ],
        device=torch.device("cpu"),
    )
    theirs.load_state_dict(mine.state_dict())  # strict
    rng = np.random.default_rng(6)
    for B in (0, 1, 5):
        kjt = random_kjt(rng, mine.embedding_bag_configs(), B)
        a, b = mine(kjt), theirs(kjt.to_torchrec())
        assert a.keys() == b.keys() and a.length_per_key() == b.length_per_key()
        np.testing.assert_allclose(a.values().detach().numpy(), b.values().detach().numpy(), rtol=1e-5, atol=1e-6)
