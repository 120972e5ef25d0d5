"""Sharded embedding-bag collections over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

* :class:`ShardedEmbeddingBagCollection`: the single-process EBC's forward with its tables
  sharded table-, row-, column-, table-row-wise or replicated (data-parallel);
* :func:`plan_tables` / :class:`ShardingPlan` / :class:`ParameterSharding`: plans;
* :mod:`.comm`: the collectives (all-to-all, reduce-scatter, all-reduce) with autograd and codecs;
* :func:`spawn`: local process groups (tests, the example, the benchmark);
* :mod:`.checkpoint`: one file per rank (``torch.load(weights_only=True)``), checksummed, loaded
  under any plan and world size;
* :mod:`.agree`: the ranks' agreement on settings (construction) and on each batch's validity.

This package and :mod:`embnum.torch_bridge` are the only parts of embnum that import torch.
"""

from . import checkpoint
from .comm import QCommsConfig, all_reduce, all_reduce_gradients, all_to_all, reduce_scatter
from .embeddingbag import LoadReport, ShardedEmbeddingBagCollection, TableShards, merge_state_dicts
from .launch import RankFailedError, SpawnError, spawn
from .plan import (
    COLUMN_WISE,
    DATA_PARALLEL,
    ROW_WISE,
    SHARDING_TYPES,
    TABLE_ROW_WISE,
    TABLE_WISE,
    ParameterSharding,
    ShardingPlan,
    plan_tables,
)

__all__ = [
    "COLUMN_WISE",
    "DATA_PARALLEL",
    "LoadReport",
    "ROW_WISE",
    "SHARDING_TYPES",
    "TABLE_ROW_WISE",
    "TABLE_WISE",
    "ParameterSharding",
    "QCommsConfig",
    "RankFailedError",
    "ShardedEmbeddingBagCollection",
    "ShardingPlan",
    "SpawnError",
    "TableShards",
    "all_reduce",
    "all_reduce_gradients",
    "all_to_all",
    "checkpoint",
    "merge_state_dicts",
    "plan_tables",
    "reduce_scatter",
    "spawn",
]
