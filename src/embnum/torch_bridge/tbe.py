"""Torch side of the TBE family: custom ops and two modules.

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

from .._tbe import TBEOptimizer, tbe_layout
from .._tbe_bounds import bounds_mode
from ..ops.tbe import output_dtype_of, pooling_code
from ._library import bridge, same

_MODES = {"pooling_mode": "str", "per_sample_weights": "Tensor?", "bounds_check_mode": "str"}  # the rest: Tensor
_POOLING_NAMES = ("sum", "mean", "none")
# output_dtype_of's two results by name (``str(dtype)`` costs ~5 us, a dict lookup 0.1)
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}
MODE_CODECS = {  # the NumPy API's rules and errors (tbe_quantized's bridge uses them too)
    "pooling_mode": (lambda x: _POOLING_NAMES[pooling_code(x)], same),
    "output_dtype": (lambda x: _DTYPE_NAMES[output_dtype_of(x)], same),
    "bounds_check_mode": (bounds_mode, same),  # the NumPy API's rule and errors
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
def _forward_fake(weights, weights_offsets, indices, offsets, pooling_mode, output_dtype, **_):
    dtype = torch.float16 if output_dtype == "float16" else torch.float32
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
    ctx.weights_dtype = args["weights"].dtype


def _forward_backward(ctx, grad):
    w, woff, doff, hcs, idx, offs, psw = ctx.saved_tensors
    grads = {}
    g = grad.contiguous()
    if g.dtype not in (torch.float32, torch.float16):
        g = g.float()
    if ctx.needs_input_grad[0]:
        dense = _op("tbe_backward")(g, w, woff, doff, hcs, idx, offs, ctx.pooling, psw, ctx.mode, ctx.backend)
        grads["weights"] = dense.to(ctx.weights_dtype)
    if psw is not None and ctx.needs_input_grad[7]:
        grads["per_sample_weights"] = _op("tbe_grad_per_sample_weights")(
            g, w, woff, doff, hcs, idx, offs, ctx.mode, ctx.backend
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
    types={"bounds_check_mode": "str"},
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


# -- modules -------------------------------------------------------------------
class _Tables(torch.nn.Module):
    """Shared set-up: the layout of ``rows``/``dims``/``feature_table_map`` and the flat weights."""

    def __init__(
        self,
        rows,
        dims,
        feature_table_map=None,
        *,
        pooling_mode="sum",
        weights_dtype=torch.float32,
        output_dtype="float32",
        bounds_check_mode="fatal",
        init_scale=None,
        seed=0,
        backend=None,
    ):
        super().__init__()
        lay = tbe_layout(rows, dims, feature_table_map)
        self.rows, self.dims = [int(r) for r in rows], [int(d) for d in dims]
        n_features = lay.D_offsets.shape[0] - 1
        self.feature_table_map = (
            list(range(n_features)) if feature_table_map is None else [int(t) for t in feature_table_map]
        )
        for name, a in zip(("weights_offsets", "D_offsets", "hash_size_cumsum"), lay.arrays()):
            self.register_buffer(name, torch.from_numpy(a.copy()))
        rng = np.random.default_rng(seed)
        flat = np.empty(lay.num_weights, dtype=np.float32)
        start = 0
        for r, d in zip(rows, dims):  # fbgemm's default init: uniform(+-sqrt(1/rows)) per table
            bound = init_scale if init_scale is not None else float(np.sqrt(1.0 / r))
            flat[start : start + r * d] = rng.uniform(-bound, bound, r * d)
            start += r * d
        self.weights = torch.nn.Parameter(torch.from_numpy(flat).to(weights_dtype))
        self.pooling_mode = _POOLING_NAMES[pooling_code(pooling_mode)]
        self.output_dtype = str(output_dtype_of(output_dtype))
        self.bounds_check_mode = bounds_check_mode
        self.backend = backend

    def layout(self):
        return self.weights_offsets, self.D_offsets, self.hash_size_cumsum

    def extra_repr(self) -> str:
        """One line per table (rows x dim, the features that read it), then the settings."""
        lines = [
            f"table {i}: {r} x {d}, features {[t for t, m in enumerate(self.feature_table_map) if m == i]}"
            for i, (r, d) in enumerate(zip(self.rows, self.dims))
        ]
        settings = (
            f"pooling_mode={self.pooling_mode!r}, weights_dtype={self.weights.dtype}, "
            f"output_dtype={self.output_dtype!r}, bounds_check_mode={self.bounds_check_mode!r}"
        )
        if self.backend is not None:
            settings += f", backend={self.backend!r}"
        return "\n".join([*lines, settings])


class TBE(_Tables):
    """Table-batched embedding bags with plain autograd: ``forward(indices, offsets,
    per_sample_weights=None) -> [B, total_D]`` (``[N, D]`` for ``"none"``); ``weights.grad``
    is the dense float gradient, for any torch optimizer."""

    def forward(self, indices, offsets, per_sample_weights=None):
        from . import tbe_forward

        return tbe_forward(
            self.weights,
            *self.layout(),
            indices,
            offsets,
            self.pooling_mode,
            per_sample_weights,
            output_dtype=self.output_dtype,
            bounds_check_mode=self.bounds_check_mode,
            backend=self.backend,
        )


class _FusedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights, per_sample_weights, module, indices, offsets):
        from . import tbe_forward

        ctx.module = module
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        return tbe_forward(
            weights.detach(),
            *module.layout(),
            indices,
            offsets,
            module.pooling_mode,
            None if per_sample_weights is None else per_sample_weights.detach(),
            output_dtype=module.output_dtype,
            bounds_check_mode=module.bounds_check_mode,
            backend=module.backend,
        )

    @staticmethod
    def backward(ctx, grad):
        indices, offsets, psw = ctx.saved_tensors
        psw_grad = ctx.module.apply_gradient(grad, indices, offsets, psw, psw is not None and ctx.needs_input_grad[1])
        return None, psw_grad, None, None, None


class FusedTBE(_Tables):
    """Table-batched embedding bags trained as fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen``:
    the backward pass applies ``optimizer`` (a :class:`embnum.TBEOptimizer`) to the touched rows
    in place. State: ``momentum1``/``momentum2`` buffers laid out as ``optimizer.state_layout``
    says, and the step counter, the int64 buffer ``iter`` (fbgemm's name; :attr:`step` reads it
    as an int), incremented before each update so Adam's first step is 1. Every piece of state
    is in ``state_dict()``, so a module restored with ``load_state_dict`` resumes training
    exactly where the saved one stopped.
    """

    def __init__(self, rows, dims, feature_table_map=None, *, optimizer: TBEOptimizer, **kw):
        super().__init__(rows, dims, feature_table_map, **kw)
        if not isinstance(optimizer, TBEOptimizer):
            raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        sizes = optimizer.state_sizes(self.weights.shape[0], int(self.hash_size_cumsum[-1]))
        for name in ("momentum1", "momentum2"):
            self.register_buffer(name, torch.zeros(sizes[name]) if name in sizes else None)
        self.register_buffer("iter", torch.zeros((), dtype=torch.int64))

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (the ``iter`` buffer)."""
        return int(self.iter)

    @step.setter
    def step(self, value: int):
        self.iter.fill_(int(value))

    def forward(self, indices, offsets, per_sample_weights=None):
        return _FusedLookup.apply(self.weights, per_sample_weights, self, indices, offsets)

    def apply_gradient(self, grad, indices, offsets, per_sample_weights=None, want_psw_grad=False):
        """The backward pass's optimizer step for the output gradient ``grad`` ``[B, total_D]`` of the
        lookups ``(indices, offsets, per_sample_weights)``: clip, ``step += 1``, update the weights and
        state in place. Returns the gradient of ``per_sample_weights`` when ``want_psw_grad`` (computed
        before the update, from the clipped gradient, as fbgemm), else ``None``. Sharded modules call it
        with gradients gathered from other ranks."""
        from . import tbe_backward_update, tbe_grad_per_sample_weights

        g = grad.contiguous().float()
        opt = self.optimizer
        if opt.max_gradient is not None:
            g = g.clamp(-opt.max_gradient, opt.max_gradient)
        psw = per_sample_weights
        psw_grad = None
        if psw is not None and want_psw_grad:
            psw_grad = tbe_grad_per_sample_weights(
                g,
                self.weights.detach(),
                *self.layout(),
                indices,
                offsets,
                bounds_check_mode=self.bounds_check_mode,
                backend=self.backend,
            )
        self.step += 1
        with torch.no_grad():
            tbe_backward_update(
                g,
                self.weights.detach(),
                *self.layout(),
                indices,
                offsets,
                self.pooling_mode,
                None if psw is None else psw.detach(),
                optimizer=opt,
                momentum1=self.momentum1,
                momentum2=self.momentum2,
                step=self.step if opt.uses_step else None,
                bounds_check_mode=self.bounds_check_mode,
                backend=self.backend,
            )
        return psw_grad

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}\noptimizer={self.optimizer!r}, step={self.step}"
