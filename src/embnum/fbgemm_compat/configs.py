"""Stand-ins for fbgemm_gpu's configuration types: optimizer and storage types, table placement,
pooling, bounds checking and cache settings (fbgemm_gpu 1.8.0's names, members and values).

Served as ``fbgemm_gpu.split_embedding_configs``, ``fbgemm_gpu.tbe.config(.embedding_config)``,
``fbgemm_gpu.tbe.cache`` and (with :mod:`.unavailable`'s key-value types)
``fbgemm_gpu.split_table_batched_embeddings_ops_common``. Plain data: no operator runs here.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

__all__ = [
    "DEFAULT_SCALE_BIAS_SIZE_IN_BYTES",
    "MAX_PREFETCH_DEPTH",
    "BoundsCheckMode",
    "CacheAlgorithm",
    "CacheState",
    "ComputeDevice",
    "ELEMENT_SIZE",
    "EmbOptimType",
    "EmbeddingLocation",
    "EmbeddingSpecInfo",
    "MultiPassPrefetchConfig",
    "PoolingMode",
    "RecordCacheMetrics",
    "SparseType",
    "SplitState",
    "WeightDecayMode",
    "construct_cache_state",
    "round_up",
    "sparse_type_to_int",
    "tensor_to_device",
]

MAX_PREFETCH_DEPTH = 100
DEFAULT_SCALE_BIAS_SIZE_IN_BYTES = 4  # a float16 scale and a float16 bias ahead of each quantized row


class EmbOptimType(enum.Enum):
    """The optimizer fused into a training TBE's backward pass (fbgemm's values: its ``str()``)."""

    SGD = "sgd"
    EXACT_SGD = "exact_sgd"
    LAMB = "lamb"
    ADAM = "adam"
    EXACT_ADAGRAD = "exact_adagrad"
    EXACT_ROWWISE_ADAGRAD = "exact_row_wise_adagrad"
    LARS_SGD = "lars_sgd"
    PARTIAL_ROWWISE_ADAM = "partial_row_wise_adam"
    PARTIAL_ROWWISE_LAMB = "partial_row_wise_lamb"
    ROWWISE_ADAGRAD = "row_wise_adagrad"
    SHAMPOO = "shampoo"
    SHAMPOO_V2 = "shampoo_v2"
    MADGRAD = "madgrad"
    EXACT_ROWWISE_WEIGHTED_ADAGRAD = "exact_row_wise_weighted_adagrad"
    ENSEMBLE_ROWWISE_ADAGRAD = "ensemble_row_wise_adagrad"
    EMAINPLACE_ROWWISE_ADAGRAD = "ema_in_place_row_wise_adagrad"
    NONE = "none"

    def __str__(self) -> str:
        return self.value

    def state_names(self) -> list[str]:
        """The optimizer states fbgemm's key-value tables keep per row, in their order."""
        return list(self.state_size_table(1))

    def state_size_table(self, D: int) -> dict[str, int]:
        """Elements per row of each state, for rows of width ``D``."""
        return {
            EmbOptimType.EXACT_ROWWISE_ADAGRAD: {"momentum1": 1},
            EmbOptimType.PARTIAL_ROWWISE_ADAM: {"momentum1": D, "momentum2": 1},
            EmbOptimType.ADAM: {"momentum1": D, "momentum2": D},
        }.get(self, {})


# name -> (code, torch dtype of the stored row, bits per element, alignment in elements, is a float)
_SPARSE = {
    "fp32": (0, torch.float32, 32, 1, True),
    "fp16": (1, torch.float16, 16, 2, True),
    "int8": (2, torch.uint8, 8, 4, False),
    "int4": (3, torch.quint4x2, 4, 8, False),
    "int2": (4, torch.quint2x4, 2, 16, False),
    "bf16": (5, torch.bfloat16, 16, 2, True),
    "fp8": (6, torch.uint8, 8, 4, True),
    "mx4": (7, torch.uint8, 4, 8, False),
    "nfp8": (8, torch.float8_e4m3fn, 8, 4, True),
}
# SparseType.from_int's codes differ from as_int's for mx4 and nfp8 (fbgemm's two tables disagree)
_FROM_INT = {0: "fp32", 1: "fp16", 2: "int8", 3: "int4", 4: "int2", 5: "bf16", 6: "fp8", 8: "mx4", 9: "nfp8"}


