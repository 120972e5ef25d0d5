"""Torch side of the KeyedJaggedTensor family: schema types, fake shapes, gradients.

The permutes and the keyed index select are gathers of whole segments, so
their gradient (for float ``values`` and for ``weights``) is the matching
scatter-add: output element ``e`` came from input element ``src[e]``, and
``grad_input.index_add_(0, src, grad_output)`` sums the gradients of a
segment that was selected twice and leaves zeros in dropped segments (right
for every permute, unlike fbgemm's inverse-permute formula). ``src`` is
built from the segment offsets with a few torch ops. Block bucketize,
expand_into_jagged_permute, invert_permute and jagged_unique_indices have no
gradient (as in fbgemm).
"""

from __future__ import annotations

import torch

from ._library import bridge


def _as(t, dtype):
    """``t`` in ``dtype`` (no ``aten::to`` call when it already is: opcheck's schema
    check rejects an op that returns its own input)."""
    return t if t.dtype == dtype else t.to(dtype)


def _dynamic(hint):
    return hint if hint is not None else torch.library.get_ctx().new_dynamic_size()


def _offsets(sizes):
    c = torch.cumsum(sizes, 0, dtype=torch.int64)
    return torch.cat([c.new_zeros(1), c])


def _source_elements(src_offsets, seg, out_sizes, total):
    """``src[e]`` for every output element of a segment gather (int64 ``[total]``)."""
    seg = _as(seg, torch.int64)
    out_sizes = _as(out_sizes, torch.int64)
    shift = src_offsets[seg] - _offsets(out_sizes)[:-1]
    return torch.repeat_interleave(shift, out_sizes, output_size=total) + torch.arange(total, device=seg.device)


# -- permutes ------------------------------------------------------------------
def _permute_setup(ctx, args, output):
    lengths = args["lengths"]
    sizes = lengths.sum(dim=1) if lengths.dim() == 2 else lengths
    out_sizes = output[0].sum(dim=1) if lengths.dim() == 2 else output[0]
    ctx.save_for_backward(_offsets(sizes), args["permute"], out_sizes)
    ctx.values = _Like(args["values"])
    ctx.weights = None if args["weights"] is None else _Like(args["weights"])


class _Like:
    """Shape, dtype and device of a tensor, without keeping its storage alive."""

    def __init__(self, t):
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device


def _zeros_add(src, grad, like):
    if grad is None or like is None or not like.dtype.is_floating_point:
        return None
    return torch.zeros(like.shape, dtype=like.dtype, device=like.device).index_add_(0, src, _as(grad, like.dtype))


def _permute_backward(ctx, g_lengths, g_values, g_weights):
    src_offsets, permute, out_sizes = ctx.saved_tensors
    total = g_values.shape[0]
    src = _source_elements(src_offsets, permute, out_sizes, total)
    return {"values": _zeros_add(src, g_values, ctx.values), "weights": _zeros_add(src, g_weights, ctx.weights)}


def _permute_fake(permute, lengths, values, weights, permuted_lengths_sum, **_):
    M = _dynamic(permuted_lengths_sum)
    shape = (permute.shape[0],) + tuple(lengths.shape[1:])
    return lengths.new_empty(shape), values.new_empty((M,)), None if weights is None else weights.new_empty((M,))


_PERMUTE = dict(
    types={"weights": "Tensor?", "permuted_lengths_sum": "SymInt?"},
    returns="(Tensor, Tensor, Tensor?)",
    fake=_permute_fake,
    setup=_permute_setup,
    backward=_permute_backward,
    bf16=True,
)
bridge("permute_2d_sparse_data", **_PERMUTE)
bridge("permute_1d_sparse_data", **_PERMUTE)


# -- keyed index select --------------------------------------------------------------
def _select_setup(ctx, args, output):
    B, lengths = args["batch_size"], args["lengths"]
    T = lengths.shape[0] // B
    seg = (torch.arange(T, device=lengths.device)[:, None] * B + _as(args["indices"], torch.int64)[None, :]).reshape(-1)
    ctx.save_for_backward(_as(args["offsets"], torch.int64), seg, output[1])
    ctx.values, ctx.weights = _Like(args["values"]), None if args["weights"] is None else _Like(args["weights"])


