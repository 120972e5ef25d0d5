"""TorchRec on embnum's fbgemm_gpu stand-in (fbgemm_gpu absent): import, lookups, training.

* ``import torchrec``; TorchRec's KeyedJaggedTensor / KeyedTensor methods that call fbgemm operators;
* TorchRec's ``EmbeddingBagCollection`` and ``EmbeddingCollection`` forward on drawn KJTs;
* ``FusedEmbeddingBagCollection`` (the optimizer fused into backward, on the stand-in's
  ``SplitTableBatchedEmbeddingBagsCodegen``) trains three steps equal to an
  ``EmbeddingBagCollection`` with the same start and the matching torch optimizer.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnum import fbgemm_compat

if fbgemm_compat.status()["real_fbgemm_gpu"] is not None:
    pytest.skip("a real fbgemm_gpu is importable: the stand-in tier runs without it", allow_module_level=True)
torch = pytest.importorskip("torch")
fbgemm_compat.install()
torchrec = pytest.importorskip("torchrec")

from torchrec import (  # noqa: E402
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    KeyedTensor,
)
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402


@st.composite
def tables_and_batches(draw, n_batches=1):
    """2-3 tables (a shared one read by two features), rows 1..12, dims 1..8, KJTs of batch 1..4."""
    n = draw(st.integers(2, 3))
    rows = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    dims = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    features = [[f"f{t}"] for t in range(n)]
    features[-1].append("shared")
    tables = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=d, num_embeddings=r, feature_names=fs)
        for t, (r, d, fs) in enumerate(zip(rows, dims, features))
    ]
    keys = [f for fs in features for f in fs]
    rows_of = {f: r for r, fs in zip(rows, features) for f in fs}
    B = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    batches = []
    for _ in range(n_batches):
        lengths = rng.integers(0, 4, len(keys) * B)
        values = np.concatenate([rng.integers(0, rows_of[k], n) for k, n in zip(np.repeat(keys, B), lengths)] + [[]])
        batches.append(
            KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor(lengths)
            )
        )
    return tables, batches


def _pooled_reference(ebc, kjt):
    """Per feature, the sum of its table rows for each bag (straight from the weights)."""
    out = []
    for config, bag in zip(ebc.embedding_bag_configs(), ebc.embedding_bags.values()):
        for f in config.feature_names:
            w = bag.weight.detach()
            out.append(torch.stack([w[ids].sum(0) for ids in kjt[f].to_dense()]))
    return torch.cat(out, dim=1)


@settings(max_examples=10)
@given(tables_and_batches())
def test_embedding_bag_collection_forward(case):
    tables, (kjt,) = case
    ebc = EmbeddingBagCollection(tables=tables)
    kt = ebc(kjt)
    assert isinstance(kt, KeyedTensor) and kt.keys() == kjt.keys()
    torch.testing.assert_close(kt.values(), _pooled_reference(ebc, kjt))
    regrouped = KeyedTensor.regroup([kt], [[kjt.keys()[-1], kjt.keys()[0]]])
    torch.testing.assert_close(regrouped[0], torch.cat([kt[kjt.keys()[-1]], kt[kjt.keys()[0]]], dim=1))


@settings(max_examples=10)
@given(tables_and_batches())
def test_embedding_collection_forward_and_kjt_methods(case):
    tables, (kjt,) = case
    d = tables[0].embedding_dim
    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="e", embedding_dim=d, num_embeddings=12, feature_names=kjt.keys())]
    )
    out = ec(kjt)
    w = ec.embeddings["e"].weight.detach()
    for key in kjt.keys():
        torch.testing.assert_close(out[key].values(), w[kjt[key].values()])
    order = list(reversed(range(len(kjt.keys()))))
    permuted = kjt.permute(order)
    assert permuted.keys() == [kjt.keys()[i] for i in order]
    for key in kjt.keys():
        assert torch.equal(permuted[key].values(), kjt[key].values())
    first, rest = kjt.split([1, len(kjt.keys()) - 1])
    assert first.keys() == kjt.keys()[:1] and torch.equal(first[kjt.keys()[0]].values(), kjt[kjt.keys()[0]].values())
    assert rest.keys() == kjt.keys()[1:]


@pytest.mark.parametrize(
    "optimizer, kwargs",
    [(torch.optim.SGD, {"lr": 0.3}), (torch.optim.Adagrad, {"lr": 0.2, "eps": 1e-3})],
    ids=["sgd", "adagrad"],
)
@settings(max_examples=4)
@given(case=tables_and_batches(n_batches=3))
def test_fused_embedding_bag_collection_trains_like_its_reference(optimizer, kwargs, case):
    tables, batches = case
    ebc = EmbeddingBagCollection(tables=tables)
    fused = FusedEmbeddingBagCollection(
        tables=tables, optimizer_type=optimizer, optimizer_kwargs=dict(kwargs), device=torch.device("cpu")
    )
    fused.load_state_dict(ebc.state_dict())
    reference = optimizer(ebc.parameters(), **kwargs)
    g = torch.Generator().manual_seed(0)
    for kjt in batches:
        got, want = fused(kjt).values(), ebc(kjt).values()
        torch.testing.assert_close(got, want)
        grad = torch.randn(want.shape, generator=g)
        (got * grad).sum().backward()
        reference.zero_grad()
        (want * grad).sum().backward()
        reference.step()
    for name, value in fused.state_dict().items():
        torch.testing.assert_close(value, ebc.state_dict()[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("dtype, bits", [(torch.qint8, 8), (torch.quint4x2, 4), (torch.float16, 16)])
@settings(max_examples=3)
@given(case=tables_and_batches())
def test_quant_embedding_bag_collection_is_within_its_quantization_error(dtype, bits, case):
    """TorchRec's QuantEmbeddingBagCollection (on the stand-in's IntNBitTableBatchedEmbeddingBagsCodegen)
    from a float EBC: each pooled value within (rows in the bag) x (one quantization step of its table)."""
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    tables, (kjt,) = case
    per = {8: 2, 4: 4, 16: 1}[bits]  # fbgemm's row codecs take D a multiple of 2 (int8), 4 (int4)
    tables = [t.__class__(**{**t.__dict__, "embedding_dim": per * t.embedding_dim}) for t in tables]
    ebc = EmbeddingBagCollection(tables=tables)
    observer = torch.ao.quantization.PlaceholderObserver
    ebc.qconfig = torch.ao.quantization.QConfig(
        activation=observer.with_args(dtype=torch.float), weight=observer.with_args(dtype=dtype)
    )
    quantized = QuantEBC.from_float(ebc)
    got, want = quantized(kjt), ebc(kjt)
    assert got.keys() == want.keys()
    for config, bag in zip(ebc.embedding_bag_configs(), ebc.embedding_bags.values()):
        w = bag.weight.detach()
        step = (w.max() - w.min()).item() / (2**bits - 1) if bits < 16 else w.abs().max().item() * 2**-10
        for f in config.feature_names:
            longest = int(kjt[f].lengths().max()) if kjt[f].lengths().numel() else 0
            err = (got[f].float() - want[f]).abs().max().item() if got[f].numel() else 0.0
            assert err <= longest * (step + 1e-3 * w.abs().max().item()) + 1e-6, (f, err, step)


@settings(max_examples=5)
@given(case=tables_and_batches())
def test_dense_tbe_gradient_is_the_embedding_bag_gradient(case):
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    tables, (kjt,) = case
    tbe = DenseTableBatchedEmbeddingBagsCodegen(
        [(t.num_embeddings, t.embedding_dim) for t in tables],
        feature_table_map=[i for i, t in enumerate(tables) for _ in t.feature_names],
        use_cpu=True,
    )
    out = tbe(kjt.values(), kjt.offsets())
    grad = torch.randn(out.shape)
    (out * grad).sum().backward()
    weights = [w.detach().clone().requires_grad_() for w in tbe.split_embedding_weights()]
    columns = []
    for t, table in enumerate(tables):
        for key in table.feature_names:
            jt = kjt[key]
            columns.append(torch.nn.functional.embedding_bag(jt.values(), weights[t], jt.offsets()[:-1], mode="sum"))
    want = torch.cat(columns, dim=1)
    torch.testing.assert_close(out, want)
    (want * grad).sum().backward()
    for w, mine in zip(weights, torch.split(tbe.weights.grad, [t.num_embeddings * t.embedding_dim for t in tables])):
        torch.testing.assert_close(mine.view_as(w), w.grad)
