"""fbgemm_gpu features embnum does not provide: SSD and key-value (KV-ZCH) embedding tables,
their eviction and enrichment settings, partially materialised tensors, the key-value inference
module and TBE statistics reporters.

TorchRec imports these names unconditionally, so each one imports fine; constructing one raises
``NotImplementedError`` naming the feature. ``BackendType`` (an enum TorchRec compares against),
``EnrichmentType`` (the enrichment source an ``EnrichmentPolicy`` names; TorchRec's tests import it)
and ``ASSOC`` (the SSD cache's associativity) are plain values.
"""

from __future__ import annotations

import enum

__all__ = [
    "ASSOC",
    "BackendType",
    "EnrichmentPolicy",
    "EnrichmentType",
    "EvictionPolicy",
    "KVEmbeddingInference",
    "KVZCHParams",
    "KVZCHTBEConfig",
    "PartiallyMaterializedTensor",
    "SSDTableBatchedEmbeddingBags",
    "TBEStatsReporterConfig",
]

ASSOC = 32


class BackendType(enum.IntEnum):
    SSD = 0
    DRAM = 1
    PS = 2
    DRAM_SSD = 3


class EnrichmentType(enum.IntEnum):
    IGR_LASER_EMBEDDING = 0
    IGR_LASER_SID = 1
    ONEFLOW_OPENTAB_SID = 2
    ONEFLOW_FEATURE_STORE_SID = 3
    IN_MEMORY_TEST_ONLY = 4


class _Unavailable:
    feature = ""  # what the class stands for, in the error

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self.feature} ({type(self).__name__}) is not available: TorchRec is running on embnum's "
            "fbgemm_gpu stand-in (embnum.fbgemm_compat), which has no such tables; install fbgemm_gpu to use them"
        )


class SSDTableBatchedEmbeddingBags(_Unavailable):
    feature = "SSD-offloaded embedding tables"


class KVZCHParams(_Unavailable):
    feature = "key-value zero-collision (KV-ZCH) embedding tables"


class KVZCHTBEConfig(_Unavailable):
    feature = "key-value zero-collision (KV-ZCH) embedding tables"


class EvictionPolicy(_Unavailable):
    feature = "key-value table eviction"


class EnrichmentPolicy(_Unavailable):
    feature = "key-value table enrichment"


class PartiallyMaterializedTensor(_Unavailable):
    feature = "partially materialised key-value table weights"


class KVEmbeddingInference(_Unavailable):
    feature = "key-value embedding inference"


class TBEStatsReporterConfig(_Unavailable):
    feature = "TBE statistics reporting"
