"""The quantized TBE lookup against fbgemm_gpu's inference TBE module on CPU (optional tier:
``pytest -m fbgemm``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum
from tables.tbe_quantized import TYPES

torch = pytest.importorskip("torch")


@pytest.mark.fbgemm
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_fbgemm_int_nbit_module(data):
    """tbe_pack_quantized fills fbgemm's IntNBitTableBatchedEmbeddingBagsCodegen byte for byte
    (same table offsets), and its forward equals tbe_forward_quantized."""
    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    except Exception:  # noqa: BLE001
        pytest.skip("fbgemm_gpu is not importable")
    draw = data.draw
    T = draw(st.integers(1, 3))
    tys = [draw(st.sampled_from(TYPES)) for _ in range(T)]
    dims = [8 * draw(st.integers(1, 3)) for _ in range(T)]  # the module needs D % 4 == 0 (and int2: 8)
    rows = [draw(st.integers(1, 6)) for _ in range(T)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tables = [rng.standard_normal((r, d)).astype(np.float32) for r, d in zip(rows, dims)]
    kinds = {
        "fp32": SparseType.FP32,
        "fp16": SparseType.FP16,
        "int8": SparseType.INT8,
        "int4": SparseType.INT4,
        "int2": SparseType.INT2,
    }
    pooling = draw(st.sampled_from(["sum", "mean"]))
    module = IntNBitTableBatchedEmbeddingBagsCodegen(
        [("", r, d, kinds[t], EmbeddingLocation.HOST) for r, d, t in zip(rows, dims, tys)],
        device="cpu",
        pooling_mode=PoolingMode.SUM if pooling == "sum" else PoolingMode.MEAN,
        output_dtype=SparseType.FP32,
        cacheline_alignment=False,
    )
    module.fill_random_weights()  # allocates the module's buffers (overwritten below)
    weights, woffs = embnum.tbe_pack_quantized(tables, tys, row_alignment=module.row_alignment)
    assert woffs.tolist() == module.weights_offsets.tolist() and weights.size == module.weights_host.numel()
    module.weights_host.copy_(torch.from_numpy(weights))
    B = draw(st.integers(1, 3))
    lengths = rng.integers(0, 4, T * B)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate([rng.integers(-1, rows[t], int(lengths[t * B : (t + 1) * B].sum())) for t in range(T)])
    psw = rng.standard_normal(len(indices)).astype(np.float32) if draw(st.booleans()) else None
    want = module(
        torch.from_numpy(indices.astype(np.int32)),
        torch.from_numpy(offsets.astype(np.int32)),
        None if psw is None else torch.from_numpy(psw),
    ).numpy()
    args = dict(
        weights=weights,
        weights_offsets=woffs,
        weights_tys=tys,
        D_offsets=np.concatenate([[0], np.cumsum(dims)]),
        rows_per_table=np.array(rows),
        indices=indices,
        offsets=offsets,
        pooling_mode=pooling,
        per_sample_weights=psw,
    )
    got = embnum.tbe_forward_quantized(**args)
    err, ok = embnum.get_op("tbe_forward_quantized").check_fn(got, want.astype(np.float32), args)
    assert ok, err
