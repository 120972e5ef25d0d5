"""Torch side of the index_select family: schema types, fake shapes, gradients.

Both forwards are gathers, so the gradient of the gathered input is the adjoint scatter-add:
``batch_index_select_dim0_backward`` (repeats added in the order of ``indices``, rounded
once). The group op's gradient runs it once per member, each member viewed as one table of
``[rows, prod(shape[1:])]``. bfloat16 crosses by the bridge's one rule (moved bits forward,
sums in float32 rounded once backward). ``jagged_index_select_2d`` has no gradient (fbgemm's
operator has none either); its number of rows depends on the data unless
``num_dense_output_rows`` gives it.
"""

from __future__ import annotations

import math

import torch

from ._library import bridge, user_function


# -- group_index_select_dim0 --------------------------------------------------------------
def _group_setup(ctx, args, output):
    inputs = args["input_group"]
    ctx.shapes = [tuple(a.shape) for a in inputs]
    ctx.floats = [a.dtype.is_floating_point for a in inputs]
    ctx.backend = args["backend"]
    ctx.save_for_backward(*args["indices_group"])


def _group_backward(ctx, *grads):
    if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
        grads = grads[0]
    indices = ctx.saved_tensors
    backward = user_function("batch_index_select_dim0_backward")
    out = []
    for g, idx, shape, is_float in zip(grads, indices, ctx.shapes, ctx.floats):
        if not is_float or g is None:
            out.append(None)
            continue
        width = math.prod(shape[1:])
        n = idx.shape[0]
        flat = backward(g.reshape(-1), idx, [n], [shape[0]], [width], backend=ctx.backend)
        out.append(flat.reshape(shape))
    return {"input_group": out}


bridge(
    "group_index_select_dim0",
    types={"input_group": "Tensor[]", "indices_group": "Tensor[]"},
    returns="Tensor[]",
    fake=lambda input_group, indices_group, **_: [
        a.new_empty((i.shape[0], *a.shape[1:])) for a, i in zip(input_group, indices_group)
    ],
    setup=_group_setup,
    backward=_group_backward,
    bf16=True,
)


# -- batch_index_select_dim0 and its adjoint ------------------------------------------------------
_BATCH_TYPES = {
    "input_num_indices": "SymInt[]",
    "input_rows": "SymInt[]",
    "input_columns": "SymInt[]",
    "permute_output_dim_0_1": "bool",
}


def _batch_setup(ctx, args, output):
    ctx.lists = [args[k] for k in ("input_num_indices", "input_rows", "input_columns", "permute_output_dim_0_1")]
    ctx.backend = args["backend"]
    ctx.save_for_backward(args["indices"])


def _batch_backward(ctx, grad):
    (indices,) = ctx.saved_tensors
    return {
        "inputs": user_function("batch_index_select_dim0_backward")(
            grad.contiguous(), indices, *ctx.lists, backend=ctx.backend
        )
    }


bridge(
    "batch_index_select_dim0",
    types=_BATCH_TYPES,
    fake=lambda inputs, input_num_indices, input_columns, **_: inputs.new_empty(
        (sum(n * c for n, c in zip(input_num_indices, input_columns)),)
    ),
    setup=_batch_setup,
    backward=_batch_backward,
    bf16=True,
)
bridge(
    "batch_index_select_dim0_backward",
    types=_BATCH_TYPES,
    fake=lambda grad_output, input_rows, input_columns, **_: grad_output.new_empty(
        (sum(r * c for r, c in zip(input_rows, input_columns)),)
    ),
    bf16=True,
)


# -- jagged_index_select_2d ---------------------------------------------------------------------
def _jagged_select_fake(values, num_dense_output_rows=None, **_):
    rows = num_dense_output_rows
    if rows is None:
        rows = torch.library.get_ctx().new_dynamic_size()
    return values.new_empty((rows, values.shape[1]))


bridge(
    "jagged_index_select_2d",
    types={"num_dense_output_rows": "SymInt?"},
    fake=_jagged_select_fake,
    bf16=True,
)
