"""fbgemm_gpu features embnum does not provide: SSD and key-value (KV-ZCH) embedding tables,
their eviction and enrichment settings, partially materialised tensors, the key-value inference
module and TBE statistics reporters.

TorchRec imports these names unconditionally, so each one imports fine; constructing one raises
``NotImplementedError`` naming the feature. The ``torch.ops.fbgemm`` operators of such features that
TorchRec calls (:data:`OPERATORS`: zero-collision hashing, unified-memory tensors) are defined with
fbgemm's schemas by :func:`register_operators` and raise the same way when called. ``BackendType``
(an enum TorchRec compares against), ``EnrichmentType`` (the enrichment source an
``EnrichmentPolicy`` names; TorchRec's tests import it) and ``ASSOC`` (the SSD cache's
associativity) are plain values.
"""

from __future__ import annotations

import enum
import functools

__all__ = [
    "ASSOC",
    "BackendType",
    "EnrichmentPolicy",
    "EnrichmentType",
    "EvictionPolicy",
    "KVEmbeddingInference",
    "KVZCHParams",
    "KVZCHTBEConfig",
    "OPERATORS",
    "PartiallyMaterializedTensor",
    "SSDTableBatchedEmbeddingBags",
    "TBEStatsReporterConfig",
    "register_operators",
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


# fbgemm name -> (fbgemm_gpu 1.8.0 schema without the name, the feature, who calls it in TorchRec)
OPERATORS = {
    "create_zch_buffer": (
        "(int size, bool support_evict=False, Device? device=None, bool long_type=False) -> (Tensor, Tensor)",
        "zero-collision hashing (ZCH)",
        "HashZchManagedCollisionModule",
    ),
    "zero_collision_hash": (
        "(Tensor input, Tensor identities, int max_probe, bool circular_probe=False, int exp_hours=-1, "
        "bool readonly=False, Tensor? local_sizes=None, Tensor? offsets=None, Tensor? metadata=None, "
        "bool output_on_uvm=False, bool disable_fallback=False, bool _modulo_identity_DPRECATED=False, "
        "Tensor? input_metadata=None, int eviction_threshold=-1, int eviction_policy=0, int opt_in_prob=-1, "
        "int num_reserved_slots=-1, Tensor? opt_in_rands=None, Tensor? runtime_meta=None) -> (Tensor, Tensor)",
        "zero-collision hashing (ZCH)",
        "HashZchManagedCollisionModule",
    ),
    "new_unified_tensor": (
        "(Tensor self, int[] sizes, bool is_host_mapped) -> Tensor",
        "unified (UVM) memory",
        "UVM table placements",
    ),
}


def _refusal(name, feature, caller):
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"{feature} is not available: torch.ops.fbgemm.{name} (called by TorchRec's {caller}) is not provided "
            "by embnum's fbgemm_gpu stand-in (embnum.fbgemm_compat); install fbgemm_gpu to use it"
        )

    return refuse


@functools.cache
def register_operators():
    """Define every operator of :data:`OPERATORS` not defined yet in the ``fbgemm`` namespace (once per
    process); each raises ``NotImplementedError`` naming its feature. Returns the ``torch.library``
    fragment that holds them."""
    import torch

    lib = torch.library.Library("fbgemm", "FRAGMENT")
    for name, (schema, feature, caller) in OPERATORS.items():
        try:
            getattr(torch.ops.fbgemm, name)
            continue  # defined already (fbgemm_gpu's own): never replaced
        except (AttributeError, RuntimeError):
            pass
        lib.define(name + schema)
        lib.impl(name, _refusal(name, feature, caller), "CompositeExplicitAutograd")
    return lib
