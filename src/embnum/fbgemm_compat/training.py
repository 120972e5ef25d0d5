"""Stand-ins for fbgemm_gpu's training TBE modules (``split_table_batched_embeddings_ops_training``),
on embnum's ``tbe_forward`` / ``tbe_backward_update`` ops.

* :class:`SplitTableBatchedEmbeddingBagsCodegen`: the optimizer runs inside the backward pass and
  updates the touched rows and the optimizer state in place (the weights never get a ``.grad``).
* :class:`DenseTableBatchedEmbeddingBagsCodegen`: the flat weights are a parameter with a dense
  gradient (TorchRec's data-parallel tables).

Both take fbgemm's constructor arguments. Those embnum implements are used; every other one is
accepted only at fbgemm's default value and rejected (``ValueError`` naming it) otherwise. The flat
layout (``weights_offsets``, ``D_offsets``, ``hash_size_cumsum``, the state arrays) is fbgemm's, so
``split_embedding_weights`` / ``split_optimizer_states`` return the same views fbgemm's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._tbe import TBEOptimizer, tbe_layout
from .._validate import flag, integer
from ..modules.tbe import StepCount, fused_update
from . import _checks
from ._checks import enum
from .configs import (
    BoundsCheckMode,
    CacheAlgorithm,
    ComputeDevice,
    EmbeddingLocation,
    EmbOptimType,
    PoolingMode,
    SparseType,
    WeightDecayMode,
)

__all__ = ["DenseTableBatchedEmbeddingBagsCodegen", "RESParams", "SplitTableBatchedEmbeddingBagsCodegen"]


@dataclass
class RESParams:
    """Raw-embedding-streaming settings (read only when ``enable_raw_embedding_streaming``, which embnum refuses)."""

    res_server_port: int = 0
    res_store_shards: int = 1
    table_names: list[str] = field(default_factory=list)
    table_offsets: list[int] = field(default_factory=list)
    table_sizes: list[int] = field(default_factory=list)


_KINDS = {  # fbgemm optimizer -> embnum TBEOptimizer kind
    EmbOptimType.EXACT_SGD: "sgd",
    EmbOptimType.EXACT_ADAGRAD: "adagrad",
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: "rowwise_adagrad",
    EmbOptimType.ADAM: "adam",
    EmbOptimType.LAMB: "lamb",
    EmbOptimType.PARTIAL_ROWWISE_ADAM: "partial_rowwise_adam",
    EmbOptimType.PARTIAL_ROWWISE_LAMB: "partial_rowwise_lamb",
    EmbOptimType.LARS_SGD: "lars_sgd",
}
# get_optimizer_state's names for split_optimizer_states' arrays, per kind (fbgemm's)
_STATE_NAMES = {
    "sgd": (),
    "adagrad": ("sum",),
    "rowwise_adagrad": ("sum",),
    "lars_sgd": ("momentum_buffer",),
    "adam": ("exp_avg", "exp_avg_sq"),
    "lamb": ("exp_avg", "exp_avg_sq"),
    "partial_rowwise_adam": ("exp_avg", "exp_avg_sq"),
    "partial_rowwise_lamb": ("exp_avg", "exp_avg_sq"),
}
_DECAY = {WeightDecayMode.L2: "l2", WeightDecayMode.DECOUPLE: "decoupled"}
_POOLING = {PoolingMode.SUM: "sum", PoolingMode.MEAN: "mean", PoolingMode.NONE: "none"}
_BOUNDS = {
    BoundsCheckMode.FATAL: "fatal",
    BoundsCheckMode.WARNING: "warning",
    BoundsCheckMode.IGNORE: "ignore",
    BoundsCheckMode.NONE: "none",
    BoundsCheckMode.V2_FATAL: "fatal",
    BoundsCheckMode.V2_WARNING: "warning",
    BoundsCheckMode.V2_IGNORE: "ignore",
}
_FLOATS = {SparseType.FP32: torch.float32, SparseType.FP16: torch.float16}

# fbgemm arguments embnum takes only at fbgemm's default (the cache settings are read only for
# MANAGED_CACHING tables, which are refused: any value is accepted for them, as fbgemm ignores them too)
_DEFAULT_ONLY = {
    "record_cache_metrics": None,
    "gather_uvm_cache_stats": False,
    "ensemble_mode": None,
    "emainplace_mode": None,
    "counter_based_regularization": None,
    "cowclip_regularization": None,
    "uvm_non_rowwise_momentum": False,
    "use_experimental_tbe": False,
    "prefetch_pipeline": False,
    "stats_reporter_config": None,
    "optimizer_state_dtypes": None,
    "multipass_prefetch_config": None,
    "global_weight_decay": None,
    "uvm_host_mapped": False,
    "extra_optimizer_config": None,
    "tbe_input_multiplexer_config": None,
    "embedding_table_index_type": torch.int64,
    "embedding_table_offset_type": torch.int64,
    "enable_raw_embedding_streaming": False,
    "is_qr_tbe": False,
    "preallocated_host_buffers": None,
}


def _equal(value, default) -> bool:
    """``value == default`` as one bool (a tensor or an array compared with a default is not its default)."""
    try:
        return bool(value == default)
    except (RuntimeError, TypeError, ValueError):
        return False


def check_defaults(cls_name: str, given: dict, defaults: dict, ignored=()) -> None:
    """``ValueError`` naming the first fbgemm argument in ``given`` that is not at its default;
    ``TypeError`` for a name fbgemm's constructor does not have."""
    for name, value in given.items():
        if name in ignored:
            continue
        if name not in defaults:
            raise TypeError(f"{cls_name}() got an unexpected keyword argument {name!r}")
        default = defaults[name]
        if value is not default and not _equal(value, default):
            raise ValueError(
                f"{cls_name}: {name}={value!r} is not supported by embnum's fbgemm stand-in "
                f"(only fbgemm's default {default!r}; docs/torchrec-without-fbgemm.md)"
            )


