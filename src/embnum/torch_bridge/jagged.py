"""Torch side of the jagged family: schema types, fake shapes, gradients.

The gradients are embnum ops themselves (``dense_to_jagged`` for
``jagged_to_padded_dense`` and back, ``segment_sum_csr_backward`` for
``segment_sum_csr``), called through the bridge on the forward's backend, so
they run wherever the forward runs.
"""

from __future__ import annotations

import torch

from ._library import bridge


def _op(name):
    return getattr(torch.ops.embnum, name).default


bridge("complete_cumsum", fake=lambda lengths, **_: lengths.new_empty((*lengths.shape[:-1], lengths.shape[-1] + 1)))
bridge("exclusive_cumsum", fake=lambda lengths, **_: torch.empty_like(lengths))
bridge("inclusive_cumsum", fake=lambda lengths, **_: torch.empty_like(lengths))
bridge(
    "offsets_range",
    types={"range_size": "SymInt"},
    fake=lambda offsets, range_size, **_: offsets.new_empty((range_size,)),
)


# -- segment sums ------------------------------------------------------------
def _segment_sum_setup(ctx, args, output):
    ctx.save_for_backward(args["csr_seg"])
    ctx.batch_size, ctx.num_values, ctx.backend = args["batch_size"], args["values"].shape[0], args["backend"]


def _segment_sum_backward(ctx, grad):
    (csr_seg,) = ctx.saved_tensors
    g = _op("segment_sum_csr_backward")(ctx.batch_size, csr_seg, grad.contiguous(), ctx.num_values, ctx.backend)
    return {"values": g}


bridge(
    "segment_sum_csr",
    types={"batch_size": "SymInt"},
    fake=lambda csr_seg, values, **_: values.new_empty((csr_seg.shape[0] - 1,)),
    setup=_segment_sum_setup,
    backward=_segment_sum_backward,
    bf16=True,
)
bridge(
    "segment_sum_csr_backward",
    types={"batch_size": "SymInt", "num_values": "SymInt"},
    fake=lambda grad_output, num_values, **_: grad_output.new_empty((num_values,)),
    bf16=True,
)


# -- jagged -> dense ---------------------------------------------------------
def _to_dense_setup(ctx, args, output):
    offsets = args["offsets"]
    ctx.save_for_backward(*(offsets if isinstance(offsets, (list, tuple)) else [offsets]))
    ctx.values_shape, ctx.backend = args["values"].shape, args["backend"]


def _to_dense_backward(ctx, grad):
    """Adjoint of every jagged -> dense op: ``dense_to_jagged`` of the gradient."""
    offsets = list(ctx.saved_tensors)
    dense = grad if len(ctx.values_shape) == 2 else grad.unsqueeze(-1)
    g = _op("dense_to_jagged")(dense.contiguous(), offsets, ctx.values_shape[0], ctx.backend)
    return {"values": g.reshape(ctx.values_shape)}


def _to_dense_fake(values, offsets, max_lengths=None, max_sequence_length=None, **_):
    """Every jagged -> dense op: ``[B, *max_lengths, *values.shape[1:]]``."""
    if max_lengths is None:  # the 1-D / 2-D forms: one offsets tensor and one length
        offsets, max_lengths = [offsets], [max_sequence_length]
    return values.new_empty((offsets[0].shape[0] - 1, *max_lengths, *values.shape[1:]))


_TO_DENSE = dict(
    fake=_to_dense_fake,
    setup=_to_dense_setup,
    backward=_to_dense_backward,
    bf16=True,
)
bridge(
    "jagged_to_padded_dense",
    types={"offsets": "Tensor[]", "max_lengths": "SymInt[]", "padding_value": "float"},
    **_TO_DENSE,
)
bridge("jagged_1d_to_dense", types={"max_sequence_length": "SymInt", "padding_value": "float"}, **_TO_DENSE)
bridge("jagged_2d_to_dense", types={"max_sequence_length": "SymInt"}, **_TO_DENSE)


# -- dense -> jagged ---------------------------------------------------------
def _to_jagged_setup(ctx, args, output):
    ctx.save_for_backward(*args["offsets"])
    ctx.lengths, ctx.backend = list(args["dense"].shape[1:-1]), args["backend"]


def _to_jagged_backward(ctx, grad):
    """Adjoint of ``dense_to_jagged``: ``jagged_to_padded_dense`` of the gradient, padding 0."""
    offsets = list(ctx.saved_tensors)
    return {"dense": _op("jagged_to_padded_dense")(grad.contiguous(), offsets, ctx.lengths, 0.0, ctx.backend)}


def _to_jagged_fake(dense, total_L, **_):
    if total_L is None:
        total_L = torch.library.get_ctx().new_dynamic_size()
    return dense.new_empty((total_L, dense.shape[-1]))


bridge(
    "dense_to_jagged",
    types={"offsets": "Tensor[]", "total_L": "SymInt?"},
    fake=_to_jagged_fake,
    setup=_to_jagged_setup,
    backward=_to_jagged_backward,
    bf16=True,
)
