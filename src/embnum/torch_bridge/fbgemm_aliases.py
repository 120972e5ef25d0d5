"""Opt-in ``torch.ops.fbgemm.<name>`` aliases backed by embnum, for processes without fbgemm_gpu.

``register_fbgemm_aliases()`` defines, in the ``fbgemm`` op namespace, every fbgemm
operator below with fbgemm_gpu 1.8.0's own schema (names, argument order, defaults,
return types), each implemented as a call of the embnum op (``CompositeImplicitAutograd``:
autograd, fake tensors and ``torch.compile`` come from the embnum custom op it calls).
So code written against fbgemm, such as TorchRec's ``torch.ops.fbgemm.permute_2D_sparse_data``
calls, runs on embnum. It refuses when fbgemm_gpu is already loaded (its ops own those
names), and fbgemm_gpu cannot be loaded into a process after it (the names are taken).
Semantics are embnum's (``docs/``, the family pages): same results where fbgemm's are defined, clear
errors where fbgemm reads out of bounds. The TBE training and inference operators are
not aliased here: their fbgemm schemas are internal codegen entry points (use
``embnum.torch_bridge.tbe`` and the EmbeddingBagCollection instead); the fbgemm_gpu stand-in
(``embnum.fbgemm_compat``) defines the quantized lookup's, for fbgemm's inference module.

Four aliases have no embnum op behind them (``docs/coming-from-fbgemm.md``, bridge-only
aliases): ``merge_pooled_embeddings``, ``sum_reduce_to_one`` and ``all_to_one_device`` are a
concatenation, a sum and a device move of whole tensors, which torch already does on every
device (a kernel of embnum's would add nothing), and ``is_uvm_tensor`` answers a question
about fbgemm's allocator. They check their arguments as embnum's ops do.
"""

from __future__ import annotations

import functools
import sys

import torch

from ._library import user_function

# fbgemm name -> (fbgemm_gpu 1.8.0 schema without the name, embnum op or None for a bridge-only alias,
# adapter (the whole implementation of a bridge-only alias) or None for "same arguments")
ALIASES: dict[str, tuple[str, str | None, object]] = {}


def _alias(fbgemm_name, schema, embnum_name, adapter=None):
    ALIASES[fbgemm_name] = (schema, embnum_name, adapter)


_PERMUTE = "(Tensor permute, Tensor lengths, Tensor values, Tensor? weights=None, SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)"  # noqa: E501
_DEQ = "(Tensor input) -> Tensor"
# jagged
_alias("asynchronous_complete_cumsum", "(Tensor t_in) -> Tensor", "complete_cumsum")
_alias("asynchronous_exclusive_cumsum", "(Tensor t_in) -> Tensor", "exclusive_cumsum")
_alias("asynchronous_inclusive_cumsum", "(Tensor t_in) -> Tensor", "inclusive_cumsum")
_alias("offsets_range", "(Tensor offsets, SymInt range_size) -> Tensor", "offsets_range")
_alias("segment_sum_csr", "(SymInt batch_size, Tensor csr_seg, Tensor values) -> Tensor", "segment_sum_csr")
_alias(
    "jagged_to_padded_dense",
    "(Tensor values, Tensor[] offsets, SymInt[] max_lengths, float padding_value=0.) -> Tensor",
    "jagged_to_padded_dense",
)
_alias(
    "jagged_1d_to_dense",
    "(Tensor values, Tensor offsets, SymInt max_sequence_length, int padding_value) -> Tensor",
    "jagged_1d_to_dense",
)
_alias(
    "jagged_2d_to_dense", "(Tensor values, Tensor offsets, SymInt max_sequence_length) -> Tensor", "jagged_2d_to_dense"
)
_alias(
    "dense_to_jagged",
    "(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> (Tensor, Tensor[])",
    "dense_to_jagged",
    lambda op, dense, x_offsets, total_L=None: (op(dense, x_offsets, total_L), [o.clone() for o in x_offsets]),
)
# keyed_tensor
_POOLED = "(Tensor pooled_embs, Tensor offset_dim_list, Tensor permute_list, Tensor inv_offset_dim_list, Tensor inv_permute_list) -> Tensor"  # noqa: E501
_alias("permute_pooled_embs", _POOLED, "permute_pooled_embs")
_alias("permute_pooled_embs_auto_grad", _POOLED, "permute_pooled_embs")
_alias("permute_pooled_embs_split", _POOLED, "permute_pooled_embs")  # the same op from fbgemm's split library
_alias("permute_pooled_embs_auto_grad_split", _POOLED, "permute_pooled_embs")
_alias(
    "kt_regroup_arguments",
    "(Tensor embs, str[][] keys, int[][] lengths, str[][] groups) -> (Tensor, Tensor, Tensor, int[])",
    "kt_regroup_arguments",
)
_alias(
    "permute_multi_embedding",
    "(Tensor[] pooled_embs, Tensor permutes, Tensor in_shapes, Tensor out_shapes, SymInt[] out_lengths) -> Tensor[]",
    "permute_multi_embedding",
)
_alias(
    "regroup_keyed_tensor",
    "(Tensor[] pooled_embs, str[][] keys, int[][] lengths, str[][] groups) -> Tensor[]",
    "regroup_keyed_tensor",
)
# kjt
_alias("permute_2D_sparse_data", _PERMUTE, "permute_2d_sparse_data")
_alias("permute_sparse_data", _PERMUTE, "permute_2d_sparse_data")
_alias("permute_1D_sparse_data", _PERMUTE, "permute_1d_sparse_data")


