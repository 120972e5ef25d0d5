"""The stand-in's SplitTableBatchedEmbeddingBagsCodegen for every optimizer embnum has, against
embnum's own FusedTBE given the TBEOptimizer that fbgemm's arguments mean (kind, hyper-parameters,
weight-decay mode): three steps, outputs, weights and the states fbgemm names. fbgemm's CPU build
trains only three of these optimizers (tests/test_fbgemm_compat.py compares those with fbgemm).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnum import TBEOptimizer, fbgemm_compat

if fbgemm_compat.status()["real_fbgemm_gpu"] is not None:
    pytest.skip("a real fbgemm_gpu is importable: the stand-in tier runs without it", allow_module_level=True)
torch = pytest.importorskip("torch")

from embnum.fbgemm_compat.configs import (  # noqa: E402
    ComputeDevice,
    EmbeddingLocation,
    EmbOptimType,
    PoolingMode,
    WeightDecayMode,
)
from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: E402
from embnum.modules import FusedTBE  # noqa: E402

# fbgemm optimizer, its arguments -> the TBEOptimizer they mean
CASES = {
    "adam": (
        EmbOptimType.ADAM,
        {"weight_decay": 0.01},
        dict(kind="adam", weight_decay=0.01, weight_decay_mode="decoupled"),
    ),
    "lamb": (EmbOptimType.LAMB, {}, dict(kind="lamb")),
    "partial_rowwise_adam": (
        EmbOptimType.PARTIAL_ROWWISE_ADAM,
        {"beta1": 0.8},
        dict(kind="partial_rowwise_adam", beta1=0.8),
    ),
    "partial_rowwise_lamb": (EmbOptimType.PARTIAL_ROWWISE_LAMB, {}, dict(kind="partial_rowwise_lamb")),
    "lars_sgd": (
        EmbOptimType.LARS_SGD,
        {"weight_decay": 0.01},
        dict(kind="lars_sgd", weight_decay=0.01, weight_decay_mode="l2"),
    ),
    "rowwise_adagrad_l2": (
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        {"weight_decay": 0.05, "weight_decay_mode": WeightDecayMode.L2, "gradient_clipping": True, "max_gradient": 0.5},
        dict(kind="rowwise_adagrad", weight_decay=0.05, weight_decay_mode="l2", max_gradient=0.5),
    ),
    "adagrad_max_norm": (EmbOptimType.EXACT_ADAGRAD, {"max_norm": 0.7}, dict(kind="adagrad", max_norm=0.7)),
    "sgd": (EmbOptimType.EXACT_SGD, {}, dict(kind="sgd")),
}


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=3)
@given(seed=st.integers(0, 2**31 - 1), pooling=st.sampled_from(["sum", "mean"]), lr=st.sampled_from([0.01, 0.2]))
def test_every_optimizer_matches_fused_tbe(name, seed, pooling, lr):
    optimizer, extra, meaning = CASES[name]
    rng = np.random.default_rng(seed)
    rows, dims, ftm = [7, 3], [4, 8], [0, 1, 1]
    hyper = {"learning_rate": lr, "eps": 1e-4, **extra}
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(rows, dims)],
        feature_table_map=ftm,
        optimizer=optimizer,
        pooling_mode=PoolingMode[pooling.upper()],
        **hyper,
    )
    want_opt = TBEOptimizer(learning_rate=lr, eps=1e-4, **meaning)
    assert tbe.optimizer_args == want_opt
    ref = FusedTBE(rows, dims, ftm, optimizer=want_opt, pooling_mode=pooling)
    start = torch.from_numpy(rng.uniform(-1, 1, sum(r * d for r, d in zip(rows, dims))).astype(np.float32))
    with torch.no_grad():
        tbe.weights.copy_(start)
        ref.weights.copy_(start)
    B = 3
    for _ in range(3):
        lengths = rng.integers(0, 4, len(ftm) * B)
        indices = torch.from_numpy(
            np.concatenate([rng.integers(0, rows[t], n) for t, n in zip(np.repeat(ftm, B), lengths)] + [[]]).astype(
                np.int64
            )
        )
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        got, want = tbe(indices, offsets), ref(indices, offsets)
        torch.testing.assert_close(got, want)
        grad = torch.from_numpy(rng.uniform(-1, 1, got.shape).astype(np.float32))
        (got * grad).sum().backward()
        (want * grad).sum().backward()
    torch.testing.assert_close(tbe.weights.detach(), ref.weights.detach())
    states = tbe.split_optimizer_states()
    for i, state in enumerate(want_opt.states):
        flat = getattr(ref, state)
        got_flat = torch.cat([s[i].reshape(-1) for s in states])
        torch.testing.assert_close(got_flat, flat)
    assert int(tbe.iter[0]) == ref.step == 3


def test_state_dict_resumes_training_exactly():
    """Weights, optimizer state and the step counter are in ``state_dict()``: a module restored from
    one trains on exactly as the saved one does (Adam: its bias correction reads the step)."""
    specs = [(9, 4, EmbeddingLocation.HOST, ComputeDevice.CPU), (5, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)]

    def build():
        return SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.ADAM, learning_rate=0.1)

    g = torch.Generator().manual_seed(3)
    indices, offsets = torch.randint(0, 5, (8,), generator=g), torch.tensor([0, 2, 4, 6, 8])
    first = build()
    with torch.no_grad():
        first.weights.copy_(torch.rand(first.weights.shape, generator=g))
    for _ in range(2):
        first(indices, offsets).sum().backward()
    second = build()
    second.load_state_dict(first.state_dict())
    for tbe in (first, second):
        (tbe(indices, offsets) * 2).sum().backward()
    assert int(second.iter[0]) == 3
    assert torch.equal(first.weights, second.weights)
    for a, b in zip(first.split_optimizer_states(), second.split_optimizer_states()):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
