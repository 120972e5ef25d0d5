"""Torch side of the keyed_tensor family: schema types, fake shapes, gradients, and
:class:`PermuteMultiEmbedding`, the module that regroups KeyedTensors in training.

Gradients are embnum ops themselves: ``permute_pooled_embs`` with the plain
and inverse lists swapped, and ``permute_multi_embedding_backward`` (the true
adjoint: copies of a key summed in permutes row order, unused keys 0) for
``permute_multi_embedding`` and ``regroup_keyed_tensor``. They run on the
forward's backend.

bfloat16: forwards move bits (exact). The autograd backward adds in float32
and rounds to bfloat16 after every addition, as fbgemm's CPU kernel does
(:func:`_bf16_backward`). ``permute_multi_embedding_backward`` called directly
on bfloat16 tensors sums in float32 and rounds once.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _permute_plan
from ..ops.keyed_tensor import kt_regroup_arguments as _kt_regroup_numpy
from ._library import bridge, user_function


def _op(name):
    return getattr(torch.ops.embnum, name).default


# -- permute_pooled_embs -------------------------------------------------------------
_POOLED_LISTS = ("offset_dim_list", "permute_list", "inv_offset_dim_list", "inv_permute_list")


def _pooled_setup(ctx, args, output):
    ctx.save_for_backward(*(args[k] for k in _POOLED_LISTS))
    ctx.backend = args["backend"]


def _pooled_backward(ctx, grad):
    offs, perm, inv_offs, inv_perm = ctx.saved_tensors
    return {"pooled_embs": _op("permute_pooled_embs")(grad.contiguous(), inv_offs, inv_perm, offs, perm, ctx.backend)}


bridge(
    "permute_pooled_embs",
    fake=lambda pooled_embs, **_: torch.empty_like(pooled_embs),
    setup=_pooled_setup,
    backward=_pooled_backward,
    bf16=True,
)


# -- kt_regroup_arguments --------------------------------------------------------------
def _kt_fake(embs, keys, lengths, groups, **_):
    permutes, in_shapes, out_shapes, out_lengths = _kt_regroup_numpy(None, keys, lengths, groups)
    device = embs.device if embs is not None else torch.device("cpu")
    return (
        torch.empty(permutes.shape, dtype=torch.int32, device=device),
        torch.empty(in_shapes.shape, dtype=torch.int32, device=device),
        torch.empty(out_shapes.shape, dtype=torch.int32, device=device),
        out_lengths,
    )


_KEYS = {"keys": "str[][]", "lengths": "int[][]", "groups": "str[][]"}
bridge(
    "kt_regroup_arguments",
    types={"embs": "Tensor?", **_KEYS},
    returns="(Tensor, Tensor, Tensor, int[])",
    fake=_kt_fake,
    bf16=True,
)


# -- permute_multi_embedding and its backward -----------------------------------------
def _zeros(ctx, shape):
    return torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)


def _regroup_backward(ctx, grads, permutes, in_shapes, out_shapes):
    """Gradients of every input: ``permute_multi_embedding_backward`` of the output gradients."""
    if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
        grads = grads[0]
    if not ctx.out_shapes_list:  # no outputs: nothing flows back
        return {"pooled_embs": [_zeros(ctx, (ctx.B, w)) for w in ctx.in_lengths]}
    full = [g.contiguous() if g is not None else _zeros(ctx, (ctx.B, w)) for g, w in zip(grads, ctx.out_shapes_list)]
    if ctx.dtype == torch.bfloat16:
        return {"pooled_embs": _bf16_backward(full, permutes, in_shapes, out_shapes, ctx.in_lengths, ctx.backend)}
    return {
        "pooled_embs": user_function("permute_multi_embedding_backward")(
            full, permutes, in_shapes, out_shapes, ctx.in_lengths, backend=ctx.backend
        )
    }


def _bf16_backward(grads, permutes, in_shapes, out_shapes, in_lengths, backend):
    """bfloat16 gradients rounded after every addition, in permutes row order.

    Each input column range is split into slots (``_permute_plan.backward_indexed``);
    level ``k`` holds the ``k``-th source of every slot. Level 0 is rounded to bfloat16,
    each later level is added in float32 to the running sum and rounded again. Each
    level is a ``permute_multi_embedding_backward`` of float32 gradients (exact: at
    most one source per column), so this runs on the forward's backend.
    """
    rows = np.asarray(permutes.detach().cpu(), dtype=np.int64)
    slots, srcs = _permute_plan.backward_indexed(rows, in_lengths)
    g32 = [g.float() for g in grads]
    depth = int((slots[:, 4] - slots[:, 3]).max()) if len(slots) else 0
    acc = None
    for k in range(max(depth, 1)):
        level = [
            (i, int(srcs[k0 + k, 0]), x0, int(srcs[k0 + k, 1]), n, 0)
            for i, x0, n, k0, k1 in slots.tolist()
            if k0 + k < k1
        ]
        lv = torch.tensor(level, dtype=torch.int64).reshape(-1, 6).to(permutes.device)
        part = _op("permute_multi_embedding_backward")(g32, lv, in_shapes, out_shapes, in_lengths, backend)
        acc = (
            [p.to(torch.bfloat16) for p in part]
            if acc is None
            else [(a.float() + p).to(torch.bfloat16) for a, p in zip(acc, part)]
        )
    return acc


def _remember_inputs(ctx, args, output):
    embs = args["pooled_embs"]
    ctx.B, ctx.in_lengths, ctx.backend = embs[0].shape[0], [int(x.shape[1]) for x in embs], args["backend"]
    ctx.dtype, ctx.device = embs[0].dtype, embs[0].device
    ctx.out_shapes_list = [int(o.shape[1]) for o in output]


def _pme_setup(ctx, args, output):
    _remember_inputs(ctx, args, output)
    ctx.save_for_backward(args["permutes"], args["in_shapes"], args["out_shapes"])


def _pme_backward(ctx, *grads):
    permutes, in_shapes, out_shapes = ctx.saved_tensors
    return _regroup_backward(ctx, grads, permutes, in_shapes, out_shapes)


def _columns(like, widths):
    """``[B, w]`` for each width ``w``, ``B`` and dtype of ``like[0]`` (the list ops' fakes)."""
    return [like[0].new_empty((like[0].shape[0], w)) for w in widths]


bridge(
    "permute_multi_embedding",
    types={"pooled_embs": "Tensor[]", "out_lengths": "SymInt[]"},
    returns="Tensor[]",
    fake=lambda pooled_embs, out_lengths, **_: _columns(pooled_embs, out_lengths),
    setup=_pme_setup,
    backward=_pme_backward,
    bf16=True,
)
bridge(
    "permute_multi_embedding_backward",
    types={"grad_outputs": "Tensor[]", "in_lengths": "SymInt[]"},
    returns="Tensor[]",
    fake=lambda grad_outputs, in_lengths, **_: _columns(grad_outputs, in_lengths),
    bf16=True,
)


# -- regroup_keyed_tensor ------------------------------------------------------------
def _regroup_fake(pooled_embs, keys, lengths, groups, **_):
    return _columns(pooled_embs, _kt_regroup_numpy(None, keys, lengths, groups)[3])


def _regroup_setup(ctx, args, output):
    _remember_inputs(ctx, args, output)
    ctx.keys = (args["keys"], args["lengths"], args["groups"])


def _regroup_kt_backward(ctx, *grads):
    permutes, in_shapes, out_shapes, _ = _op("kt_regroup_arguments")(None, *ctx.keys, None)
    return _regroup_backward(ctx, grads, *(a.to(ctx.device) for a in (permutes, in_shapes, out_shapes)))


bridge(
    "regroup_keyed_tensor",
    types={"pooled_embs": "Tensor[]", **_KEYS},
    returns="Tensor[]",
    fake=_regroup_fake,
    setup=_regroup_setup,
    backward=_regroup_kt_backward,
    bf16=True,
)