def _float_type(cls_name, name, value) -> torch.dtype:
    if isinstance(value, SparseType):
        st = value
    else:
        try:
            st = SparseType.from_int(integer(name, value, what="a SparseType"))
        except ValueError:
            raise ValueError(f"{cls_name}: {name}={value!r} is not a SparseType") from None
    if st not in _FLOATS:
        raise ValueError(f"{cls_name}: {name}={st} is not supported by embnum (FP32 or FP16)")
    return _FLOATS[st]


def _split_views(flat, rows, dims, rowwise=False):
    """Per-table views of a flat array laid out table after table: ``[rows, dim]``, or ``[rows]``
    for a row-wise state."""
    views, start = [], 0
    for r, d in zip(rows, dims):
        n = r if rowwise else r * d
        part = flat.detach()[start : start + n]
        views.append(part if rowwise else part.view(r, d))
        start += n
    return views


class _Layout(_checks.CheckedState):
    """What both modules share: the tables' layout buffers (fbgemm's names and dtypes) and settings."""

    table_names = None  # the training module's names of its tables, where TorchRec gave them

    def _set_layout(self, rows, dims, feature_table_map, pooling_mode, output_dtype, device):
        lay = tbe_layout(rows, dims, feature_table_map)
        self.rows, self.dims = list(rows), list(dims)
        self.feature_table_map = _checks.table_map(feature_table_map, len(rows))
        self.pooling_mode = enum("pooling_mode", pooling_mode, PoolingMode)
        self._pooling = _POOLING[self.pooling_mode]
        out = _float_type(type(self).__name__, "output_dtype", output_dtype)
        self._output = "float16" if out == torch.float16 else "float32"
        self.output_dtype = SparseType.from_dtype(out).as_int()  # fbgemm keeps the int code
        for name, a in lay.by_name().items():
            self.register_buffer(name, torch.from_numpy(a.copy()).to(device))
        self.total_D = int(lay.D_offsets[-1])
        self.max_D = max(dims)
        self.num_weights = lay.num_weights
        self.current_device = torch.device(device)

    def _layout(self):
        return self.weights_offsets, self.D_offsets, self.hash_size_cumsum

    def _state_rules(self) -> dict:
        """The layout is the construction's (a checkpoint must agree); the weights finite floats."""
        rules = {n: (getattr(self, n), "layout") for n in ("weights_offsets", "D_offsets", "hash_size_cumsum")}
        rules["weights"] = (self.weights, "weights")
        return rules

    def _lookup_error(self, err, indices, offsets):
        """``err`` (the op's) in the user's terms when an id is outside its table (the table's name
        where ``table_names`` gave one), else ``None``."""
        return _checks.lookup_error(err, indices, offsets, self.rows, self.feature_table_map, self.table_names)


