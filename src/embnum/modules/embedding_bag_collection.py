"""TorchRec's ``EmbeddingBagCollection`` on embnum's TBE: named tables, named features.

``EmbeddingBagCollection(tables, is_weighted=False, device=None, *, optimizer=None)``
takes :class:`EmbeddingBagConfig` records (TorchRec's fields) and maps a
``KeyedJaggedTensor`` (embnum's, or anything with TorchRec's KJT methods) to a
``KeyedTensor`` of pooled embeddings ``[B, sum of the features' dims]`` with one key
per feature, in TorchRec's order (tables in config order, each table's features in its
order). Tables of one pooling and one weight dtype share one flat buffer and one TBE
call (dims may differ inside a call), so ``len(groups)`` calls run per forward.

With ``optimizer`` (a :class:`embnum.TBEOptimizer`) the update is fused into the
backward pass, as TorchRec's fused EBC (fbgemm's training module): the tables never get
a ``.grad``. Without one, each table's ``weight`` is a leaf parameter with a dense
gradient, for any torch optimizer.

State: ``embedding_bags.<table>.weight`` (``[rows, dim]``, TorchRec's name) and, with an
optimizer, ``embedding_bags.<table>.momentum1`` / ``momentum2`` (``[rows, dim]`` for
element-wise state, ``[rows]`` for row-wise) and ``embedding_bags.<table>.step`` (the
optimizer step of the table's TBE call). Every one is a view of the flat buffers, so
``load_state_dict`` writes through, and a restored collection resumes training
bit-identically.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np
import torch

from .._tbe import TBEOptimizer
from ..containers import KeyedTensor
from ..torch_bridge import tbe_backward, tbe_forward, tbe_grad_per_sample_weights
from . import _regroup, _state
from .tbe import TBE, FusedTBE, fused_lookup

_POOLINGS = ("sum", "mean")
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _name_of(x, what, choices):
    """``x`` as one of ``choices``: a string (any case) or an enum with that ``.name`` (TorchRec's)."""
    s = x.name if hasattr(x, "name") and not isinstance(x, str) else x
    if isinstance(s, str) and s.lower() in choices:
        return s.lower()
    if isinstance(x, torch.dtype):
        for k, v in _DTYPES.items():
            if v == x:
                return k
    raise ValueError(f"{what} must be one of {list(choices)}, got {x!r}")


@dataclasses.dataclass
class EmbeddingBagConfig:
    """One table of an :class:`EmbeddingBagCollection`, with TorchRec's field names and order.

    num_embeddings, embedding_dim: rows and dim (ints >= 1); name: the table's name (unique in
    a collection); data_type: ``"fp32"`` or ``"fp16"`` (or TorchRec's ``DataType.FP32/FP16``,
    or a torch dtype) for the weights; feature_names: the features that read the table (default
    ``[name]``); weight_init_min / weight_init_max: the uniform init range (default
    ``+-sqrt(1 / num_embeddings)``, TorchRec's and fbgemm's); pooling: ``"sum"`` or ``"mean"``
    (or TorchRec's ``PoolingType``).
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: str = "fp32"
    feature_names: list = dataclasses.field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    pooling: str = "sum"

    def __post_init__(self):
        for f in ("num_embeddings", "embedding_dim"):
            x = getattr(self, f)
            if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
                raise ValueError(f"{f} must be an int >= 1, got {x!r}")
            setattr(self, f, int(x))
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        self.data_type = _name_of(self.data_type, "data_type", _DTYPES)
        self.pooling = _name_of(self.pooling, "pooling", _POOLINGS)
        names = list(self.feature_names) or [self.name]
        for f in names:
            if not isinstance(f, str) or not f:
                raise ValueError(f"feature_names of table {self.name!r} must be non-empty strings, got {f!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"feature_names of table {self.name!r} repeat a name: {names}")
        self.feature_names = names
        lo, hi = self.init_range()
        if not lo < hi:
            raise ValueError(f"table {self.name!r}: weight_init_min = {lo} must be < weight_init_max = {hi}")

    def init_range(self) -> tuple[float, float]:
        """``(weight_init_min, weight_init_max)`` with TorchRec's default ``+-sqrt(1/num_embeddings)``."""
        bound = float(np.sqrt(1.0 / self.num_embeddings))
        lo = -bound if self.weight_init_min is None else float(self.weight_init_min)
        hi = bound if self.weight_init_max is None else float(self.weight_init_max)
        return lo, hi


class _Table(torch.nn.Module):
    """One table's entry in ``embedding_bags``: views of its TBE call's flat buffers."""

    def __init__(self, config, weight, state, step, trainable):
        super().__init__()
        self.config = config
        self.weight = torch.nn.Parameter(weight, requires_grad=trainable)
        for k, v in state.items():
            self.register_buffer(k, v)
        if step is not None:
            self.register_buffer("step", step)

    def _load_from_state_dict(self, *args):
        _state.load_without_assign(_Table, self, *args)  # the tables are views of the flat buffers

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"{c.num_embeddings} x {c.embedding_dim}, {c.data_type}, pooling={c.pooling!r}, features={c.feature_names}"
        )


