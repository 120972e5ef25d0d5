"""Torch side of the jagged family: schema types, fake shapes, gradients.

The gradients are embnum ops themselves (``dense_to_jagged`` for
``jagged_to_padded_dense`` and back, ``segment_sum_csr_backward`` for
``segment_sum_csr``), called through the bridge on the forward's backend, so
they run wherever the forward runs.
"""

from __future__ import annotations

import torch

from ._library import bridge

_INDEX = {"lengths": "Tensor"}


def _op(name):
    return getattr(torch.ops.embnum, name).default


def _like_index(shape_fn):
    return lambda t, backend=None: t.new_empty(shape_fn(t))


bridge("complete_cumsum", types=_INDEX, fake=_like_index(lambda t: (*t.shape[:-1], t.shape[-1] + 1)))
bridge("exclusive_cumsum", types=_INDEX, fake=_like_index(lambda t: t.shape))
bridge("inclusive_cumsum", types=_INDEX, fake=_like_index(lambda t: t.shape))
bridge(
    "offsets_range",
    types={"offsets": "Tensor", "range_size": "SymInt"},
    fake=lambda offsets, range_size, backend=None: offsets.new_empty((range_size,)),
)


# -- segment sums ------------------------------------------------------------
def _segment_sum_setup(ctx, args, output):
    ctx.save_for_backward(args["csr_seg"])
    ctx.batch_size, ctx.num_values, ctx.backend = args["batch_size"], args["values"].shape[0], args["backend"]


def _segment_sum_backward(ctx, grad):
    (csr_seg,) = ctx.saved_tensors
    g = _op("segment_sum_csr_backward")(ctx.batch_size, csr_seg, grad.contiguous(), ctx.num_values, ctx.backend)
    return {"values": g}


_CSR = {"batch_size": "SymInt", "csr_seg": "Tensor"}
bridge(
    "segment_sum_csr",
    types={**_CSR, "values": "Tensor"},
    fake=lambda batch_size, csr_seg, values, backend=None: values.new_empty((csr_seg.shape[0] - 1,)),
    setup=_segment_sum_setup,
    backward=_segment_sum_backward,
    bf16=True,
)
bridge(
    "segment_sum_csr_backward",
    types={**_CSR, "grad_output": "Tensor", "num_values": "SymInt"},
    fake=lambda batch_size, csr_seg, grad_output, num_values, backend=None: grad_output.new_empty((num_values,)),
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


def _to_dense_fake(values, offsets, max_lengths, padding_value=0.0, backend=None):
    return values.new_empty((offsets[0].shape[0] - 1, *max_lengths, *values.shape[1:]))


_TO_DENSE = dict(setup=_to_dense_setup, backward=_to_dense_backward, bf16=True)
bridge(
    "jagged_to_padded_dense",
    types={"values": "Tensor", "offsets": "Tensor[]", "max_lengths": "SymInt[]", "padding_value": "float"},
    fake=_to_dense_fake,
    **_TO_DENSE,
)
bridge(
    "jagged_1d_to_dense",
    types={"values": "Tensor", "offsets": "Tensor", "max_sequence_length": "SymInt", "padding_value": "float"},
    fake=lambda values, offsets, L, padding_value=0, backend=None: values.new_empty((offsets.shape[0] - 1, L)),
    **_TO_DENSE,
)
bridge(
    "jagged_2d_to_dense",
    types={"values": "Tensor", "offsets": "Tensor", "max_sequence_length": "SymInt"},
    fake=lambda values, offsets, L, backend=None: values.new_empty((offsets.shape[0] - 1, L, values.shape[1])),
    **_TO_DENSE,
)


# -- dense -> jagged ---------------------------------------------------------
def _to_jagged_setup(ctx, args, output):
    ctx.save_for_backward(*args["offsets"])
    ctx.lengths, ctx.backend = list(args["dense"].shape[1:-1]), args["backend"]


def _to_jagged_backward(ctx, grad):
    """Adjoint of ``dense_to_jagged``: ``jagged_to_padded_dense`` of the gradient, padding 0."""
    offsets = list(ctx.saved_tensors)
    return {"dense": _op("jagged_to_padded_dense")(grad.contiguous(), offsets, ctx.lengths, 0.0, ctx.backend)}


def _to_jagged_fake(dense, offsets, total_L=None, backend=None):
    if total_L is None:
        total_L = torch.library.get_ctx().new_dynamic_size()
    return dense.new_empty((total_L, dense.shape[-1]))


bridge(
    "dense_to_jagged",
    types={"dense": "Tensor", "offsets": "Tensor[]", "total_L": "SymInt?"},
    fake=_to_jagged_fake,
    setup=_to_jagged_setup,
    backward=_to_jagged_backward,
    bf16=True,
)