class _FusedLookup(torch.autograd.Function):
    """Forward: the pooled lookup; backward: the module's fused optimizer step (no weight gradient)."""

    @staticmethod
    def forward(ctx, placeholder, per_sample_weights, module, indices, offsets, feature_requires_grad, batch_sizes):
        ctx.module, ctx.feature_requires_grad, ctx.batch_sizes = module, feature_requires_grad, batch_sizes
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        return module._lookup(indices, offsets, per_sample_weights, batch_sizes)

    @staticmethod
    def backward(ctx, grad):
        indices, offsets, psw = ctx.saved_tensors
        want = psw is not None and ctx.needs_input_grad[1]
        psw_grad = ctx.module._apply_gradient(
            grad, indices, offsets, psw, want, ctx.feature_requires_grad, ctx.batch_sizes
        )
        return None, psw_grad, None, None, None, None, None


class SplitTableBatchedEmbeddingBagsCodegen(_Layout):
    """fbgemm's training TBE: ``forward(indices, offsets, per_sample_weights=None,
    feature_requires_grad=None, batch_size_per_feature_per_rank=None)`` returns float32 (or float16:
    ``output_dtype``) ``[B, total_D]`` (``[N, D]`` for ``PoolingMode.NONE``; with
    ``batch_size_per_feature_per_rank``, TorchRec's VBE, the flat rank-major output of
    :func:`embnum.tbe_forward`); backward applies the
    fused optimizer (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD, ADAM, LAMB, PARTIAL_ROWWISE_ADAM,
    PARTIAL_ROWWISE_LAMB, LARS_SGD) to the rows the batch touched.

    embedding_specs: ``(rows, dim, EmbeddingLocation, ComputeDevice)`` per table; locations
    ``DEVICE``/``HOST`` (UVM and cached placements raise ``NotImplementedError``). Weights are
    float32 or float16 (``weights_precision``), zeros until set (fbgemm's start).
    """

    def __init__(
        self,
        embedding_specs,
        feature_table_map=None,
        *,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
        optimizer=EmbOptimType.EXACT_SGD,
        stochastic_rounding=True,
        gradient_clipping=False,
        max_gradient=1.0,
        max_norm=0.0,
        learning_rate=0.01,
        eps=1.0e-8,
        momentum=0.9,
        weight_decay=0.0,
        weight_decay_mode=WeightDecayMode.NONE,
        eta=0.001,
        beta1=0.9,
        beta2=0.999,
        pooling_mode=PoolingMode.SUM,
        device=None,
        bounds_check_mode=BoundsCheckMode.WARNING,
        table_names=None,
        embedding_shard_info=None,
        res_params=None,
        cache_algorithm=CacheAlgorithm.LRU,
        cache_load_factor=0.2,
        cache_sets=0,
        cache_reserved_memory=0.0,
        cache_precision=None,
        enforce_hbm=False,
        **fbgemm_options,
    ):
        super().__init__()
        name = type(self).__name__
        check_defaults(name, fbgemm_options, _DEFAULT_ONLY)
        rows, dims, device = self._set_tables(embedding_specs, device)
        self._set_layout(rows, dims, feature_table_map, pooling_mode, output_dtype, device)
        self.weights_precision = weights_precision
        dtype = _float_type(name, "weights_precision", weights_precision)
        self._set_rule(optimizer, dtype, device, stochastic_rounding, gradient_clipping, enforce_hbm)
        if table_names is not None and (
            not isinstance(table_names, (list, tuple))
            or len(table_names) != len(rows)
            or not all(isinstance(n, str) for n in table_names)
        ):
            raise TypeError(f"{name}: table_names must be None or one str per table ({len(rows)}), got {table_names!r}")
        self.table_names = table_names
        self.embedding_shard_info = embedding_shard_info
        self.res_params = res_params
        self.bounds_check_mode_int = int(enum("bounds_check_mode", bounds_check_mode, BoundsCheckMode))
        self._bounds = _BOUNDS[BoundsCheckMode(self.bounds_check_mode_int)]
        self._set_hyper(
            gradient_clipping,
            max_gradient,
            max_norm,
            weight_decay,
            weight_decay_mode,
            learning_rate=learning_rate,
            eps=eps,
            beta1=beta1,
            beta2=beta2,
            eta=eta,
            momentum=momentum,
        )
        self._allocate(rows, dims, dtype, device)

    # -- construction steps, in the order __init__ runs them -----------------------
    def _set_tables(self, embedding_specs, device):
        """Check ``embedding_specs`` (DEVICE/HOST tables, no MTIA) and pick the device (CUDA when a
        table computes there, unless ``device`` says): ``(rows, dims, device)``."""
        name = type(self).__name__
        self.embedding_specs = _checks.specs(name, embedding_specs, ("rows", "dim", "location", "compute_device"))
        rows = [int(s[0]) for s in self.embedding_specs]
        dims = [int(s[1]) for s in self.embedding_specs]
        locations = {enum("embedding_specs location", s[2], EmbeddingLocation) for s in self.embedding_specs}
        uvm = locations - {EmbeddingLocation.DEVICE, EmbeddingLocation.HOST}
        if uvm:
            raise NotImplementedError(
                f"{name}: embedding location {sorted(uvm)[0].name} (UVM / embedding cache) is not available in "
                "embnum's fbgemm stand-in: place tables on DEVICE or HOST"
            )
        computes = {enum("embedding_specs compute_device", s[3], ComputeDevice) for s in self.embedding_specs}
        if ComputeDevice.MTIA in computes:
            raise NotImplementedError(f"{name}: ComputeDevice.MTIA is not available in embnum's fbgemm stand-in")
        if device is None:
            device = torch.device("cuda" if ComputeDevice.CUDA in computes else "cpu")
        device = _checks.device("device", device)
        self.use_cpu = device.type == "cpu"
        return rows, dims, device

    def _set_rule(self, optimizer, dtype, device, stochastic_rounding, gradient_clipping, enforce_hbm):
        """Check the flags and the optimizer (one embnum implements; FP16 weights on a GPU only
        without stochastic rounding)."""
        name = type(self).__name__
        for flag_name, value in (
            ("stochastic_rounding", stochastic_rounding),
            ("gradient_clipping", gradient_clipping),
            ("enforce_hbm", enforce_hbm),
        ):
            flag(flag_name, value)
        if dtype == torch.float16 and stochastic_rounding and not self.use_cpu:
            raise ValueError(
                f"{name}: stochastic_rounding=True with FP16 weights on {device} is not supported by embnum "
                "(it rounds updates to nearest, as fbgemm's CPU build does; fbgemm's GPU build rounds "
                "stochastically): pass stochastic_rounding=False"
            )
        self.stochastic_rounding = stochastic_rounding
        if not isinstance(optimizer, EmbOptimType) or optimizer not in _KINDS:  # ([] is unhashable)
            raise ValueError(
                f"{name}: optimizer={optimizer} is not supported by embnum (one of {', '.join(o.name for o in _KINDS)})"
            )
        self.optimizer = optimizer
        self._kind = _KINDS[optimizer]

    def _set_hyper(self, gradient_clipping, max_gradient, max_norm, weight_decay, weight_decay_mode, **hyper):
        """The hyper-parameters (``hyper``: learning_rate, eps, beta1, beta2, eta, momentum) and the
        embnum optimizer built from them."""
        # max_norm 0 is fbgemm's "off"; the rest TBEOptimizer checks under fbgemm's names
        norm = _checks.number("max_norm", max_norm, minimum=0.0)
        self._hyper = dict(
            **hyper,
            max_gradient=max_gradient if gradient_clipping else None,
            max_norm=norm if norm > 0 else None,
        )
        self.gradient_clipping, self.max_gradient, self.max_norm = gradient_clipping, max_gradient, max_norm
        self.weight_decay = _checks.number("weight_decay", weight_decay, minimum=0.0)
        self.weight_decay_mode = weight_decay_mode
        self._tbe_optimizer = self._build_optimizer()
        self._hyper.update(learning_rate=self._tbe_optimizer.learning_rate)
        self.learning_rate_tensor = torch.tensor(self._tbe_optimizer.learning_rate, dtype=torch.float32)

    def _allocate(self, rows, dims, dtype, device):
        """The weights (zeros, fbgemm's start), the optimizer state and the step count, under
        fbgemm's names for the placement (``*_dev`` on a GPU, ``*_host`` on the CPU)."""
        placement = EmbeddingLocation.DEVICE if device.type != "cpu" else EmbeddingLocation.HOST
        held, empty = (
            ("weights_dev", "weights_host")
            if placement == EmbeddingLocation.DEVICE
            else ("weights_host", "weights_dev")
        )
        flat = _checks.allocate(
            "weights", lambda: torch.zeros(self.num_weights, dtype=dtype, device=device), self.num_weights
        )
        self.register_parameter(held, torch.nn.Parameter(flat))
        self.register_buffer(empty, torch.zeros(0, dtype=dtype, device=device))
        self.register_buffer("weights_uvm", torch.zeros(0, dtype=dtype, device=device))
        self._held = held
        T = len(self.feature_table_map)
        self.register_buffer("weights_placements", torch.full((T,), int(placement), dtype=torch.int32, device=device))
        self.weights_physical_offsets = [int(x) for x in _table_starts(rows, dims)]
        self.weights_physical_placements = [int(placement)] * len(rows)
        sizes = self._tbe_optimizer.state_sizes(self.num_weights, int(sum(rows)))
        for state in ("momentum1", "momentum2"):
            if state in sizes:
                n = sizes[state]
                buf = _checks.allocate(f"optimizer state {state}", lambda n=n: torch.zeros(n, device=device), n)
                self.register_buffer(f"{state}_{held[8:]}", buf)
        self.register_buffer("iter", torch.zeros(1, dtype=torch.int64, device=device))
        self._steps = StepCount(self.iter, 0)
        # the parameter that makes autograd call backward (the fused update) even where no input needs a gradient
        self.placeholder_autograd_tensor = torch.nn.Parameter(torch.zeros(0, device=device))

    # -- the optimizer -----------------------------------------------------------
    def _build_optimizer(self) -> TBEOptimizer:
        kind, wd, mode = (
            self._kind,
            self.weight_decay,
            enum("weight_decay_mode", self.weight_decay_mode, WeightDecayMode),
        )
        decay = "none"
        if wd > 0:
            implements = {"rowwise_adagrad": ("l2", "decoupled"), "lars_sgd": ("l2",)}.get(kind, ("decoupled",))
            if kind in ("sgd", "adagrad") or mode not in (WeightDecayMode.NONE, *_DECAY):
                raise ValueError(
                    f"{type(self).__name__}: weight_decay={wd} with {self.optimizer} and weight_decay_mode={mode.name} "
                    "is not supported by embnum"
                )
            decay = _DECAY.get(mode, implements[0] if kind != "rowwise_adagrad" else "none")
            if decay not in implements:
                raise ValueError(
                    f"{type(self).__name__}: weight_decay_mode={mode.name} with {self.optimizer} is not supported "
                    f"by embnum (it implements {', '.join(implements)})"
                )
        return TBEOptimizer(kind, weight_decay=wd if decay != "none" else 0.0, weight_decay_mode=decay, **self._hyper)

    def get_learning_rate(self) -> float:
        return self._tbe_optimizer.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        self.update_hyper_parameters({"lr": lr})

    def update_hyper_parameters(self, params_dict: dict) -> None:
        """Set ``lr``, ``eps``, ``beta1``, ``beta2`` or ``weight_decay`` (fbgemm's names); another name
        raises. The new values are checked together first: a rejected call changes nothing."""
        if not isinstance(params_dict, dict):
            raise TypeError(f"params_dict must be a dict of hyper-parameters, got {type(params_dict).__name__}")
        values, weight_decay = {}, self.weight_decay
        for key, value in params_dict.items():
            if key == "weight_decay":
                weight_decay = _checks.number(key, value, minimum=0.0)
            elif key in ("lr", "eps", "beta1", "beta2"):
                values["learning_rate" if key == "lr" else key] = _checks.number(key, value)
            else:
                raise NotImplementedError(f"Setting hyper-parameter {key} is not supported")
        old = self._hyper, self.weight_decay
        self._hyper, self.weight_decay = {**self._hyper, **values}, weight_decay
        try:
            optimizer = self._build_optimizer()
        except (TypeError, ValueError):
            self._hyper, self.weight_decay = old
            raise
        self._tbe_optimizer = optimizer
        self.learning_rate_tensor.fill_(optimizer.learning_rate)

    def set_optimizer_step(self, step: int) -> None:
        """The optimizer's step count (an int in ``[0, 2**62]``): the next update runs with ``step + 1``."""
        self._steps.write(self.iter, _checks.step("step", step))

    @property
    def optimizer_args(self) -> TBEOptimizer:
        """The embnum optimizer the backward pass applies (kind and hyper-parameters)."""
        return self._tbe_optimizer

    # -- weights and state ---------------------------------------------------------
    @property
    def weights(self) -> torch.Tensor:
        return getattr(self, self._held)

    def _state_rules(self) -> dict:
        rules = super()._state_rules()
        rules[self._held] = rules.pop("weights")
        for empty in ("weights_dev", "weights_host", "weights_uvm", "placeholder_autograd_tensor"):
            rules.setdefault(empty, (getattr(self, empty), "weights"))  # size 0: a shape and dtype check
        rules["weights_placements"] = (self.weights_placements, "layout")
        for state in self._tbe_optimizer.states:
            squares = state == "momentum2" or self._kind in ("adagrad", "rowwise_adagrad")
            buf = f"{state}_{self._held[8:]}"
            rules[buf] = (getattr(self, buf), "nonneg" if squares else "signed")
        rules["iter"] = (self.iter, "step")
        return rules

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """One ``[rows, dim]`` view per table of the flat weights (writes go to the module)."""
        return _split_views(self.weights, self.rows, self.dims)

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Per table, its state views in fbgemm's order (momentum1, then momentum2): element-wise
        states ``[rows, dim]``, row-wise ones ``[rows]``. EXACT_SGD has none: ``[]``."""
        layout = self._tbe_optimizer.state_layout
        per_state = []
        for state, kind in layout.items():
            flat = getattr(self, f"{state}_{self._held[8:]}")
            per_state.append(_split_views(flat, self.rows, self.dims, rowwise=kind == "row"))
        return [list(s) for s in zip(*per_state)]

    def get_optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """``split_optimizer_states`` with torch optimizers' state names (``sum``, ``exp_avg``, ...), per table."""
        names = _STATE_NAMES[self._kind]
        return [dict(zip(names, states)) for states in self.split_optimizer_states()]

    def flush(self) -> None:
        """Nothing to write back: embnum keeps no embedding cache."""

    def reset_cache_states(self) -> None:
        """Nothing to reset: embnum keeps no embedding cache (TorchRec calls it before loading a state dict)."""

    # -- lookup ------------------------------------------------------------------
    def forward(
        self,
        indices,
        offsets,
        per_sample_weights=None,
        feature_requires_grad=None,
        batch_size_per_feature_per_rank=None,
        total_unique_indices=None,
        **fbgemm_options,
    ):
        check_defaults(
            f"{type(self).__name__}.forward",
            fbgemm_options,
            {
                "hash_zch_identities": None,
                "hash_zch_runtime_meta": None,
                "vbe_output": None,
                "vbe_output_offsets": None,
            },
        )
        batch_sizes = _batch_sizes(batch_size_per_feature_per_rank)
        per_sample_weights = _checks.float_weights("per_sample_weights", per_sample_weights)
        if feature_requires_grad is not None and (
            not isinstance(feature_requires_grad, torch.Tensor)
            or tuple(feature_requires_grad.shape) != (len(self.feature_table_map),)
        ):
            raise ValueError(
                f"feature_requires_grad must be None or a tensor of one entry per feature "
                f"({len(self.feature_table_map)}), got {feature_requires_grad!r:.80}"
            )
        try:
            return _FusedLookup.apply(
                self.placeholder_autograd_tensor,
                per_sample_weights,
                self,
                indices,
                offsets,
                feature_requires_grad,
                batch_sizes,
            )
        except IndexError as err:
            # with VBE the op's own error stands (it names the feature and its sample)
            plain = None if batch_sizes is not None else self._lookup_error(err, indices, offsets)
            if plain is None:
                raise
            raise plain from err

    def _lookup(self, indices, offsets, per_sample_weights, batch_sizes=None):
        from ..torch_bridge import tbe_forward

        return tbe_forward(
            self.weights.detach(),
            *self._layout(),
            indices,
            offsets,
            self._pooling,
            None if per_sample_weights is None else per_sample_weights.detach().float(),
            output_dtype=self._output,
            bounds_check_mode=self._bounds,
            batch_size_per_feature_per_rank=batch_sizes,
        )

    def _apply_gradient(self, grad, indices, offsets, psw, want_psw_grad, feature_requires_grad, batch_sizes=None):
        opt = self._tbe_optimizer
        step = self._steps.read(self.iter) + 1  # fbgemm counts the step before the update
        self._steps.advance(self.iter)
        states = {s: getattr(self, f"{s}_{self._held[8:]}") for s in opt.states}
        psw_grad = fused_update(
            grad,
            self.weights,
            self._layout(),
            indices,
            offsets,
            self._pooling,
            None if psw is None else psw.float(),
            want_psw_grad,
            opt,
            (states.get("momentum1"), states.get("momentum2")),
            step if opt.uses_step else None,
            self._bounds,
            batch_sizes=batch_sizes,
        )
        if psw_grad is not None and feature_requires_grad is not None:
            per_index = _per_index(feature_requires_grad, offsets, indices.shape[0], batch_sizes)
            psw_grad = psw_grad * per_index.to(psw_grad.dtype)
        return psw_grad


