"""TBE helpers that are not ops (``docs/families/tbe.md``): the layout builder, the
optimizer description and the sparse-gradient result type.

It also holds the integer codes the kernels of every backend branch on (pooling
mode, optimizer kind, weight-decay mode), defined once here.

``embnum`` re-exports ``tbe_layout``, ``TBELayout``, ``TBEOptimizer`` and
``TBESparseGrad`` (see ``embnum.ops.tbe.HELPERS``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import NamedTuple

import numpy as np

from ._cache import BoundedCache
from ._validate import integer, positive


@dataclasses.dataclass(frozen=True)
class TBELayout:
    """Where each feature's table lives in the flat weights buffer (``docs/families/tbe.md``, the flat layout).

    weights_offsets: int64 ``[T]`` element offsets; D_offsets: int64 ``[T+1]``
    cumulative dims; hash_size_cumsum: int64 ``[T+1]`` first linear row id of
    each feature's table; num_weights: length of the flat buffer.
    """

    weights_offsets: np.ndarray
    D_offsets: np.ndarray
    hash_size_cumsum: np.ndarray
    num_weights: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(weights_offsets, D_offsets, hash_size_cumsum)``, the order the ops take them."""
        return self.weights_offsets, self.D_offsets, self.hash_size_cumsum

    def by_name(self) -> dict[str, np.ndarray]:
        """The three arrays as the ops' keyword arguments (``weights_offsets=``, ``D_offsets=``,
        ``hash_size_cumsum=``)."""
        return dict(zip(("weights_offsets", "D_offsets", "hash_size_cumsum"), self.arrays()))


def _positive_ints(name, values):
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name} must be a non-empty list of ints, got {values!r}")
    return [positive(f"{name}[{i}]", x) for i, x in enumerate(values)]


def tbe_layout(rows, dims, feature_table_map=None) -> TBELayout:
    """Lay out physical tables back to back, as fbgemm's training module does.

    rows[i], dims[i]: rows and embedding dim of table ``i`` (ints >= 1).
    feature_table_map[t]: the table feature ``t`` reads (default: one feature per
    table); non-decreasing and using every table (``ValueError`` otherwise).
    Example: ``rows=[3, 2], dims=[2, 3]`` -> ``weights_offsets=[0, 6]``,
    ``D_offsets=[0, 2, 5]``, ``hash_size_cumsum=[0, 3, 5]``, ``num_weights=12``.
    """
    rows = _positive_ints("rows", rows)
    dims = _positive_ints("dims", dims)
    if len(rows) != len(dims):
        raise ValueError(f"rows and dims must have the same length, got {len(rows)} and {len(dims)}")
    n = len(rows)
    if feature_table_map is None:
        ftm = list(range(n))
    else:
        if isinstance(feature_table_map, np.ndarray):
            feature_table_map = feature_table_map.tolist()
        if not isinstance(feature_table_map, (list, tuple)) or not feature_table_map:
            raise ValueError(f"feature_table_map must be a non-empty list of table numbers, got {feature_table_map!r}")
        ftm = []
        for t, x in enumerate(feature_table_map):
            x = integer(f"feature_table_map[{t}]", x, min=0, max=n - 1, what=f"a table number in [0, {n})")
            if ftm and int(x) < ftm[-1]:
                raise ValueError(
                    f"feature_table_map must be non-decreasing (features sharing a table adjacent), "
                    f"but feature_table_map[{t}] = {x} < {ftm[-1]}"
                )
            ftm.append(int(x))
        missing = sorted(set(range(n)) - set(ftm))
        if missing:
            raise ValueError(f"feature_table_map does not use table {missing[0]}")
    table_offset = np.concatenate([[0], np.cumsum([r * d for r, d in zip(rows, dims)])]).astype(np.int64)
    row_start = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    weights_offsets = table_offset[ftm]
    D_offsets = np.concatenate([[0], np.cumsum([dims[i] for i in ftm])]).astype(np.int64)
    hash_size_cumsum = np.concatenate([row_start[ftm], [row_start[-1]]]).astype(np.int64)
    return TBELayout(weights_offsets, D_offsets, hash_size_cumsum, int(table_offset[-1]))


