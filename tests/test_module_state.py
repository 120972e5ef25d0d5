"""Checkpoints of the torch modules: ``load_state_dict`` checks every entry before copying any
(``docs/containers.md``, "At the edges"), and ``assign=True`` reaches the lookups."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import embnum  # noqa: E402
from embnum.modules import TBE, EmbeddingBagCollection, EmbeddingBagConfig, FusedTBE  # noqa: E402

KJT = embnum.KeyedJaggedTensor


def _ebc(kind="rowwise_adagrad", **kw):
    tables = [
        EmbeddingBagConfig(5, 3, "t0", feature_names=["f0", "f1"]),
        EmbeddingBagConfig(4, 2, "t1", feature_names=["f2"], pooling="mean"),
        EmbeddingBagConfig(3, 1, "t2", feature_names=["f3"]),  # shares t0's TBE call (and step)
    ]
    opt = None if kind is None else embnum.TBEOptimizer(kind, 0.1, **kw)
    return EmbeddingBagCollection(tables, optimizer=opt, seed=0)


def _features():
    return KJT.from_lengths_sync(
        ["f0", "f1", "f2", "f3"],
        torch.tensor([0, 4, 2, 1, 3, 3, 2]),
        torch.tensor([2, 0, 1, 1, 0, 2, 0, 1], dtype=torch.int32),
    )


def _pooled(weights, features):
    """The EBC's output from its tables' weights, in float64 (sum for t0's features, mean for t1's)."""
    cols = []
    for f, (t, mean) in {"f0": ("t0", False), "f1": ("t0", False), "f2": ("t1", True), "f3": ("t2", False)}.items():
        w = weights[t].double()
        bags = []
        jt = features[f]
        for ids in jt.to_dense():
            row = w[ids].sum(0) if len(ids) else torch.zeros(w.shape[1], dtype=torch.float64)
            bags.append(row / len(ids) if mean and len(ids) else row)
        cols.append(torch.stack(bags))
    return torch.cat(cols, dim=1)


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", [None, "sgd", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("assign", [False, True])
def test_ebc_load_reaches_the_lookup(kind, assign):
    """A loaded checkpoint is what forward reads, with assign=True as with assign=False."""
    ebc = _ebc(kind)
    sd = {k: v.clone() for k, v in ebc.state_dict().items()}
    new = {"t0": torch.arange(15.0).view(5, 3), "t1": -torch.arange(8.0).view(4, 2), "t2": torch.ones(3, 1) / 3}
    for t, w in new.items():
        sd[f"embedding_bags.{t}.weight"] = w.clone()
    ebc.load_state_dict(sd, assign=assign)
    got = ebc(_features()).values().detach().double()
    torch.testing.assert_close(got, _pooled(new, _features()), rtol=1e-6, atol=1e-6)
    assert all(torch.equal(ebc.state_dict()[f"embedding_bags.{t}.weight"], new[t]) for t in new)


BAD_ENTRIES = [
    # (optimizer kind, key, value, error, words)
    ("rowwise_adagrad", "embedding_bags.t0.momentum1", lambda v: v - 5.0, ValueError, ">= 0"),
    ("adagrad", "embedding_bags.t1.momentum1", lambda v: v - 5.0, ValueError, ">= 0"),
    ("adam", "embedding_bags.t0.momentum2", lambda v: v - 5.0, ValueError, ">= 0"),
    ("adam", "embedding_bags.t0.step", lambda v: v - 5, ValueError, "step"),
    ("adam", "embedding_bags.t0.step", lambda v: v + 2**63 - 1, ValueError, "step"),
    ("adam", "embedding_bags.t0.step", lambda v: v.double(), TypeError, "integer"),
    ("adam", "embedding_bags.t0.step", lambda v: v + 3, ValueError, "share one TBE call"),
    ("adam", "embedding_bags.t0.momentum1", lambda v: v + float("nan"), ValueError, "finite"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v * float("inf"), ValueError, "finite"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v.double() * 1e39, ValueError, "finite"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v[:3], ValueError, "shape"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v.reshape(-1), ValueError, "shape"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v.to(torch.int64), TypeError, "floating"),
    ("sgd", "embedding_bags.t0.weight", lambda v: v.numpy(), TypeError, "torch.Tensor"),
    (None, "embedding_bags.t1.weight", lambda v: v.bool(), TypeError, "floating"),
]


@pytest.mark.parametrize(
    "case", BAD_ENTRIES, ids=[f"{c[0]}-{c[1].split('.', 1)[1]}-{i}" for i, c in enumerate(BAD_ENTRIES)]
)
@pytest.mark.parametrize("assign", [False, True])
def test_ebc_load_rejects_out_of_domain_state(case, assign):
    """Every bad entry is an error naming it, and nothing of the checkpoint is copied."""
    kind, key, change, exc, words = case
    ebc = _ebc(kind)
    before = _snapshot(ebc)
    sd = {k: v.clone() + (1 if v.dtype.is_floating_point else 0) for k, v in ebc.state_dict().items()}
    sd[key] = change(sd[key])
    with pytest.raises(exc, match=words) as info:
        ebc.load_state_dict(sd, assign=assign)
    assert key.split(".")[1] in str(info.value) or "tables" in str(info.value)
    assert _same(_snapshot(ebc), before)


def test_ebc_strict_keys_are_a_clean_error_before_any_copy():
    ebc = _ebc("adam")
    before = _snapshot(ebc)
    sd = {k: v + 1 for k, v in ebc.state_dict().items()}
    del sd["embedding_bags.t1.momentum2"]
    with pytest.raises(ValueError, match="missing keys") as info:
        ebc.load_state_dict(sd)
    assert isinstance(info.value, RuntimeError)  # torch's type for load errors, still caught as such
    assert _same(_snapshot(ebc), before)
    ebc.load_state_dict(sd, strict=False)
    assert torch.equal(ebc.state_dict()["embedding_bags.t0.weight"], sd["embedding_bags.t0.weight"])


@pytest.mark.parametrize("module", ["TBE", "FusedTBE"])
@pytest.mark.parametrize("assign", [False, True])
def test_tbe_modules_check_their_checkpoints(module, assign):
    def make():
        if module == "TBE":
            return TBE([4, 3], [2, 2])
        return FusedTBE([4, 3], [2, 2], optimizer=embnum.TBEOptimizer("rowwise_adagrad", 0.1))

    m = make()
    before = _snapshot(m)
    bad = {"weights_offsets": lambda v: v + 1, "weights": lambda v: v * float("nan")}
    if module == "FusedTBE":
        bad.update(momentum1=lambda v: v - 1, iter=lambda v: v - 1)
    for name, change in bad.items():
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        sd[name] = change(sd[name])
        with pytest.raises(ValueError, match=name):
            m.load_state_dict(sd, assign=assign)
        assert _same(_snapshot(m), before)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["weights"] = torch.arange(14, dtype=torch.float32)
    m.load_state_dict(sd, assign=assign)
    out = m(torch.tensor([1, 0]), torch.tensor([0, 1, 2]))
    assert out.tolist() == [[2.0, 3.0, 8.0, 9.0]]


def test_fused_tbe_rejected_update_leaves_the_step():
    m = FusedTBE([4], [2], optimizer=embnum.TBEOptimizer("adam", 0.1))
    with pytest.raises(IndexError):
        m.apply_gradient(torch.ones(1, 2), torch.tensor([9]), torch.tensor([0, 1]))
    assert m.step == 0
    m.apply_gradient(torch.ones(1, 2), torch.tensor([1]), torch.tensor([0, 1]))
    assert m.step == 1


@pytest.mark.parametrize("kind", ["adagrad", "rowwise_adagrad", "adam"])
def test_fused_tbe_state_starts_on_a_cache_line(kind):
    """The weights and the row state start on 64-byte lines (NumPy's large arrays start 16 bytes
    past one, torch's do not ask for huge pages), so a row of 128 float32 spans 8 lines, not 9;
    the state starts at zero and stays float32 whatever torch's default dtype."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        m = FusedTBE([3000, 1000], [128, 64], optimizer=embnum.TBEOptimizer(kind, 0.1))
    finally:
        torch.set_default_dtype(before)
    states = [m.momentum1] + ([] if m.momentum2 is None else [m.momentum2])
    for t in [m.weights, *states]:
        assert t.data_ptr() % 64 == 0 and t.dtype == torch.float32
    assert all(bool((s == 0).all()) for s in states)
    assert m.weights.shape == (3000 * 128 + 1000 * 64,) and bool(m.weights.abs().max() > 0)
