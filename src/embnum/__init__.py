"""embnum: recommendation-system embedding kernels you can read, test and change.

Every op is ``embnum.<name>(..., out=None, backend=None)`` on NumPy or CuPy
arrays; ``embnum.torch_bridge`` has the same ops on torch tensors with
autograd. ``embnum.ops()`` lists them. Importing embnum loads neither torch,
CuPy nor Numba: each is loaded the first time something needs it.
"""

# each family's ops (declared in embnum/ops/<family>.py) and the host helpers it exports beside them
from .ops.index_select import (
    batch_index_select_dim0,
    batch_index_select_dim0_backward,
    group_index_select_dim0,
    jagged_index_select_2d,
)
from .ops.jagged import (
    complete_cumsum,
    dense_to_jagged,
    exclusive_cumsum,
    inclusive_cumsum,
    jagged_1d_to_dense,
    jagged_2d_to_dense,
    jagged_to_padded_dense,
    offsets_range,
    segment_sum_csr,
    segment_sum_csr_backward,
)
from .ops.keyed_tensor import (
    kt_regroup_arguments,
    permute_multi_embedding,
    permute_multi_embedding_backward,
    permute_pooled_embs,
    regroup_keyed_tensor,
)
from .ops.kjt import (
    block_bucketize_sparse_features,
    block_bucketize_sparse_features_2d_weights,
    block_bucketize_sparse_features_inference,
    expand_into_jagged_permute,
    invert_permute,
    jagged_unique_indices,
    keyed_jagged_index_select_dim1,
    permute_1d_sparse_data,
    permute_2d_sparse_data,
)
from .ops.quant import (
    bfloat16_to_float,
    float_to_bfloat16,
    float_to_fp16,
    float_to_fused_8bit_rowwise,
    float_to_fused_nbit_rowwise,
    float_to_hfp8,
    fp16_to_float,
    fused_8bit_rowwise_to_float,
    fused_nbit_rowwise_to_float,
    hfp8_to_float,
)
from .ops.tbe import (
    TBELayout,
    TBEOptimizer,
    TBESparseGrad,
    tbe_backward,
    tbe_backward_sparse,
    tbe_backward_update,
    tbe_forward,
    tbe_grad_per_sample_weights,
    tbe_layout,
)
from .ops.tbe_quantized import tbe_forward_quantized, tbe_pack_quantized

# isort: split
# after the families: the name ``embnum.ops`` is the function that lists the ops, not the package
from ._backend import available_backends
from ._registry import get as get_op
from ._registry import ops
from ._validate import MAX_SIZE
from .containers import JaggedTensor, KeyedJaggedTensor, KeyedTensor, from_torchrec

__version__ = "0.1.0"

__all__ = [
    "MAX_SIZE",
    "available_backends",
    "get_op",
    "ops",
    "__version__",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "from_torchrec",
    # ops and helpers, by family
    "batch_index_select_dim0",
    "batch_index_select_dim0_backward",
    "jagged_index_select_2d",
    "group_index_select_dim0",
    "complete_cumsum",
    "dense_to_jagged",
    "exclusive_cumsum",
    "inclusive_cumsum",
    "jagged_1d_to_dense",
    "jagged_2d_to_dense",
    "jagged_to_padded_dense",
    "offsets_range",
    "segment_sum_csr",
    "segment_sum_csr_backward",
    "kt_regroup_arguments",
    "permute_multi_embedding",
    "permute_multi_embedding_backward",
    "permute_pooled_embs",
    "regroup_keyed_tensor",
    "block_bucketize_sparse_features",
    "block_bucketize_sparse_features_2d_weights",
    "block_bucketize_sparse_features_inference",
    "expand_into_jagged_permute",
    "invert_permute",
    "jagged_unique_indices",
    "keyed_jagged_index_select_dim1",
    "permute_1d_sparse_data",
    "permute_2d_sparse_data",
    "bfloat16_to_float",
    "float_to_bfloat16",
    "float_to_fp16",
    "float_to_fused_8bit_rowwise",
    "float_to_fused_nbit_rowwise",
    "float_to_hfp8",
    "fp16_to_float",
    "fused_8bit_rowwise_to_float",
    "fused_nbit_rowwise_to_float",
    "hfp8_to_float",
    "TBELayout",
    "TBEOptimizer",
    "TBESparseGrad",
    "tbe_backward",
    "tbe_backward_sparse",
    "tbe_backward_update",
    "tbe_forward",
    "tbe_grad_per_sample_weights",
    "tbe_layout",
    "tbe_forward_quantized",
    "tbe_pack_quantized",
]