_KINDS = {
    "sgd": "sgd",
    "exact_sgd": "sgd",
    "adagrad": "adagrad",
    "exact_adagrad": "adagrad",
    "rowwise_adagrad": "rowwise_adagrad",
    "exact_row_wise_adagrad": "rowwise_adagrad",
    "adam": "adam",
    "lamb": "lamb",
    "partial_rowwise_adam": "partial_rowwise_adam",
    "partial_row_wise_adam": "partial_rowwise_adam",
    "partial_rowwise_lamb": "partial_rowwise_lamb",
    "partial_row_wise_lamb": "partial_rowwise_lamb",
    "lars_sgd": "lars_sgd",
}
_DECAY_MODES = ("none", "l2", "decoupled")
# state arrays of each kind: "element" = float32 [W] in the layout of weights, "row" = float32
# [hash_size_cumsum[T]], one value per physical row at its linear id
_STATES = {
    "sgd": {},
    "adagrad": {"momentum1": "element"},
    "rowwise_adagrad": {"momentum1": "row"},
    "adam": {"momentum1": "element", "momentum2": "element"},
    "lamb": {"momentum1": "element", "momentum2": "element"},
    "partial_rowwise_adam": {"momentum1": "element", "momentum2": "row"},
    "partial_rowwise_lamb": {"momentum1": "element", "momentum2": "row"},
    "lars_sgd": {"momentum1": "element"},
}
_BIAS_CORRECTED = ("adam", "lamb", "partial_rowwise_adam", "partial_rowwise_lamb")
# the weight-decay mode each kind implements (fbgemm applies its decay one way per kind)
_DECAY_OF = {
    "sgd": (),
    "adagrad": (),
    "rowwise_adagrad": ("l2", "decoupled"),
    "adam": ("decoupled",),
    "lamb": ("decoupled",),
    "partial_rowwise_adam": ("decoupled",),
    "partial_rowwise_lamb": ("decoupled",),
    "lars_sgd": ("l2",),
}