class _PlainLookup(torch.autograd.Function):
    """The lookup of one group with per-table leaf weights: forward on the flat buffer
    (which the tables view), backward splits the dense flat gradient into the tables."""

    @staticmethod
    def forward(ctx, group, spans, indices, offsets, per_sample_weights, *tables):
        ctx.group, ctx.spans = group, spans
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        return tbe_forward(
            group.weights.detach(),
            *group.layout(),
            indices,
            offsets,
            group.pooling_mode,
            per_sample_weights,
            bounds_check_mode=group.bounds_check_mode,
            backend=group.backend,
        )

    @staticmethod
    def backward(ctx, grad):
        g = ctx.group
        indices, offsets, psw = ctx.saved_tensors
        grad = grad.contiguous().float()
        w = g.weights.detach()
        psw_grad = None
        if psw is not None and ctx.needs_input_grad[4]:
            psw_grad = tbe_grad_per_sample_weights(
                grad, w, *g.layout(), indices, offsets, bounds_check_mode=g.bounds_check_mode, backend=g.backend
            )
        dense = tbe_backward(
            grad,
            w,
            *g.layout(),
            indices,
            offsets,
            g.pooling_mode,
            psw,
            bounds_check_mode=g.bounds_check_mode,
            backend=g.backend,
        )
        tables = [dense[a:b].view(r, d).to(w.dtype) for a, b, r, d in ctx.spans]
        return (None, None, None, None, psw_grad, *tables)


