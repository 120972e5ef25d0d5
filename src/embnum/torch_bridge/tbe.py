"""Torch side of the TBE family: the custom ops (the modules are in :mod:`embnum.modules.tbe`).

* ``tbe_forward`` is differentiable in ``weights`` (dense gradient, ``tbe_backward``)
  and ``per_sample_weights`` (``tbe_grad_per_sample_weights``).
* :class:`TBE`: the plain autograd module. Its flat weights are an
  ``nn.Parameter`` that receives a dense gradient; use any torch optimizer.
* :class:`FusedTBE`: fbgemm's training semantics. The optimizer runs inside the
  backward pass (``tbe_backward_update``), updating the weights and its state in
  place; the weights never get a ``.grad``.

Output sizes depend on the values of ``D_offsets`` (and, for the sparse
gradient, on the ids), so the fake implementations use dynamic sizes.
"""

from __future__ import annotations

import numpy as np
import torch

from .._tbe import TBEOptimizer
from .._tbe_bounds import bounds_mode
from .._tbe_vbe import encode as encode_vbe
from ..ops.tbe import output_dtype_of, pooling_code
from ._library import bridge, same

# batch_size_per_feature_per_rank travels as text ("TxR:b00,b01,..."): a schema has no int[][]
_VBE = {"batch_size_per_feature_per_rank": "str?"}
_MODES = {
    "pooling_mode": "str",
    "per_sample_weights": "Tensor?",
    "bounds_check_mode": "str",
    **_VBE,
}  # the rest: Tensor
_POOLING_NAMES = ("sum", "mean", "none")
# output_dtype_of's two results by name (``str(dtype)`` costs ~5 us, a dict lookup 0.1)
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
MODE_CODECS = {  # the NumPy API's rules and errors (tbe_quantized's bridge uses them too)
    "pooling_mode": (lambda x: _POOLING_NAMES[pooling_code(x)], same),
    "output_dtype": (lambda x: _DTYPE_NAMES[output_dtype_of(x)], same),
    "bounds_check_mode": (bounds_mode, same),  # the NumPy API's rule and errors
    "batch_size_per_feature_per_rank": (encode_vbe, same),  # the NumPy op reads the text form too
}


def _encode_optimizer(o):
    """A TBEOptimizer as its string form (computed once per optimizer: ``TBEOptimizer.encode``);
    an already encoded one passes (the op's decode raises ValueError for any other string)."""
    if isinstance(o, str):
        return o
    if not isinstance(o, TBEOptimizer):
        raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(o).__name__}")
    return o.encode()


def _op(name):
    return getattr(torch.ops.embnum, name).default


def _dyn():
    return torch.library.get_ctx().new_dynamic_size()


def _batch(offsets, weights_offsets):
    return (offsets.shape[0] - 1) // weights_offsets.shape[0]


# -- forward -----------------------------------------------------------------
def _forward_fake(
    weights, weights_offsets, indices, offsets, pooling_mode, output_dtype, batch_size_per_feature_per_rank, **_
):
    dtype = torch.float16 if output_dtype == "float16" else torch.float32
    if batch_size_per_feature_per_rank is not None:  # the flat VBE output
        return weights.new_empty((_dyn(),), dtype=dtype)
    if pooling_mode == "none":
        return weights.new_empty((indices.shape[0], _dyn()), dtype=dtype)
    return weights.new_empty((_batch(offsets, weights_offsets), _dyn()), dtype=dtype)


def _forward_setup(ctx, args, output):
    psw = args["per_sample_weights"]
    ctx.save_for_backward(
        args["weights"],
        args["weights_offsets"],
        args["D_offsets"],
        args["hash_size_cumsum"],
        args["indices"],
        args["offsets"],
        psw,
    )
    ctx.pooling, ctx.mode, ctx.backend = args["pooling_mode"], args["bounds_check_mode"], args["backend"]
    ctx.vbe = args["batch_size_per_feature_per_rank"]
    ctx.weights_dtype = args["weights"].dtype


def _forward_backward(ctx, grad):
    w, woff, doff, hcs, idx, offs, psw = ctx.saved_tensors
    grads = {}
    g = grad.contiguous()
    if g.dtype not in (torch.float32, torch.float16):
        g = g.float()
    if ctx.needs_input_grad[0]:
        dense = _op("tbe_backward")(g, w, woff, doff, hcs, idx, offs, ctx.pooling, psw, ctx.mode, ctx.vbe, ctx.backend)
        grads["weights"] = dense.to(ctx.weights_dtype)
    if psw is not None and ctx.needs_input_grad[7]:
        grads["per_sample_weights"] = _op("tbe_grad_per_sample_weights")(
            g, w, woff, doff, hcs, idx, offs, ctx.mode, ctx.vbe, ctx.backend
        )
    return grads


bridge(
    "tbe_forward",
    types={**_MODES, "output_dtype": "str"},
    fake=_forward_fake,
    setup=_forward_setup,
    backward=_forward_backward,
    codecs=MODE_CODECS,
    grad_dtype=torch.float32,  # TBE weights are float32/float16 (the op is linear, so float32 gradchecks hold)
)

# -- gradients -----------------------------------------------------------------
bridge(
    "tbe_backward",
    types=_MODES,
    fake=lambda weights, **_: weights.new_empty(weights.shape, dtype=torch.float32),
    codecs=MODE_CODECS,
)
bridge(
    "tbe_backward_sparse",
    types={**_MODES, "max_rows": "int?"},
    returns="(Tensor, Tensor, Tensor)",
    fake=lambda weights, indices, **_: (
        indices.new_empty((_dyn(),), dtype=torch.int64),
        weights.new_empty((_dyn(),), dtype=torch.float32),
        indices.new_empty((_dyn(),), dtype=torch.int64),
    ),
    codecs=MODE_CODECS,
)
bridge(
    "tbe_grad_per_sample_weights",
    types={"bounds_check_mode": "str", **_VBE},
    fake=lambda weights, indices, **_: weights.new_empty(indices.shape, dtype=torch.float32),
    codecs=MODE_CODECS,
)
bridge(
    "tbe_backward_update",
    types={**_MODES, "optimizer": "str", "momentum1": "Tensor?", "momentum2": "Tensor?", "step": "int?"},
    returns="()",
    fake=lambda **_: None,
    codecs={**MODE_CODECS, "optimizer": (_encode_optimizer, TBEOptimizer.decode)},
)