def _input1d(op, permute, lengths, values, stride, weights=None, permuted_lengths_sum=None):
    """fbgemm's 1-D form: ``lengths`` ``[T * stride]`` (``stride``: the batch size, an int >= 1)."""
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError(f"lengths must be a 1-D tensor of T * stride entries, got {lengths!r:.80}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1 or lengths.numel() % stride:
        raise ValueError(f"stride must be an int >= 1 dividing len(lengths) = {lengths.numel()}, got {stride!r}")
    l2, v, w = op(permute, lengths.view(-1, stride), values, weights, permuted_lengths_sum)
    return l2.view(-1), v, w


_alias(
    "permute_2D_sparse_data_input1D",
    "(Tensor permute, Tensor lengths, Tensor values, SymInt stride, Tensor? weights=None, "
    "SymInt? permuted_lengths_sum=None) -> (Tensor, Tensor, Tensor?)",
    "permute_2d_sparse_data",
    _input1d,
)
_alias(
    "block_bucketize_sparse_features",
    "(Tensor lengths, Tensor indices, bool bucketize_pos, bool sequence, Tensor block_sizes, SymInt my_size, "
    "Tensor? weights=None, Tensor? batch_size_per_feature=None, SymInt max_B=-1, Tensor[]? block_bucketize_pos=None, "
    "bool keep_orig_idx=False, Tensor? total_num_blocks=None, Tensor? keep_orig_idx_per_feature=None) "
    "-> (Tensor, Tensor, Tensor?, Tensor?, Tensor?)",
    "block_bucketize_sparse_features",
)
_alias(
    "block_bucketize_sparse_features_2d_weights",
    "(Tensor lengths, Tensor indices, bool bucketize_pos, bool sequence, Tensor block_sizes, SymInt my_size, "
    "Tensor weights, SymInt weights_dim=1, Tensor? batch_size_per_feature=None, SymInt max_B=-1, "
    "Tensor[]? block_bucketize_pos=None, bool keep_orig_idx=False, Tensor? total_num_blocks=None, "
    "Tensor? keep_orig_idx_per_feature=None) -> (Tensor, Tensor, Tensor, Tensor?, Tensor?)",
    "block_bucketize_sparse_features_2d_weights",
)
_alias(
    "block_bucketize_sparse_features_inference",
    "(Tensor lengths, Tensor indices, bool bucketize_pos, bool sequence, Tensor block_sizes, SymInt my_size, "
    "Tensor? weights=None, Tensor? batch_size_per_feature=None, SymInt max_B=-1, Tensor[]? block_bucketize_pos=None, "
    "bool return_bucket_mapping=False, bool keep_orig_idx=False, Tensor? total_num_blocks=None, "
    "Tensor? keep_orig_idx_per_feature=None) -> (Tensor, Tensor, Tensor?, Tensor?, Tensor?, Tensor?)",
    "block_bucketize_sparse_features_inference",
)
_alias(
    "keyed_jagged_index_select_dim1",
    "(Tensor values, Tensor lengths, Tensor offsets, Tensor indices, SymInt batch_size, Tensor? weights=None, "
    "SymInt? selected_lengths_sum=None) -> Tensor[]",
    "keyed_jagged_index_select_dim1",
)
_alias(
    "expand_into_jagged_permute",
    "(Tensor permute, Tensor input_offset, Tensor output_offset, SymInt output_size) -> Tensor",
    "expand_into_jagged_permute",
)
_alias("invert_permute", "(Tensor permute) -> Tensor", "invert_permute")
_alias(
    "jagged_unique_indices",
    "(Tensor hash_size_cumsum, Tensor hash_size_offsets, Tensor offsets, Tensor indices) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    "jagged_unique_indices",
)
# index_select
_alias(
    "group_index_select_dim0",
    "(Tensor[] input_group, Tensor[] indices_group) -> Tensor[]",
    "group_index_select_dim0",
)
_alias(
    "batch_index_select_dim0",
    "(Tensor inputs, Tensor indices, SymInt[] input_num_indices, SymInt[] input_rows, SymInt[] input_columns, "
    "bool permute_output_dim_0_1=False) -> Tensor",
    "batch_index_select_dim0",
)
_alias(
    "jagged_index_select_2d_forward_v2",
    "(Tensor values, Tensor indices, Tensor input_offsets, Tensor output_offsets, int? num_dense_output_rows=None) "
    "-> Tensor",
    "jagged_index_select_2d",
)
# quant
_alias("FloatToFused8BitRowwiseQuantized", "(Tensor t) -> Tensor", "float_to_fused_8bit_rowwise")
_alias("Fused8BitRowwiseQuantizedToFloat", _DEQ, "fused_8bit_rowwise_to_float")
_alias(
    "FloatToFusedNBitRowwiseQuantizedSBHalf", "(Tensor input, int bit_rate) -> Tensor", "float_to_fused_nbit_rowwise"
)
_alias(
    "FusedNBitRowwiseQuantizedSBHalfToFloat", "(Tensor input, int bit_rate) -> Tensor", "fused_nbit_rowwise_to_float"
)
_alias("FloatToBfloat16Quantized", _DEQ, "float_to_bfloat16")
_alias("Bfloat16QuantizedToFloat", _DEQ, "bfloat16_to_float")
_alias("FloatToHFP8Quantized", "(Tensor input, int ebits, int exponent_bias, float max_pos) -> Tensor", "float_to_hfp8")
_alias("HFP8QuantizedToFloat", "(Tensor input, int ebits, int exponent_bias) -> Tensor", "hfp8_to_float")

_alias(
    "FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf",
    "(Tensor input, int bit_rate) -> Tensor",
    "float_to_fused_nbit_rowwise",
)
_alias("FloatOrHalfToFused8BitRowwiseQuantized", "(Tensor t) -> Tensor", "float_to_fused_8bit_rowwise")


# -- bridge-only aliases: whole-tensor moves that torch does itself -------------------------
def _tensor_list(name, tensors):
    """``tensors`` is a non-empty list of tensors of one dtype (TypeError/ValueError naming ``name``)."""
    if len(tensors) == 0:
        raise ValueError(f"{name} must hold at least one tensor, got an empty list")
    dtype = tensors[0].dtype
    for i, t in enumerate(tensors):
        if t.dtype != dtype:
            raise TypeError(f"{name}[{i}] is {t.dtype} but {name}[0] is {dtype}: every tensor must have one dtype")
    return dtype


def merge_pooled_embeddings(pooled_embeddings, uncat_dim_size, target_device, cat_dim=1):
    """The 2-D tensors ``pooled_embeddings`` (one dtype, any devices) concatenated along ``cat_dim``
    (0 or 1, or -2 / -1) on ``target_device``; each one's other dimension must be ``uncat_dim_size``.
    A new tensor (differentiable)."""
    _tensor_list("pooled_embeddings", pooled_embeddings)
    if cat_dim not in (0, 1, -1, -2):
        raise ValueError(f"cat_dim must be 0 or 1 (or -2, -1) for 2-D pooled embeddings, got {cat_dim}")
    cat_dim %= 2
    for i, t in enumerate(pooled_embeddings):
        if t.dim() != 2:
            raise ValueError(f"pooled_embeddings[{i}] must be 2-D, got shape {tuple(t.shape)}")
        if t.shape[1 - cat_dim] != uncat_dim_size:
            raise ValueError(
                f"pooled_embeddings[{i}] has {t.shape[1 - cat_dim]} in dimension {1 - cat_dim}, "
                f"not uncat_dim_size = {uncat_dim_size}"
            )
    return torch.cat([t.to(target_device) for t in pooled_embeddings], dim=cat_dim)


def sum_reduce_to_one(input_tensors, target_device):
    """The element-wise sum of ``input_tensors`` (one shape, one dtype) on ``target_device``, added
    left to right in the dtype of the inputs (as fbgemm does). A new tensor (differentiable)."""
    _tensor_list("input_tensors", input_tensors)
    shape = input_tensors[0].shape
    for i, t in enumerate(input_tensors):
        if t.shape != shape:
            raise ValueError(f"input_tensors[{i}] has shape {tuple(t.shape)} but input_tensors[0] has {tuple(shape)}")
    out = input_tensors[0].to(target_device, copy=True)
    for t in input_tensors[1:]:
        out = out + t.to(target_device)
    return out


def all_to_one_device(input_tensors, target_device):
    """Each of ``input_tensors`` on ``target_device``: the tensor itself where it is there already
    (as fbgemm), else a copy."""
    return [t.to(target_device) for t in input_tensors]


def is_uvm_tensor(t):
    """False: embnum allocates no unified (UVM) memory, and without fbgemm_gpu nothing else here does."""
    return False


_alias(
    "merge_pooled_embeddings",
    "(Tensor[] pooled_embeddings, SymInt uncat_dim_size, Device target_device, SymInt cat_dim=1) -> Tensor",
    None,
    merge_pooled_embeddings,
)
_alias("sum_reduce_to_one", "(Tensor[] input_tensors, Device target_device) -> Tensor", None, sum_reduce_to_one)
_alias("all_to_one_device", "(Tensor[] input_tensors, Device target_device) -> Tensor[]", None, all_to_one_device)
_alias("is_uvm_tensor", "(Tensor t) -> bool", None, is_uvm_tensor)


def _implementation(embnum_name, adapter):
    if embnum_name is None:
        return adapter
    op = user_function(embnum_name)
    if adapter is None:
        return lambda *args: op(*args)
    return lambda *args: adapter(op, *args)


def register_fbgemm_aliases() -> list[str]:
    """Define ``torch.ops.fbgemm.<name>`` for every fbgemm operator in :data:`ALIASES`, backed by embnum.

    Returns the fbgemm names. Calling it again does nothing more. Raises ``RuntimeError`` when
    fbgemm_gpu is loaded in this process (its own operators hold those names).
    """
    _register()
    return list(ALIASES)


def registered() -> bool:
    """Whether :func:`register_fbgemm_aliases` has defined the aliases in this process."""
    return _register.cache_info().currsize > 0


@functools.cache
def _register() -> torch.library.Library:
    """The ``fbgemm`` fragment holding the aliases, defined on the first call (a call that raises
    defines nothing and is not remembered)."""
    taken = [n for n in ALIASES if _defined(n)]
    if "fbgemm_gpu" in sys.modules or taken:
        raise RuntimeError(
            "register_fbgemm_aliases() is for processes without fbgemm_gpu, but fbgemm_gpu is loaded here "
            f"(torch.ops.fbgemm already defines {taken[:3] or 'its operators'}): its own operators keep those names"
        )
    lib = torch.library.Library("fbgemm", "FRAGMENT")
    for name, (schema, embnum_name, adapter) in ALIASES.items():
        lib.define(name + schema)
        lib.impl(name, _implementation(embnum_name, adapter), "CompositeImplicitAutograd")
    return lib


def _defined(name) -> bool:
    try:
        getattr(torch.ops.fbgemm, name)
    except (AttributeError, RuntimeError):
        return False
    return True