def _table_starts(rows, dims):
    starts, total = [], 0
    for r, d in zip(rows, dims):
        starts.append(total)
        total += r * d
    return starts


def _batch_sizes(value):
    """``batch_size_per_feature_per_rank`` as the ops' text form (checked there; None passes):
    encoded once per call, so the forward and the backward read the same sizes."""
    from .._tbe_vbe import encode

    return encode(value)


def _per_index(feature_values, offsets, n_indices, batch_sizes=None):
    """``feature_values[t]`` of the feature each index belongs to (bags are feature-major: ``T*B+1``
    offsets, or ``sum_t B_t + 1`` with VBE's ``batch_sizes``)."""
    T = feature_values.shape[0]
    lengths = (offsets[1:] - offsets[:-1]).clamp(min=0)
    if batch_sizes is not None:
        from .._tbe_vbe import int_rows

        per_feature = torch.from_numpy(int_rows(batch_sizes).sum(axis=1)).to(offsets.device)
        feature_of_bag = torch.repeat_interleave(torch.arange(T, device=offsets.device), per_feature)
    else:
        B = (offsets.shape[0] - 1) // T
        feature_of_bag = torch.arange(T * B, device=offsets.device) // max(B, 1)
    out = torch.repeat_interleave(feature_values.to(offsets.device)[feature_of_bag], lengths)
    return out[:n_indices] if out.shape[0] >= n_indices else torch.nn.functional.pad(out, (0, n_indices - out.shape[0]))


