"""TorchRec's table description for its own lookup kernels on one rank (``ShardedEmbeddingTable``
with whole-table shard metadata, which TorchRec's fused kernel reads to build its optimizer).
Imported by the compat tests after ``fbgemm_compat.install()``."""

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torchrec.distributed.embedding_types import ShardedEmbeddingTable
from torchrec.modules.embedding_configs import DataType


def one_rank_table(name, rows, dim, keys, kernel, data_type=DataType.FP32):
    """Table ``name`` (``rows`` x ``dim``, read by ``keys``), all of it on rank 0, for ``kernel``."""
    shard = ShardMetadata(shard_offsets=[0, 0], shard_sizes=[rows, dim], placement="rank:0/cpu")
    meta = ShardedTensorMetadata(
        shards_metadata=[shard], size=torch.Size([rows, dim]), tensor_properties=TensorProperties(dtype=torch.float32)
    )
    return ShardedEmbeddingTable(
        num_embeddings=rows,
        embedding_dim=dim,
        name=name,
        feature_names=keys,
        local_rows=rows,
        local_cols=dim,
        compute_kernel=kernel,
        data_type=data_type,
        local_metadata=shard,
        global_metadata=meta,
    )