def _finite(name, x, *, minimum=None, strict=False, below_one=False):
    """``x`` as the kernels read it (float32) is finite and in its domain (checked on the
    float32 value: 1e39 is inf, 0.99999999999 is 1, 1e-50 is 0 there)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    try:
        x64 = float(x)
    except OverflowError:
        x64 = math.inf
    with np.errstate(over="ignore", under="ignore"):
        x32 = float(np.float32(x64))
    if not math.isfinite(x32):
        why = "" if not math.isfinite(x64) else " as a float32 (the kernels' precision)"
        raise ValueError(f"{name} must be a finite number{why}, got {x!r}")
    if minimum is not None and (x32 < minimum or (strict and x32 == minimum)):
        ok64 = not (x64 < minimum or (strict and x64 == minimum))
        why = f" as a float32 (the kernels' precision; it rounds to {x32!r})" if ok64 else ""
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum}{why}, got {x!r}")
    if below_one and x32 >= 1:
        why = "" if x64 >= 1 else f" as a float32 (the kernels' precision; it rounds to {x32!r})"
        raise ValueError(f"{name} must be < 1{why}, got {x!r}")


def _name(param, value, choices):
    """A str among ``choices`` (case-insensitive): TypeError for another type, ValueError for another str."""
    if not isinstance(value, str):
        raise TypeError(f"{param} must be a str, one of {sorted(choices)}, got {value!r}")
    if value.lower() not in choices:
        raise ValueError(f"{param} must be one of {sorted(choices)}, got {value!r}")
    return value.lower()


@dataclasses.dataclass(frozen=True)
class TBEOptimizer:
    """The fused optimizer of ``tbe_backward_update``: its kind and hyper-parameters
    (``docs/families/tbe.md``, fused optimizers).

    kind: ``"sgd"``, ``"adagrad"``, ``"rowwise_adagrad"``, ``"adam"``, ``"lamb"``,
    ``"partial_rowwise_adam"``, ``"partial_rowwise_lamb"`` or ``"lars_sgd"`` (fbgemm's
    ``"exact_*"`` / ``"*_row_wise_*"`` names are accepted and normalised). Hyper-parameters
    are used as float32 values (fbgemm passes C floats) and checked as such: a value that is
    not finite, or leaves its domain (a beta of 1, a ``max_norm`` of 0), once rounded to
    float32 is a ``ValueError`` naming it; a ``kind`` or mode that is not a str a ``TypeError``.
    ``weight_decay`` needs the mode the kind implements: ``"l2"``/``"decoupled"`` (rowwise
    Adagrad), ``"decoupled"`` (Adam, LAMB and their partial row-wise forms), ``"l2"`` (LARS-SGD);
    SGD and Adagrad take none.
    ``max_gradient``: clip the output gradient elementwise to ``[-max_gradient,
    max_gradient]`` first. ``eta``, ``momentum``: LARS-SGD's trust coefficient and momentum
    (fbgemm's module defaults). ``max_norm``: after the update, scale every updated row
    whose L2 norm exceeds it down to norm ``max_norm`` (TorchRec's table ``max_norm``).
    """

    kind: str
    learning_rate: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    weight_decay_mode: str = "none"
    beta1: float = 0.9
    beta2: float = 0.999
    max_gradient: float | None = None
    eta: float = 0.001
    momentum: float = 0.9
    max_norm: float | None = None

    def __post_init__(self):
        kind = _name("kind", self.kind, _KINDS)
        object.__setattr__(self, "kind", _KINDS[kind])
        mode = _name("weight_decay_mode", self.weight_decay_mode, _DECAY_MODES)
        object.__setattr__(self, "weight_decay_mode", mode)
        _finite("learning_rate", self.learning_rate)
        _finite("eps", self.eps, minimum=0.0)
        _finite("weight_decay", self.weight_decay, minimum=0.0)
        _finite("eta", self.eta, minimum=0.0)
        _finite("momentum", self.momentum, minimum=0.0)
        _finite("beta1", self.beta1, minimum=0.0, below_one=True)
        _finite("beta2", self.beta2, minimum=0.0, below_one=True)
        for name in ("max_gradient", "max_norm"):
            if getattr(self, name) is not None:
                _finite(name, getattr(self, name), minimum=0.0, strict=True)
        for f in dataclasses.fields(self)[1:]:  # NumPy scalars as Python floats: the encoding is plain literals
            if isinstance(getattr(self, f.name), numbers.Real):
                object.__setattr__(self, f.name, float(getattr(self, f.name)))
        decay = float(self.weight_decay) > 0
        modes = _DECAY_OF[self.kind]
        if not modes and (decay or mode != "none"):
            raise ValueError(
                f"{self.kind} takes no weight decay, got weight_decay={self.weight_decay!r}, mode {mode!r}"
            )
        if modes and (mode not in ("none",) + modes or (decay and mode == "none")):
            raise ValueError(
                f"{self.kind} with weight_decay > 0 needs weight_decay_mode {' or '.join(repr(m) for m in modes)}"
                f" (the decay it implements), got {mode!r} with weight_decay={self.weight_decay!r}"
            )

    def float32(self) -> dict:
        """Every hyper-parameter rounded to float32 (as fbgemm's C floats): a new dict each call,
        of values computed once per optimizer (it is frozen, so they cannot go stale)."""
        found = self.__dict__.get("_float32")
        if found is None:
            found = self._round_to_float32()
            object.__setattr__(self, "_float32", found)
        return dict(found)

    def _round_to_float32(self) -> dict:
        f = np.float32
        return dict(
            lr=f(self.learning_rate),
            eps=f(self.eps),
            wd=f(self.weight_decay),
            beta1=f(self.beta1),
            beta2=f(self.beta2),
            max_gradient=None if self.max_gradient is None else f(self.max_gradient),
            eta=f(self.eta),
            momentum=f(self.momentum),
            max_norm=None if self.max_norm is None else f(self.max_norm),
        )

    def kernel_parameters(self, step=None) -> tuple:
        """``(lr, eps, wd, beta1, beta2, 1 - beta1**step, 1 - beta2**step)`` as float32
        (the bias corrections are 1 unless the kind uses ``step``)."""
        hp = self.float32()
        one = np.float32(1)
        bc1 = bc2 = one
        if self.uses_step:
            bc1 = one - hp["beta1"] ** np.float32(step)
            bc2 = one - hp["beta2"] ** np.float32(step)
        return (hp["lr"], hp["eps"], hp["wd"], hp["beta1"], hp["beta2"], np.float32(bc1), np.float32(bc2))

    def kernel_args(self, step=None) -> OptimizerArgs:
        """The codes and float32 hyper-parameters a fused-update kernel reads (one record)."""
        return OptimizerArgs(KIND_CODES[self.kind], DECAY_CODES[self.weight_decay_mode], *self.kernel_parameters(step))

    def hyper_array(self, step=None) -> np.ndarray:
        """float32 ``[HP_SLOTS]``: :meth:`kernel_parameters` then ``eta``, ``momentum``,
        ``max_norm`` (0 = off), the slots of ``embnum._tbe_rows``."""
        hp = self.float32()
        extra = (hp["eta"], hp["momentum"], hp["max_norm"] or np.float32(0))
        return np.array(self.kernel_parameters(step) + extra, dtype=np.float32)

    @property
    def states(self) -> tuple[str, ...]:
        """State arrays this kind uses: ``()``, ``("momentum1",)`` or both moments."""
        return tuple(_STATES[self.kind])

    @property
    def state_layout(self) -> dict:
        """``{state name: "element" | "row"}``: ``"element"`` arrays are float32 ``[W]`` in the
        layout of ``weights``; ``"row"`` arrays are float32 ``[hash_size_cumsum[T]]``, one
        value per physical row at its linear id."""
        return dict(_STATES[self.kind])

    def state_sizes(self, num_weights: int, num_rows: int) -> dict:
        """``{state name: entries}`` for weights of ``num_weights`` elements in ``num_rows`` rows."""
        return {k: (num_weights if v == "element" else num_rows) for k, v in _STATES[self.kind].items()}

    @property
    def uses_step(self) -> bool:
        """Whether ``tbe_backward_update`` needs ``step`` (the bias-corrected kinds)."""
        return self.kind in _BIAS_CORRECTED

    def encode(self) -> str:
        """A string form (for the torch schema); :meth:`decode` inverts it. Computed once per
        optimizer (~15 us; a training step passes the same one each call): it is frozen, so its
        fields, all the string reads, cannot change."""
        found = self.__dict__.get("_encoded")
        if found is None:
            found = repr(dataclasses.astuple(self))
            object.__setattr__(self, "_encoded", found)
        return found

    @classmethod
    def decode(cls, s: str) -> TBEOptimizer:
        """The optimizer :meth:`encode` wrote (``ValueError`` for any other string). Cached by
        the exact string (~36 us of ``ast.literal_eval`` otherwise), which is all decode reads;
        the optimizer returned is frozen, so calls may share it."""
        key = (cls, s) if type(s) is str else None
        found = None if key is None else _DECODED.get(key)
        if found is None:
            found = cls._decode(s)
            if key is not None:
                _DECODED.put(key, found)
        return found

    @classmethod
    def _decode(cls, s) -> TBEOptimizer:
        import ast

        try:
            fields = ast.literal_eval(s) if isinstance(s, str) and len(s) < 1000 else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            fields = None
        if not isinstance(fields, tuple) or len(fields) != len(dataclasses.fields(cls)):
            raise ValueError(f"optimizer must be an encoded embnum.TBEOptimizer, got {s!r:.80}")
        try:
            return cls(*fields)
        except TypeError as e:
            raise ValueError(f"optimizer must be an encoded embnum.TBEOptimizer, got {s!r:.80} ({e})") from None


# -- codes the kernels branch on ------------------------------------------------
# Plain module-level ints: Numba (``njit`` and ``cuda.jit``) reads a global int as a
# compile-time constant, so ``if kind == ADAM`` costs what ``if kind == 3`` did.
# pooling_mode (fbgemm's PoolingMode numbering)
SUM, MEAN, NONE = 0, 1, 2
POOLING_CODES = {"sum": SUM, "mean": MEAN, "none": NONE}
# optimizer kind (TBEOptimizer.kind)
SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM, LAMB, PARTIAL_ROWWISE_ADAM, PARTIAL_ROWWISE_LAMB, LARS_SGD = range(8)
KIND_CODES = {
    "sgd": SGD,
    "adagrad": ADAGRAD,
    "rowwise_adagrad": ROWWISE_ADAGRAD,
    "adam": ADAM,
    "lamb": LAMB,
    "partial_rowwise_adam": PARTIAL_ROWWISE_ADAM,
    "partial_rowwise_lamb": PARTIAL_ROWWISE_LAMB,
    "lars_sgd": LARS_SGD,
}
# weight_decay_mode
DECAY_NONE, DECAY_L2, DECAY_DECOUPLED = 0, 1, 2
DECAY_CODES = {"none": DECAY_NONE, "l2": DECAY_L2, "decoupled": DECAY_DECOUPLED}


class OptimizerArgs(NamedTuple):
    """What a fused-update kernel reads (``TBEOptimizer.kernel_args``): the ``kind`` and
    ``decay`` codes above, float32 hyper-parameters, and Adam's bias corrections
    ``bc1 = 1 - beta1**step``, ``bc2 = 1 - beta2**step`` (1 for the other kinds). A
    NamedTuple, so Numba kernels take it as one argument and read fields by name."""

    kind: int
    decay: int
    lr: np.float32
    eps: np.float32
    wd: np.float32
    beta1: np.float32
    beta2: np.float32
    bc1: np.float32
    bc2: np.float32


class LookupArgs(NamedTuple):
    """The lookup arguments every backend's TBE entry point receives from the declaration
    (by keyword; the entry points take them as ``**lookup`` and build this record once).

    weights_offsets ``[T]``, D_offsets ``[T+1]``, hash_size_cumsum ``[T+1]``, rows ``[T]``:
    int64 layout; indices ``[N]``, offsets ``[T*B+1]``: int32 or int64 (checked, every index
    readable); B: bags per feature; pooling: ``SUM``/``MEAN``/``NONE``; per_sample_weights:
    float32 ``[N]`` or None."""

    weights_offsets: object
    D_offsets: object
    hash_size_cumsum: object
    rows: object
    indices: object
    offsets: object
    B: int
    pooling: int
    per_sample_weights: object

    @property
    def has_psw(self) -> bool:
        return self.per_sample_weights is not None


_DECODED = BoundedCache(64)  # (class, encoding) -> TBEOptimizer.decode's result


def uses_row_rule(optimizer) -> bool:
    """Whether ``tbe_backward_update`` applies :mod:`embnum._tbe_rows`' shared rule to the
    row-wise gradient instead of a backend's fused kernel: the kinds from ``LAMB`` on, and
    any ``max_norm``."""
    return KIND_CODES[optimizer.kind] >= LAMB or optimizer.max_norm is not None


def clipped_gradient(xp, grad_output, max_gradient):
    """``grad_output`` clipped elementwise to ``[-max_gradient, max_gradient]`` as float32
    (``xp``: NumPy or CuPy); unchanged when ``max_gradient`` is None."""
    if max_gradient is None:
        return grad_output
    return xp.clip(grad_output.astype(np.float32), -max_gradient, max_gradient)


class TBESparseGrad(NamedTuple):
    """Row-wise gradient of ``tbe_backward_sparse``: ``linear_ids`` int64 ``[U]`` strictly
    increasing, ``values`` float32 ``[value_offsets[U]]``, ``value_offsets`` int64 ``[U+1]``."""

    linear_ids: np.ndarray
    values: np.ndarray
    value_offsets: np.ndarray


def pad_sparse(grad: TBESparseGrad, max_rows: int, max_dim: int) -> TBESparseGrad:
    """``grad`` (host NumPy) in the fixed sizes of ``tbe_backward_sparse(..., max_rows=R)``:
    ``linear_ids`` int64 ``[R]`` (the first ``min(U, R)`` rows, then ``-1``), ``value_offsets``
    int64 ``[R + 1]`` (then repeating the end of the kept values), ``values`` float32
    ``[R * max_dim]`` (zero past the kept values). Rows beyond ``R`` are dropped."""
    lids, values, voffs = grad
    k = min(int(lids.shape[0]), max_rows)
    ids = np.full(max_rows, -1, np.int64)
    ids[:k] = lids[:k]
    vo = np.full(max_rows + 1, voffs[k], np.int64)
    vo[: k + 1] = voffs[: k + 1]
    vals = np.zeros(max_rows * max_dim, np.float32)
    vals[: voffs[k]] = values[: voffs[k]]
    return TBESparseGrad(ids, vals, vo)