class DenseTableBatchedEmbeddingBagsCodegen(_Layout):
    """fbgemm's dense-gradient TBE: ``weights`` is one flat parameter; ``forward(indices, offsets,
    per_sample_weights=None, feature_requires_grad=None, batch_size_per_feature_per_rank=None)``;
    ``weights.grad`` is the dense gradient, for any torch optimizer. embedding_specs: ``(rows, dim)`` per table."""

    def __init__(
        self,
        embedding_specs,
        feature_table_map=None,
        weights_precision=SparseType.FP32,
        pooling_mode=PoolingMode.SUM,
        use_cpu=False,
        output_dtype=SparseType.FP32,
        use_mtia=False,
    ):
        super().__init__()
        name = type(self).__name__
        if flag("use_mtia", use_mtia):
            raise NotImplementedError(f"{name}: use_mtia=True is not available in embnum's fbgemm stand-in")
        self.embedding_specs = _checks.specs(name, embedding_specs, ("rows", "dim"))
        rows = [int(s[0]) for s in self.embedding_specs]
        dims = [int(s[1]) for s in self.embedding_specs]
        self.use_cpu = flag("use_cpu", use_cpu) or not torch.cuda.is_available()
        device = torch.device("cpu" if self.use_cpu else "cuda")
        self._set_layout(rows, dims, feature_table_map, pooling_mode, output_dtype, device)
        self.weights_precision = weights_precision
        dtype = _float_type(name, "weights_precision", weights_precision)
        n = self.num_weights
        self.weights = torch.nn.Parameter(
            _checks.allocate("weights", lambda: torch.randn(n, device=device).to(dtype), n)
        )
        self.weights_physical_offsets = _table_starts(rows, dims)

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return _split_views(self.weights, self.rows, self.dims)

    def forward(
        self,
        indices,
        offsets,
        per_sample_weights=None,
        feature_requires_grad=None,
        batch_size_per_feature_per_rank=None,
    ):
        from ..torch_bridge import tbe_forward

        try:
            return tbe_forward(
                self.weights,
                *self._layout(),
                indices,
                offsets,
                self._pooling,
                _checks.float_weights("per_sample_weights", per_sample_weights),
                output_dtype=self._output,
                bounds_check_mode="fatal",
                batch_size_per_feature_per_rank=batch_size_per_feature_per_rank,
            )
        except IndexError as err:
            # with VBE the op's own error stands (it names the feature and its sample)
            plain = None if batch_size_per_feature_per_rank is not None else self._lookup_error(err, indices, offsets)
            if plain is None:
                raise
            raise plain from err
