"""An id outside its table, given to TorchRec's modules on embnum's fbgemm_gpu stand-in (fbgemm_gpu
absent): the ``IndexError`` names the feature, the table and the sample in the user's terms
(the names TorchRec hands the stand-in where it hands them), with the op's own error as its cause.

* ``FusedEmbeddingBagCollection`` (TorchRec's unsharded fused collection; it passes no table
  names, so the table is its position in the TBE) with ``bounds_check_mode=FATAL`` in its
  ``optimizer_kwargs``;
* ``BatchedFusedEmbeddingBag``, the fused kernel a sharded collection runs on each rank (TorchRec
  passes ``table_names``), with ``FATAL`` in its fused parameters;
* ``QuantBatchedEmbeddingBag``, the quantized kernel of a sharded inference model (TorchRec passes
  the table names in ``embedding_specs`` and each table's keys in ``feature_names_per_table``).
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
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode  # noqa: E402
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbeddingBag  # noqa: E402
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, GroupedEmbeddingConfig  # noqa: E402
from torchrec.distributed.quant_embedding_kernel import QuantBatchedEmbeddingBag  # noqa: E402
from torchrec.modules.embedding_configs import DataType, PoolingType  # noqa: E402
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from torchrec_tables import one_rank_table  # noqa: E402

KEYS_PER_TABLE = [["a"], ["b", "c"]]  # table t1 is read by two keys: feature 2 is key 'c' of table 1
TABLE_OF = [0, 1, 1]
FATAL = BoundsCheckMode.FATAL


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    """TorchRec's fused kernel builds its optimizer over a process group: one gloo process."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        yield
        dist.destroy_process_group()


def _collection(rows):
    tables = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=4, num_embeddings=r, feature_names=keys)
        for t, (r, keys) in enumerate(zip(rows, KEYS_PER_TABLE))
    ]
    return FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=torch.optim.SGD,
        optimizer_kwargs={"lr": 0.1, "bounds_check_mode": FATAL},
        device=torch.device("cpu"),
    )


def _kernel(rows, quantized):
    kind = EmbeddingComputeKernel.QUANT if quantized else EmbeddingComputeKernel.FUSED
    data_type = DataType.INT8 if quantized else DataType.FP32
    tables = [
        one_rank_table(f"t{t}", r, 4, keys, kind, data_type) for t, (r, keys) in enumerate(zip(rows, KEYS_PER_TABLE))
    ]
    fused = {"bounds_check_mode": FATAL}
    if not quantized:
        fused.update(optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1)
    config = GroupedEmbeddingConfig(
        data_type=data_type,
        pooling=PoolingType.SUM,
        is_weighted=False,
        has_feature_processor=False,
        compute_kernel=kind,
        embedding_tables=tables,
        fused_params=None if quantized else fused,
    )
    if not quantized:
        return BatchedFusedEmbeddingBag(config, device=torch.device("cpu"))
    kernel = QuantBatchedEmbeddingBag(config, device=torch.device("cpu"), fused_params=fused)
    kernel._emb_module.initialize_weights()  # what TorchRec's sharded quant collection does before use
    return kernel


@st.composite
def bad_batches(draw):
    """Rows per table, a batch of 1..3 samples per key with bags of 0..3 valid ids, then one id
    replaced by one outside its table (negatives below -1: -1 is a pruned row to the quantized lookup)."""
    rows = draw(st.lists(st.integers(1, 9), min_size=2, max_size=2))
    B = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 3), min_size=3 * B, max_size=3 * B).filter(any))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    values = np.concatenate([rng.integers(0, rows[TABLE_OF[bag // B]], n) for bag, n in enumerate(lengths)])
    pos = draw(st.integers(0, len(values) - 1))
    bag = int(np.searchsorted(np.cumsum(lengths), pos, side="right"))
    f = bag // B
    values[pos] = draw(st.sampled_from([rows[TABLE_OF[f]], rows[TABLE_OF[f]] + 7, -2, 2**31 - 1]))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor(lengths)
    )
    return rows, kjt, {"pos": pos, "bag": bag, "f": f, "sample": bag % B, "value": int(values[pos])}


def _check(info, want, bad):
    assert str(info.value) == want
    cause = info.value.__cause__  # the op's error in the TBE's own terms
    assert isinstance(cause, IndexError)
    assert str(cause).startswith(f"indices[{bad['pos']}] = {bad['value']} in the bag of feature {bad['f']}, ")


@settings(max_examples=8, deadline=None)
@given(bad_batches())
def test_fused_collection_names_feature_table_and_sample(case):
    rows, kjt, bad = case
    f, t = bad["f"], TABLE_OF[bad["f"]]
    with pytest.raises(IndexError) as info:
        _collection(rows)(kjt)
    want = f"indices: feature {f} (table {t}): id {bad['value']} at sample {bad['sample']} is outside [0, {rows[t]})"
    _check(info, f"{want} (bag {bad['bag']})", bad)


@settings(max_examples=8, deadline=None)
@given(bad_batches())
def test_sharded_fused_kernel_names_the_table(case):
    rows, kjt, bad = case
    f, t = bad["f"], TABLE_OF[bad["f"]]
    with pytest.raises(IndexError) as info:
        _kernel(rows, quantized=False)(kjt)
    want = f"indices: feature {f} (table 't{t}'): id {bad['value']} at sample {bad['sample']} is outside [0, {rows[t]})"
    _check(info, f"{want} (bag {bad['bag']}, table {t})", bad)


@settings(max_examples=8, deadline=None)
@given(bad_batches())
def test_quantized_kernel_names_the_key_and_the_table(case):
    rows, kjt, bad = case
    f, t = bad["f"], TABLE_OF[bad["f"]]
    key = ["a", "b", "c"][f]
    with pytest.raises(IndexError) as info:
        _kernel(rows, quantized=True)(kjt)
    at = f"id {bad['value']} at sample {bad['sample']}"
    want = f"indices: feature {key!r} (table 't{t}'): {at} is outside [0, {rows[t]})"
    _check(info, f"{want} (bag {bad['bag']}, feature {f}, table {t})", bad)
