"""torch modules on embnum's ops: table-batched embedding bags, TorchRec's EmbeddingBagCollection,
the KeyedTensor regroup.

This layer sits above :mod:`embnum.torch_bridge` (the ops on tensors) and :mod:`embnum.containers`;
the ops and containers never import it.
"""

from .embedding_bag_collection import EmbeddingBagCollection, EmbeddingBagConfig
from .keyed_tensor import PermuteMultiEmbedding
from .tbe import TBE, FusedTBE

__all__ = ["TBE", "EmbeddingBagCollection", "EmbeddingBagConfig", "FusedTBE", "PermuteMultiEmbedding"]