@enum.unique
class SparseType(enum.Enum):
    """How a table's rows (or a communicated tensor) are stored: float widths and row-wise quantized ints."""

    FP32 = "fp32"
    FP16 = "fp16"
    FP8 = "fp8"
    NFP8 = "nfp8"
    INT8 = "int8"
    INT4 = "int4"
    INT2 = "int2"
    BF16 = "bf16"
    MX4 = "mx4"

    def __str__(self) -> str:
        return self.value

    @staticmethod
    def from_int(ty: int) -> SparseType:
        if ty not in _FROM_INT:
            raise ValueError(f"Unsupported sparse type: {ty}")
        return SparseType(_FROM_INT[ty])

    def as_int(self) -> int:
        return _SPARSE[self.value][0]

    @staticmethod
    def from_dtype(dtype: torch.dtype, is_mx: bool = False) -> SparseType:
        if dtype in (torch.int8, torch.uint8) and not is_mx:
            return SparseType.INT8
        if dtype == torch.uint8:  # with is_mx
            return SparseType.MX4
        if dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            return SparseType.NFP8
        by_dtype = {
            torch.float32: "fp32",
            torch.float16: "fp16",
            torch.bfloat16: "bf16",
            torch.quint4x2: "int4",
            torch.quint2x4: "int2",
        }
        if dtype not in by_dtype:
            raise ValueError(f"Unsupported sparse dtype: {dtype}")
        return SparseType(by_dtype[dtype])

    def as_dtype(self) -> torch.dtype:
        return _SPARSE[self.value][1]

    def bit_rate(self) -> int:
        return _SPARSE[self.value][2]

    def align_size(self) -> int:
        return _SPARSE[self.value][3]

    def is_float(self) -> bool:
        return _SPARSE[self.value][4]


def sparse_type_to_int(sparse_type: SparseType) -> int:
    return sparse_type.as_int()


ELEMENT_SIZE = {
    SparseType.FP32: 4,
    SparseType.FP16: 2,
    SparseType.FP8: 1,
    SparseType.INT8: 1,
    SparseType.BF16: 2,
    SparseType.NFP8: 1,
}


class WeightDecayMode(enum.IntEnum):
    """How a fused optimizer applies ``weight_decay`` (fbgemm's ``tbe.config.optimizer_config``)."""

    NONE = 0
    L2 = 1
    DECOUPLE = 2
    COUNTER = 3
    COWCLIP = 4
    DECOUPLE_GLOBAL = 5


class EmbeddingLocation(enum.IntEnum):
    """Where a table's weights live. embnum's modules hold them in ordinary tensors: ``DEVICE`` and
    ``HOST`` (both mean "the module's device"); ``MANAGED`` (UVM) and ``MANAGED_CACHING`` are refused
    by the modules that would need them."""

    DEVICE = 0
    MANAGED = 1
    MANAGED_CACHING = 2
    HOST = 3
    MTIA = 4

    @classmethod
    def str_values(cls) -> list[str]:
        return [m.name.lower() for m in cls]

    @classmethod
    def from_str(cls, key: str) -> EmbeddingLocation:
        if key not in cls.str_values():
            raise ValueError(f"Cannot parse value into EmbeddingLocation: {key}")
        return cls[key.upper()]


class PoolingMode(enum.IntEnum):
    SUM = 0
    MEAN = 1
    NONE = 2

    def do_pooling(self) -> bool:
        return self is not PoolingMode.NONE

    @classmethod
    def from_str(cls, key: str) -> PoolingMode:
        if key not in ("sum", "mean", "none"):
            raise ValueError(f"Cannot parse value into PoolingMode: {key}")
        return cls[key.upper()]


class BoundsCheckMode(enum.IntEnum):
    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3
    V2_IGNORE = 4
    V2_WARNING = 5
    V2_FATAL = 6


class ComputeDevice(enum.IntEnum):
    CPU = 0
    CUDA = 1
    MTIA = 2


class EmbeddingSpecInfo(enum.IntEnum):
    feature_names = 0
    rows = 1
    dims = 2
    sparse_type = 3
    embedding_location = 4


class RecordCacheMetrics(NamedTuple):
    record_cache_miss_counter: bool
    record_tablewise_cache_miss: bool


class SplitState(NamedTuple):
    dev_size: int
    host_size: int
    uvm_size: int
    placements: list
    offsets: list


def round_up(a: int, b: int) -> int:
    return int((a + b - 1) // b) * b


def tensor_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a meta tensor becomes an uninitialised one of its shape there."""
    if tensor.device == torch.device("meta"):
        return torch.empty_like(tensor, device=device)
    return tensor.to(device)


class CacheAlgorithm(enum.Enum):
    LRU = 0
    LFU = 1


class MultiPassPrefetchConfig(NamedTuple):
    num_passes: int = 12
    min_splitable_pass_size: int = 6 * 1024 * 1024


class CacheState(NamedTuple):
    cache_hash_size_cumsum: list
    cache_index_table_map: list
    total_cache_hash_size: int


def construct_cache_state(row_list, location_list, feature_table_map) -> CacheState:
    """The cache layout of tables placed ``MANAGED_CACHING``; embnum keeps no cache, so only the
    all-uncached layout (no table cached) is available."""
    cached = [t for t, loc in enumerate(location_list) if loc == EmbeddingLocation.MANAGED_CACHING]
    if cached:
        raise NotImplementedError(
            f"embnum's fbgemm stand-in has no embedding cache (EmbeddingLocation.MANAGED_CACHING, tables {cached})"
        )
    return CacheState([-1] * len(feature_table_map) + [0], [], 0)