def _select_backward(ctx, grads):
    src_offsets, seg, out_lengths = ctx.saved_tensors
    g_values = grads[0]
    src = _source_elements(src_offsets, seg, out_lengths, g_values.shape[0])
    g_weights = grads[2] if len(grads) > 2 else None
    return {"values": _zeros_add(src, g_values, ctx.values), "weights": _zeros_add(src, g_weights, ctx.weights)}


def _select_fake(values, lengths, indices, batch_size, weights, selected_lengths_sum, **_):
    M = _dynamic(selected_lengths_sum)
    out = [values.new_empty((M,)), lengths.new_empty(((lengths.shape[0] // batch_size) * indices.shape[0],))]
    if weights is not None:
        out.append(weights.new_empty((M,)))
    return out


bridge(
    "keyed_jagged_index_select_dim1",
    types={"batch_size": "SymInt", "weights": "Tensor?", "selected_lengths_sum": "SymInt?"},
    returns="Tensor[]",
    fake=_select_fake,
    setup=_select_setup,
    backward=_select_backward,
    bf16=True,
)


# -- block bucketize ---------------------------------------------------------------------
def _bucketize_fake(lengths, indices, bucketize_pos, sequence, my_size, weights, **_):
    n = indices.shape[0]
    return (
        lengths.new_empty((my_size * lengths.shape[0],)),
        indices.new_empty((n,)),
        None if weights is None else weights.new_empty((n, *weights.shape[1:])),
        indices.new_empty((n,)) if bucketize_pos else None,
        indices.new_empty((n,)) if sequence else None,
    )


_BUCKETIZE_TYPES = {
    "bucketize_pos": "bool",
    "sequence": "bool",
    "my_size": "int",
    "weights": "Tensor?",
    "batch_size_per_feature": "Tensor?",
    "max_B": "int",
    "block_bucketize_pos": "Tensor[]?",
    "keep_orig_idx": "bool",
    "total_num_blocks": "Tensor?",
    "keep_orig_idx_per_feature": "Tensor?",
}
bridge(
    "block_bucketize_sparse_features",
    types=_BUCKETIZE_TYPES,
    returns="(Tensor, Tensor, Tensor?, Tensor?, Tensor?)",
    fake=_bucketize_fake,
    bf16=True,
)
bridge(
    "block_bucketize_sparse_features_2d_weights",
    types={**_BUCKETIZE_TYPES, "weights": "Tensor", "weights_dim": "int"},
    returns="(Tensor, Tensor, Tensor, Tensor?, Tensor?)",
    fake=_bucketize_fake,
    bf16=True,
)


def _bucketize_inference_fake(indices, return_bucket_mapping, **kwargs):
    n = indices.shape[0]
    return (*_bucketize_fake(indices=indices, **kwargs), indices.new_empty((n,)) if return_bucket_mapping else None)


bridge(
    "block_bucketize_sparse_features_inference",
    types={**_BUCKETIZE_TYPES, "return_bucket_mapping": "bool"},
    returns="(Tensor, Tensor, Tensor?, Tensor?, Tensor?, Tensor?)",
    fake=_bucketize_inference_fake,
    bf16=True,
)


# -- index helpers -------------------------------------------------------------------------
bridge(
    "expand_into_jagged_permute",
    types={"output_size": "SymInt"},
    fake=lambda input_offset, output_size, **_: input_offset.new_empty((output_size,)),
)
bridge("invert_permute", fake=lambda permute, **_: torch.empty_like(permute))


def _unique_fake(offsets, indices, **_):
    K = _dynamic(None)
    nb = offsets.shape[0] - 1
    return (
        offsets.new_empty((nb,)),
        offsets.new_empty((nb + 1,)),
        indices.new_empty((K,)),
        indices.new_empty((indices.shape[0],), dtype=torch.int64),
    )


bridge(
    "jagged_unique_indices",
    returns="(Tensor, Tensor, Tensor, Tensor)",
    fake=_unique_fake,
)