class EmbeddingBagCollection(torch.nn.Module):
    """TorchRec's ``EmbeddingBagCollection`` on embnum's TBE (see the module docstring).

    tables: a non-empty list of :class:`EmbeddingBagConfig` (unique table names, every
    feature read by one table); is_weighted: use the KJT's weights as per-sample weights
    (``"sum"`` pooling only); device: where the tables live; optimizer: a
    :class:`embnum.TBEOptimizer` fused into backward, or None; seed: the NumPy seed of the
    initial weights; bounds_check_mode, backend: as the TBE ops.
    """

    _groups: list[TBE | FusedTBE]

    def __init__(
        self,
        tables,
        is_weighted=False,
        device=None,
        *,
        optimizer=None,
        seed=0,
        bounds_check_mode="fatal",
        backend=None,
    ):
        super().__init__()
        tables = list(tables) if isinstance(tables, (list, tuple)) else tables
        if not isinstance(tables, list) or not tables:
            raise ValueError(f"tables must be a non-empty list of EmbeddingBagConfig, got {tables!r}")
        for i, t in enumerate(tables):
            if not isinstance(t, EmbeddingBagConfig):
                raise TypeError(f"tables[{i}] must be an embnum EmbeddingBagConfig, got {type(t).__name__}")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        features = [f for t in tables for f in t.feature_names]
        if len(set(features)) != len(features):
            dup = sorted({f for f in features if features.count(f) > 1})
            raise ValueError(f"every feature must be read by one table, but {dup} appear in several")
        if optimizer is not None and not isinstance(optimizer, TBEOptimizer):
            raise TypeError(f"optimizer must be an embnum.TBEOptimizer or None, got {type(optimizer).__name__}")
        if is_weighted and any(t.pooling == "mean" for t in tables):
            raise ValueError("is_weighted needs 'sum' pooling in every table (TBE has no weighted mean)")
        self._configs = tables
        self._is_weighted = bool(is_weighted)
        self.optimizer = optimizer
        self._feature_names = features
        self._lengths = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._build(seed, torch.device("cpu") if device is None else torch.device(device), bounds_check_mode, backend)

    # -- construction ------------------------------------------------------------------
    def _build(self, seed, device, bounds_check_mode, backend):
        keys = []
        for t in self._configs:
            if (t.pooling, t.data_type) not in keys:
                keys.append((t.pooling, t.data_type))
        groups, members = [], []
        rng = np.random.default_rng(seed)
        for pooling, dtype in keys:
            ts = [t for t in self._configs if (t.pooling, t.data_type) == (pooling, dtype)]
            ftm = [j for j, t in enumerate(ts) for _ in t.feature_names]
            kw = dict(pooling_mode=pooling, weights_dtype=_DTYPES[dtype], bounds_check_mode=bounds_check_mode)
            rows, dims = [t.num_embeddings for t in ts], [t.embedding_dim for t in ts]
            if self.optimizer is None:
                g = TBE(rows, dims, ftm, backend=backend, **kw)
            else:
                g = FusedTBE(rows, dims, ftm, optimizer=self.optimizer, backend=backend, **kw)
            with torch.no_grad():  # TorchRec's init per table, from one seeded stream
                start = 0
                for t in ts:
                    n = t.num_embeddings * t.embedding_dim
                    lo, hi = t.init_range()
                    g.weights[start : start + n] = torch.from_numpy(rng.uniform(lo, hi, n).astype(np.float32))
                    start += n
            groups.append(g.to(device))
            members.append(ts)
        object.__setattr__(self, "_groups", groups)  # not submodules: the tables' views are the state
        self._members = members
        self._view_tables()
        # output columns: per table in config order, its group and column range there
        where = {}
        for gi, ts in enumerate(members):
            col = 0
            for t in ts:
                w = t.embedding_dim * len(t.feature_names)
                where[t.name] = (gi, col, col + w)
                col += w
        slices = []
        for t in self._configs:
            gi, a, b = where[t.name]
            if slices and slices[-1][0] == gi and slices[-1][2] == a:
                slices[-1] = (gi, slices[-1][1], b)
            else:
                slices.append((gi, a, b))
        self._out_slices = slices
        self._group_features = [[f for t in ts for f in t.feature_names] for ts in members]

    def _view_tables(self):
        """(Re)build ``embedding_bags``: each table's weight and state as views of its group's buffers."""
        tables = torch.nn.ModuleDict()
        spans = []
        for g, ts in zip(self._groups, self._members):
            flat = g.weights.detach()
            layout = self.optimizer.state_layout if self.optimizer is not None else {}
            start = row = 0
            sp = []
            for t in ts:
                r, d = t.num_embeddings, t.embedding_dim
                state = {}
                for k, kind in layout.items():
                    buf = getattr(g, k)
                    state[k] = buf[start : start + r * d].view(r, d) if kind == "element" else buf[row : row + r]
                step = g.iter if self.optimizer is not None else None
                tables[t.name] = _Table(t, flat[start : start + r * d].view(r, d), state, step, self.optimizer is None)
                sp.append((start, start + r * d, r, d))
                start += r * d
                row += r
            spans.append(tuple(sp))
        self.embedding_bags = tables
        self._spans = spans

    def _apply(self, fn, recurse=True):
        """Device moves (``.to``, ``.cuda``, ``.cpu``) move the flat buffers and re-view the tables."""
        for g in self._groups:
            g._apply(fn)
        self._view_tables()
        return self

    # -- forward -----------------------------------------------------------------------
    def forward(self, features):
        """``features``: a KeyedJaggedTensor holding every feature of the tables (extra keys
        are ignored; fixed batch size). Returns a ``KeyedTensor`` ``[B, sum of dims]``."""
        if getattr(features, "variable_stride_per_key", lambda: False)():
            raise ValueError("features with a variable batch size per key are not supported by the TBE lookup")
        keys = list(features.keys())
        index = {k: i for i, k in enumerate(keys)}
        missing = [f for f in self._feature_names if f not in index]
        if missing:
            raise ValueError(f"features lacks the keys {missing} (it has {keys})")
        outs = []
        for g, spans, feats, ts in zip(self._groups, self._spans, self._group_features, self._members):
            indices, offsets, psw = self._call_lookups(features, keys, [index[f] for f in feats], g)
            if self._is_weighted and psw is None:
                raise ValueError("is_weighted collection: features must carry weights (per-sample weights)")
            if psw is not None and psw.dtype != torch.float32:
                psw = psw.float()
            try:
                if self.optimizer is None:
                    tables = [self.embedding_bags[t.name].weight for t in ts]
                    outs.append(_PlainLookup.apply(g, spans, indices, offsets, psw, *tables))
                else:
                    outs.append(fused_lookup(g.weights, psw, g, indices, offsets))
            except (IndexError, TypeError) as err:
                plain = self._lookup_error(err, g, feats, ts, indices, offsets)
                if plain is None:
                    raise
                raise plain from err
        if len(outs) == 1 and self._out_slices == [(0, 0, outs[0].shape[1])]:
            values = outs[0]
        else:
            values = torch.cat([outs[gi][:, a:b] for gi, a, b in self._out_slices], dim=1)
        return KeyedTensor(self._feature_names, self._lengths, values)

    def _call_lookups(self, features, keys, perm, group):
        """``(indices, offsets, per_sample_weights)`` of the TBE call ``group`` reading the keys at
        ``perm`` of ``features``. On a device (CUDA tensors, or the cuda backend) with no read back
        (``modules._regroup``: every key moved, the offsets from the lengths on the device);
        elsewhere through the KeyedJaggedTensor's permute and offsets (which check their inputs)."""
        values = features.values()
        weighted = self._is_weighted
        if isinstance(values, torch.Tensor) and (values.is_cuda or group.backend == "cuda"):
            order = _regroup.key_order(tuple(keys), perm, values.device)
            weights = features.weights_or_none() if weighted else None
            return _regroup.call_lookups(order, values, weights, features.lengths(), features.stride())
        kjt = features if perm == list(range(len(keys))) else features.permute(perm)
        return kjt.values(), kjt.offsets(), kjt.weights_or_none() if weighted else None

    # -- checkpoints ---------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, *args):
        """Check every table's entries (and that tables sharing a TBE call share one step) before
        the tables copy any (``embnum.modules._state``)."""
        for ts in self._members:
            steps = {}
            for t in ts:
                table = self.embedding_bags[t.name]
                p = f"{prefix}embedding_bags.{t.name}."
                rules = {"weight": (table.weight, "weights")}
                for name in () if self.optimizer is None else self.optimizer.states:
                    squares = name == "momentum2" or self.optimizer.kind in ("adagrad", "rowwise_adagrad")
                    rules[name] = (getattr(table, name), "nonneg" if squares else "signed")
                if self.optimizer is not None:
                    rules["step"] = (table.step, "step")
                _state.check(state_dict, p, rules)
                if p + "step" in state_dict:
                    steps[t.name] = int(state_dict[p + "step"].reshape(-1)[0])
            if len(set(steps.values())) > 1:
                keys = [f"state_dict[{prefix + f'embedding_bags.{t}.step'!r}]" for t in sorted(steps)]
                raise ValueError(
                    f"{' and '.join(keys)} differ ({steps}), but tables {sorted(steps)} share one TBE call and one step"
                )
        super()._load_from_state_dict(state_dict, prefix, *args)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """torch's, after checking every entry (see :meth:`_load_from_state_dict`): ``TypeError``/
        ``ValueError`` naming the entry, nothing copied. ``assign=True`` copies as ``assign=False``:
        the tables are views of the flat buffers the lookups read."""
        _state.check_keys(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @staticmethod
    def _lookup_error(err, group, features, tables, indices, offsets):
        """The lookup's error in the terms of the features passed to ``forward`` (``None``: ``err``
        stands): ids that are not integers name the KJT's values; an id outside its table names
        the key, the table and the sample."""
        if isinstance(err, TypeError):
            if isinstance(indices, torch.Tensor) and indices.dtype not in (torch.int32, torch.int64):
                return TypeError(f"features.values() must hold int32 or int64 ids, got {indices.dtype}")
            return None
        return group.out_of_range_error(err, indices, offsets, features, [t.name for t in tables])

    # -- TorchRec's accessors -----------------------------------------------------------
    def embedding_bag_configs(self) -> list:
        return list(self._configs)

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self):
        return self._groups[0].weights.device

    def split_embedding_weights(self) -> list:
        """Each table's weights, ``[rows, dim]`` views (writes go to the tables), in config order."""
        return [self.embedding_bags[t.name].weight.detach() for t in self._configs]

    def split_optimizer_states(self) -> list:
        """Per table in config order, a list of its state views (``momentum1``, then
        ``momentum2``; element-wise state ``[rows, dim]``, row-wise ``[rows]``); ``[]`` each
        without a stateful fused optimizer."""
        names = () if self.optimizer is None else self.optimizer.states
        return [[getattr(self.embedding_bags[t.name], k) for k in names] for t in self._configs]

    def extra_repr(self) -> str:
        opt = "none (plain autograd)" if self.optimizer is None else repr(self.optimizer)
        return f"is_weighted={self._is_weighted}, TBE calls={len(self._groups)}, optimizer={opt}"
