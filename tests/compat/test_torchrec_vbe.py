"""TorchRec's variable batch per feature (VBE) on embnum's fbgemm_gpu stand-in (fbgemm_gpu absent).

A ``KeyedJaggedTensor`` with ``stride_per_key_per_rank`` goes through TorchRec's own sharded
lookup kernels, ``BatchedFusedEmbeddingBag`` (the stand-in's ``SplitTableBatchedEmbeddingBagsCodegen``,
fused EXACT_SGD) and ``BatchedDenseEmbeddingBag`` (the stand-in's ``DenseTableBatchedEmbeddingBagsCodegen``),
which pass ``kjt.stride_per_key_per_rank()`` as ``batch_size_per_feature_per_rank``. Their flat output
must be TorchRec's VBE layout (rank-major, then key, then sample) of per-bag row sums computed here
from the weights, and one step must move exactly the looked-up rows by the matching gradient slices.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embnum import fbgemm_compat

if fbgemm_compat.status()["real_fbgemm_gpu"] is not None:
    pytest.skip("a real fbgemm_gpu is importable: the stand-in tier runs without it", allow_module_level=True)
torch = pytest.importorskip("torch")
fbgemm_compat.install()
pytest.importorskip("torchrec")

import torch.distributed as dist  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from torchrec import KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.batched_embedding_kernel import (  # noqa: E402
    BatchedDenseEmbeddingBag,
    BatchedFusedEmbeddingBag,
)
from torchrec.distributed.embedding_types import (  # noqa: E402
    EmbeddingComputeKernel,
    GroupedEmbeddingConfig,
)
from torchrec.modules.embedding_configs import DataType, PoolingType  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from torchrec_tables import one_rank_table  # noqa: E402

LR = 0.5


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    """TorchRec's fused kernel builds its optimizer over a process group: one gloo process."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        yield
        dist.destroy_process_group()


def _kernel(fused, rows, dims, keys_per_table, pooling):
    kind = EmbeddingComputeKernel.FUSED if fused else EmbeddingComputeKernel.DENSE
    tables = [one_rank_table(f"t{i}", r, d, ks, kind) for i, (r, d, ks) in enumerate(zip(rows, dims, keys_per_table))]
    config = GroupedEmbeddingConfig(
        data_type=DataType.FP32,
        pooling=pooling,
        is_weighted=False,
        has_feature_processor=False,
        compute_kernel=kind,
        embedding_tables=tables,
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR} if fused else None,
    )
    cls = BatchedFusedEmbeddingBag if fused else BatchedDenseEmbeddingBag
    return cls(config, device=torch.device("cpu"))


@st.composite
def vbe_cases(draw):
    """Two tables (dims 4 or 8: TorchRec's kernels want multiples of 4), the second read by two
    keys; per key and rank (1-3 ranks) a batch of 0..3 samples; bags of 0..3 ids."""
    rows = draw(st.lists(st.integers(1, 6), min_size=2, max_size=2))
    dims = draw(st.lists(st.sampled_from([4, 8]), min_size=2, max_size=2))
    keys_per_table = [["f0"], ["f1", "f2"]]
    R = draw(st.integers(1, 3))
    sizes = [draw(st.lists(st.integers(0, 3), min_size=R, max_size=R)) for _ in range(3)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    table_of = [0, 1, 1]
    lengths = rng.integers(0, 4, sum(map(sum, sizes)))
    key_of_bag = np.repeat(np.arange(3), [sum(s) for s in sizes])
    ids = [rng.integers(0, rows[table_of[k]], n) for k, n in zip(key_of_bag, lengths)]
    weights = [rng.uniform(-1, 1, (r, d)).round(3) for r, d in zip(rows, dims)]
    return {
        "rows": rows,
        "dims": dims,
        "keys_per_table": keys_per_table,
        "table_of": table_of,
        "sizes": sizes,
        "lengths": lengths,
        "ids": ids,
        "weights": weights,
        "pooling": draw(st.sampled_from([PoolingType.SUM, PoolingType.MEAN])),
    }


def _blocks(case):
    """``(key, bag ids, table)`` of the flat output's rows in TorchRec's VBE order: rank, key, sample."""
    starts = np.concatenate([[0], np.cumsum([sum(s) for s in case["sizes"]])])
    R = len(case["sizes"][0])
    for r in range(R):
        for k, per_rank in enumerate(case["sizes"]):
            first = int(starts[k]) + sum(per_rank[:r])
            for b in range(first, first + per_rank[r]):
                yield k, case["ids"][b], case["table_of"][k]


def _reference(case):
    out = []
    for _, ids, t in _blocks(case):
        rows = case["weights"][t][ids]
        pooled = rows.sum(0) if len(ids) else np.zeros(case["dims"][t])
        if case["pooling"] == PoolingType.MEAN and len(ids):
            pooled = pooled / len(ids)
        out.append(pooled)
    return np.concatenate(out) if out else np.zeros(0)


def _reference_grad(case, g):
    grads = [np.zeros_like(w) for w in case["weights"]]
    at = 0
    for _, ids, t in _blocks(case):
        D = case["dims"][t]
        piece = g[at : at + D] / (len(ids) if case["pooling"] == PoolingType.MEAN and len(ids) else 1)
        for i in ids:
            grads[t][i] += piece
        at += D
    return grads


def _kjt(case):
    values = np.concatenate([*case["ids"], np.zeros(0, np.int64)]).astype(np.int64)
    return KeyedJaggedTensor(
        keys=["f0", "f1", "f2"],
        values=torch.from_numpy(values),
        lengths=torch.from_numpy(case["lengths"].astype(np.int64)),
        stride_per_key_per_rank=case["sizes"],
    )


@settings(max_examples=8, deadline=None)
@given(case=vbe_cases(), fused=st.booleans())
def test_torchrec_vbe_lookup_and_step_match_the_per_bag_reference(case, fused):
    kernel = _kernel(fused, case["rows"], case["dims"], case["keys_per_table"], case["pooling"])
    with torch.no_grad():
        for w, init in zip(kernel.split_embedding_weights(), case["weights"]):
            w.copy_(torch.from_numpy(init).float())
    kjt = _kjt(case)
    assert kjt.variable_stride_per_key()
    out = kernel(kjt)
    want = _reference(case)
    assert tuple(out.shape) == want.shape
    torch.testing.assert_close(out.detach().double(), torch.from_numpy(want), rtol=1e-5, atol=1e-5)
    g = np.random.default_rng(len(want)).uniform(-1, 1, len(want)).round(3)
    (out * torch.from_numpy(g).float()).sum().backward()
    grads = _reference_grad(case, g)
    if fused:  # EXACT_SGD fused into backward: each looked-up row moves by lr times its summed gradient
        got = [w.detach().double() for w in kernel.split_embedding_weights()]
        for t, (w0, grad, w) in enumerate(zip(case["weights"], grads, got)):
            torch.testing.assert_close(w, torch.from_numpy(w0 - LR * grad), rtol=1e-5, atol=1e-5, msg=f"table {t}")
    else:  # the dense kernel's flat parameter receives the dense gradient
        flat = kernel.emb_module.weights.grad.double()
        torch.testing.assert_close(
            flat, torch.from_numpy(np.concatenate([x.ravel() for x in grads])), rtol=1e-5, atol=1e-5
        )
