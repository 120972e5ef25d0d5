"""Surfaces of the fbgemm stand-in for the hostile tier (``hostile_surfaces.py``): the classes TorchRec
builds (``embnum.fbgemm_compat.training`` / ``inference`` / ``permute``, imported directly: ``install()``
refuses where a real fbgemm_gpu is installed) and the ``torch.ops.fbgemm`` aliases with no embnum op
behind them.

Each model checks in plain Python what the stand-in adds (fbgemm's argument types, enum names, the
weight decay fbgemm's optimizers implement) and then asks the embnum op the class wraps (``ref``;
fuzzed by the op tier) for the result, as ``hostile_modules.tbe_model`` does: a clean error of the op
means the input is invalid.
"""

from __future__ import annotations

import numpy as np

import hostile
from hostile_models import (
    BEYOND_FLOAT32,
    I32,
    I64,
    INVALID,
    NotExpressible,
    host,
    index_array,
    int_list,
    is_int,
    on,
    plain,
    tensor,
)
from hostile_modules import _DECAY_OF, _f32

# -- SplitTableBatchedEmbeddingBagsCodegen: construction, forward, the fused update -----------------------
_KIND = {
    "EXACT_SGD": "sgd",
    "EXACT_ROWWISE_ADAGRAD": "rowwise_adagrad",
    "ADAM": "adam",
    "LAMB": "lamb",
    "EXACT_ADAGRAD": "adagrad",
    "PARTIAL_ROWWISE_ADAM": "partial_rowwise_adam",
    "PARTIAL_ROWWISE_LAMB": "partial_rowwise_lamb",
    "LARS_SGD": "lars_sgd",
}
_OPTIMIZERS = list(_KIND)
# fbgemm's IntEnums, their members in value order (a member is given by its name or its int value)
_POOLING = ("SUM", "MEAN", "NONE")
_BOUNDS = ("FATAL", "WARNING", "IGNORE", "NONE", "V2_IGNORE", "V2_WARNING", "V2_FATAL")
_BOUNDS_OP = {"FATAL": "fatal", "WARNING": "warning", "IGNORE": "ignore", "NONE": "none"}
_DECAY_MODES = ("NONE", "L2", "DECOUPLE", "COUNTER", "COWCLIP", "DECOUPLE_GLOBAL")


def _enum_of(enum_cls, x):
    """A member by its name (the base holds names: mutations make them anything), else ``x`` itself."""
    if isinstance(x, str) and x in enum_cls.__members__:
        return enum_cls[x]
    return x


def _named(x, names):
    """The member name an IntEnum argument means: its name, or its int value (not a bool, a float
    or an array: fbgemm's enums compare equal to those too, but they are no member); else None."""
    if isinstance(x, str):
        return x if x in names else None
    if is_int(x) and 0 <= x < len(names):
        return names[int(x)]
    return None


def _float_type(x):
    """``weights_precision`` / ``output_dtype``: FP32 or FP16, by name or fbgemm's int code (0, 1)."""
    if isinstance(x, str):
        return x if x in ("FP32", "FP16") else None
    return ("FP32", "FP16")[int(x)] if is_int(x) and 0 <= x <= 1 else None


def _lookup_input(seed, rows, features, vbe=None):
    """Indices, offsets and per-id weights of a batch over ``features`` (their tables' ``rows``):
    ``B`` bags per feature, or ``sum(vbe[f])`` (a variable batch per feature and rank)."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    per = [B] * len(features) if vbe is None else [sum(r) for r in vbe]
    table_of = [rows[f] for f, n in zip(features, per) for _ in range(n)]
    lengths = rng.integers(0, 3, len(table_of))
    idx = [rng.integers(0, table_of[b], lengths[b]) for b in range(len(table_of))]
    dt = (np.int32, np.int64)[seed % 2]
    indices = np.concatenate(idx + [np.zeros(0, np.int64)]).astype(dt)
    return {
        "indices": indices,
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(dt),
        "per_sample_weights": rng.uniform(0, 2, indices.shape[0]).astype(np.float32) if seed % 3 else None,
    }


def split_base(seed):
    rows, dims = [5, 4], [3, 2]
    ftm = [0, 0, 1] if seed % 2 else None
    # TorchRec's VBE on 2 ranks: feature t's batch per rank (pooled SUM/MEAN only, as the op)
    vbe = [[1 + (seed + t) % 2, (seed * t) % 3] for t in range(len(ftm or [0, 1]))] if seed % 3 == 2 else None
    optimizer = _OPTIMIZERS[seed % len(_OPTIMIZERS)]
    # the decay modes the kind implements (fbgemm's); under NONE a decay > 0 is the first (rowwise
    # Adagrad: none, which the stand-in refuses rather than ignore the decay)
    implements = _DECAY_OF.get(_KIND[optimizer], ())
    decay = (
        ("NONE", "L2", "DECOUPLE")[("none", "l2", "decoupled").index(implements[seed % len(implements)])]
        if (implements and seed % 2 == 0)
        else "NONE"
    )
    base = {
        "rows": rows,
        "dims": dims,
        "feature_table_map": ftm,
        "optimizer": optimizer,
        "pooling_mode": "SUM" if seed % 4 != 1 else "MEAN",
        "learning_rate": 0.1,
        "eps": 1e-8,
        "weight_decay": 0.01 if decay != "NONE" else 0.0,
        "weight_decay_mode": decay,
        "max_norm": 0.0,
        "beta1": 0.9,
        "beta2": 0.999,
        "momentum": 0.9,
        "eta": 0.001,
        "gradient_clipping": seed % 4 == 3,
        "max_gradient": 0.5,
        "stochastic_rounding": True,
        "weights_precision": "FP16" if seed % 4 == 2 else "FP32",
        "output_dtype": "FP16" if seed % 4 == 1 else "FP32",
        "bounds_check_mode": "FATAL" if seed % 3 else "V2_FATAL",
        "table_names": ["t0", "t1"] if seed % 2 else None,
        "batch_size_per_feature_per_rank": vbe,
        **_lookup_input(seed, [rows[t] for t in (ftm or [0, 1])], list(range(len(ftm or [0, 1]))), vbe),
    }
    if base["pooling_mode"] == "MEAN":
        base["per_sample_weights"] = None  # no weighted mean (the op refuses it)
    return base


def _initial_weights(n):
    return ((np.arange(n) % 7) * 0.25 - 0.5).astype(np.float32)


def split_call(args, kind):
    import torch

    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    specs = _specs(args["rows"], args["dims"], lambda r, d: (r, d, C.EmbeddingLocation.HOST, C.ComputeDevice.CPU))
    enums = {
        "optimizer": C.EmbOptimType,
        "pooling_mode": C.PoolingMode,
        "weight_decay_mode": C.WeightDecayMode,
        "weights_precision": C.SparseType,
        "output_dtype": C.SparseType,
        "bounds_check_mode": C.BoundsCheckMode,
    }
    options = ("learning_rate", "eps", "weight_decay", "max_norm", "beta1", "beta2", "momentum", "eta")
    options += ("gradient_clipping", "max_gradient", "stochastic_rounding", "table_names")
    m = SplitTableBatchedEmbeddingBagsCodegen(
        specs,
        args["feature_table_map"],
        **{k: _enum_of(cls, args[k]) for k, cls in enums.items()},
        **{k: args[k] for k in options},
    )
    with torch.no_grad():
        m.weights.copy_(torch.from_numpy(_initial_weights(m.weights.shape[0])))
    a = {k: on(kind, args[k]) for k in ("indices", "offsets", "per_sample_weights")}
    vbe = args["batch_size_per_feature_per_rank"]
    out = m(a["indices"], a["offsets"], a["per_sample_weights"], batch_size_per_feature_per_rank=vbe)
    out.backward(torch.ones_like(out))
    states = [s for table in m.split_optimizer_states() for s in table]
    return host({"out": out, "weights": m.weights, "states": [s.reshape(-1) for s in states]})


def _specs(rows, dims, make):
    """The spec tuples from the drawn lists (a mutated list that no longer pairs up: as it is)."""
    if not (isinstance(rows, (list, tuple)) and isinstance(dims, (list, tuple))) or len(rows) != len(dims):
        return rows
    return [make(r, d) for r, d in zip(rows, dims)]


def _table_ints(args, low=1):
    rows, dims = int_list(args["rows"]), int_list(args["dims"])
    if rows is None or dims is None or type(args["rows"]) is np.ndarray or type(args["dims"]) is np.ndarray:
        return None
    if (
        not rows
        or len(rows) != len(dims)
        or any(not low <= r <= 2**40 for r in rows)
        or any(not 1 <= d <= 2**40 for d in dims)
    ):
        return None
    return rows, dims


def _ftm(x, n):
    if x is None:
        return list(range(n))
    v = int_list(x)
    if v is None or type(x) is np.ndarray or not v or any(not 0 <= t < n for t in v):
        return None
    return v


def _decay(kind, weight_decay, mode):
    """``(weight decay, embnum mode)`` the stand-in applies, or None where it refuses the pair (a
    decay > 0 that ``kind`` implements under no mode, or not under ``mode``)."""
    if float(weight_decay) <= 0:
        return 0.0, "none"  # no decay: the mode is not read (any member passes)
    implements = _DECAY_OF.get(kind, ())
    if mode == "NONE":
        decay = implements[0] if implements and kind != "rowwise_adagrad" else None
    else:
        decay = {"L2": "l2", "DECOUPLE": "decoupled"}.get(mode)
    return (weight_decay, decay) if decay in implements else None


def _split_options(args, n_tables):
    """The stand-in's own rules on the split module's options: ``(kind, TBEOptimizer, pooling, bounds,
    weights dtype, output dtype)``, or INVALID / BEYOND_FLOAT32 / None (as the model returns)."""
    import embnum

    names = {k: _named(args[k], v) for k, v in (("pooling_mode", _POOLING), ("bounds_check_mode", _BOUNDS))}
    names["weight_decay_mode"] = _named(args["weight_decay_mode"], _DECAY_MODES)
    precision, output = _float_type(args["weights_precision"]), _float_type(args["output_dtype"])
    if not isinstance(args["optimizer"], str) or args["optimizer"] not in _KIND:
        return INVALID
    if None in names.values() or None in (precision, output):
        return INVALID
    if any(not isinstance(args[k], (bool, np.bool_)) for k in ("gradient_clipping", "stochastic_rounding")):
        return INVALID
    tn = args["table_names"]
    if tn is not None and (
        not isinstance(tn, (list, tuple)) or len(tn) != n_tables or not all(isinstance(n, str) for n in tn)
    ):
        return INVALID
    kind = _KIND[args["optimizer"]]
    norm = _f32(args["max_norm"], minimum=0.0)
    if norm is None or _f32(args["weight_decay"], minimum=0.0) is None:
        return INVALID
    if norm == 0 and float(args["max_norm"]) > 0:
        return INVALID  # > 0 in float64, 0 in the kernels' float32: TBEOptimizer refuses it
    decay = _decay(kind, args["weight_decay"], names["weight_decay_mode"])
    if decay is None:
        return INVALID
    try:
        opt = embnum.TBEOptimizer(
            kind,
            learning_rate=args["learning_rate"],
            eps=args["eps"],
            weight_decay=decay[0],
            weight_decay_mode=decay[1],
            beta1=args["beta1"],
            beta2=args["beta2"],
            eta=args["eta"],
            momentum=args["momentum"],
            max_gradient=args["max_gradient"] if args["gradient_clipping"] else None,
            max_norm=args["max_norm"] if norm > 0 else None,
        )
    except hostile.CLEAN:
        return INVALID
    if max(abs(opt.learning_rate), opt.weight_decay, opt.eps, opt.momentum, opt.eta) >= 1e30:
        return BEYOND_FLOAT32  # an update past float32's range (as the TBEOptimizer surface)
    bounds = _BOUNDS_OP[names["bounds_check_mode"].replace("V2_", "")]
    return kind, opt, names["pooling_mode"].lower(), bounds, precision, output


def split_model(args):
    import embnum

    if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
        return None
    tables = _table_ints(args)
    if tables is None:
        return INVALID
    rows, dims = tables
    ftm = _ftm(args["feature_table_map"], len(rows))
    if ftm is None or ftm != sorted(ftm) or set(ftm) != set(range(len(rows))):
        return INVALID
    options = _split_options(args, len(rows))
    if not isinstance(options, tuple):
        return options
    kind, opt, pooling, bounds, precision, output = options
    lay = embnum.tbe_layout(rows, dims, ftm)
    if lay.num_weights > 2**20:
        return None  # no model for tables this large (the call may still answer, cleanly)
    psw = args["per_sample_weights"]
    if psw is not None and not (type(psw) is np.ndarray and psw.dtype.kind == "f"):
        return INVALID
    w = _initial_weights(lay.num_weights).astype(np.float16 if precision == "FP16" else np.float32)
    lookup = (w, *lay.arrays(), args["indices"], args["offsets"], pooling)
    psw32 = None if psw is None else psw.astype(np.float32)
    vbe = args["batch_size_per_feature_per_rank"]
    if isinstance(vbe, np.ndarray) and not plain(vbe):
        return None
    try:
        out = embnum.tbe_forward(
            *lookup,
            psw32,
            bounds_check_mode=bounds,
            batch_size_per_feature_per_rank=vbe,
            output_dtype="float16" if output == "FP16" else "float32",
            backend="ref",
        )
    except hostile.CLEAN:
        return INVALID
    if psw32 is not None and (not np.all(np.isfinite(psw32)) or np.abs(psw32).max(initial=0) >= 2.0**60):
        return BEYOND_FLOAT32
    if kind == "lars_sgd" and psw32 is not None and np.any((psw32 != 0) & (np.abs(psw32) < 1e-30)):
        # gradients down to float32's subnormals: the kernels' step stays finite (each element divided
        # by |g| first), but such a gradient holds a few significant bits, so it is not the float64 oracle's
        return BEYOND_FLOAT32
    sizes = opt.state_sizes(lay.num_weights, int(lay.hash_size_cumsum[-1]))
    states = {k: np.zeros(n, np.float32) for k, n in sizes.items()}
    grad = np.ones(out.shape, np.float32)
    if opt.max_gradient is not None:
        grad = np.minimum(grad, np.float32(opt.max_gradient))  # gradient clipping (the output gradient is 1)
    embnum.tbe_backward_update(
        grad,
        w,
        *lay.arrays(),
        args["indices"],
        args["offsets"],
        pooling,
        psw32,
        optimizer=opt,
        step=1 if opt.uses_step else None,
        batch_size_per_feature_per_rank=vbe,
        backend="ref",
        **states,
    )
    split = []
    for t, (r, d) in enumerate(zip(rows, dims)):
        for name, how in opt.state_layout.items():
            start = sum(rows[:t]) if how == "row" else sum(a * b for a, b in zip(rows[:t], dims[:t]))
            split.append((t, name, states[name][start : start + (r if how == "row" else r * d)]))
    ordered = [s for _, _, s in sorted(split, key=lambda x: (x[0], list(opt.state_layout).index(x[1])))]
    if any(not np.all(np.isfinite(a)) or np.abs(a).max(initial=0) > 1e30 for a in [w, *ordered]):
        return BEYOND_FLOAT32  # an update at float32's edge (lr 3.4e38): ref and the kernels may round apart
    return ("ok", {"out": out, "weights": w, "states": ordered})


# -- the training module's setters ----------------------------------------------------------------------
def setters_base(seed):
    return {"lr": 0.05 * (seed + 1), "eps": 1e-6, "beta1": 0.8, "beta2": 0.99, "weight_decay": 0.01, "step": seed}


def setters_call(args, kind):
    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    m = SplitTableBatchedEmbeddingBagsCodegen(
        [(4, 2, C.EmbeddingLocation.HOST, C.ComputeDevice.CPU)],
        optimizer=C.EmbOptimType.ADAM,
        weight_decay=0.001,
        weight_decay_mode=C.WeightDecayMode.DECOUPLE,
    )
    before = (m.optimizer_args, int(m.iter[0]))
    try:
        m.set_learning_rate(args["lr"])
        hyper = {k: args[k] for k in ("eps", "beta1", "beta2", "weight_decay")}
        m.update_hyper_parameters(hyper)
        m.set_optimizer_step(args["step"])
    except BaseException:
        if m.optimizer_args != before[0] and m.get_learning_rate() != args["lr"]:
            raise AssertionError("a rejected setter changed the optimizer") from None
        raise
    o = m.optimizer_args
    return {
        "lr": o.learning_rate,
        "eps": o.eps,
        "beta1": o.beta1,
        "beta2": o.beta2,
        "wd": o.weight_decay,
        "step": int(m.iter[0]),
        "lr_tensor": float(m.learning_rate_tensor),
    }


def setters_model(args):
    vals = {}
    for k, f in (("lr", {}), ("eps", {"minimum": 0.0}), ("beta1", {"minimum": 0.0, "below_one": True})):
        vals[k] = _f32(args[k], **f)
    vals["beta2"] = _f32(args["beta2"], minimum=0.0, below_one=True)
    vals["weight_decay"] = _f32(args["weight_decay"], minimum=0.0)
    if any(v is None for v in vals.values()):
        return INVALID
    if vals["weight_decay"] == 0 and float(args["weight_decay"]) != 0:
        return None  # decay 1e-50: as float32 0 (ADAM takes a decay of 0 under DECOUPLE)
    step = args["step"]
    if not is_int(step) or not 0 <= step <= 2**62:
        return INVALID
    lr = float(args["lr"])
    got = {k: float(args[k]) for k in ("eps", "beta1", "beta2")}
    return (
        "ok",
        {"lr": lr, **got, "wd": float(args["weight_decay"]), "step": int(step), "lr_tensor": float(np.float32(lr))},
    )


# -- the training module's checkpoint ------------------------------------------------------------------------
_CKPT_OPTIMIZERS = ("EXACT_ROWWISE_ADAGRAD", "ADAM", "EXACT_SGD", "EXACT_ADAGRAD", "PARTIAL_ROWWISE_ADAM", "LARS_SGD")


def _split_for_ckpt(seed):
    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen

    opt = C.EmbOptimType[_CKPT_OPTIMIZERS[seed % len(_CKPT_OPTIMIZERS)]]
    spec = [
        (4, 2, C.EmbeddingLocation.HOST, C.ComputeDevice.CPU),
        (3, 3, C.EmbeddingLocation.HOST, C.ComputeDevice.CPU),
    ]
    return SplitTableBatchedEmbeddingBagsCodegen(spec, optimizer=opt, bounds_check_mode=C.BoundsCheckMode.FATAL)


def split_ckpt_base(seed):
    m = _split_for_ckpt(seed)
    rng = np.random.default_rng(seed)
    args = {}
    for k, v in m.state_dict().items():
        a = v.detach().numpy().copy()
        args[k] = (a + rng.uniform(0, 1, a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a + (k == "iter")
    args["seed"] = seed
    return args


_CKPT_INPUT = (np.array([0, 3, 2, 1, 0], np.int64), np.array([0, 2, 2, 3, 5], np.int64))


def split_ckpt_call(args, kind):

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _split_for_ckpt(seed)
    _load_checked(m, args, kind)
    out = m(tensor(_CKPT_INPUT[0].copy()), tensor(_CKPT_INPUT[1].copy()))
    # the state as TorchRec reads it: per-table views of the weights and of the optimizer state
    tables, states = m.split_embedding_weights(), m.get_optimizer_state()
    return host({"state": dict(m.state_dict()), "out": out, "tables": tables, "optimizer_state": states})


def split_ckpt_model(args):
    seed = args["seed"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None
    m = _split_for_ckpt(seed)
    own = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    kind = _KIND[_CKPT_OPTIMIZERS[seed % len(_CKPT_OPTIMIZERS)]]
    squares = kind in ("adagrad", "rowwise_adagrad")  # Adagrad's sums of squares
    loaded = {}
    for k, like in own.items():
        x = args[k]
        if isinstance(x, np.ndarray) and not plain(x):
            return None
        if not plain(x) or x.shape != like.shape:
            return INVALID
        if k in ("weights_offsets", "D_offsets", "hash_size_cumsum", "weights_placements"):
            if x.dtype.kind not in "iu" or not np.array_equal(x.astype(np.int64), like.astype(np.int64)):
                return INVALID
            loaded[k] = like.copy()
            continue
        if k == "iter":
            if x.dtype.kind not in "iu" or not 0 <= int(x[0]) <= 2**62:
                return INVALID
            loaded[k] = x.astype(np.int64)
            continue
        if x.dtype.kind != "f":
            return INVALID
        with np.errstate(all="ignore"):
            y = x.astype(like.dtype)
        if not np.all(np.isfinite(y)) or (squares and k == "momentum1_host" and np.any(y < 0)):
            return INVALID
        if k.startswith("momentum2") and np.any(y < 0):
            return INVALID
        loaded[k] = y
    w = loaded["weights_host"].astype(np.float64)
    tables = [w[:8].reshape(4, 2), w[8:].reshape(3, 3)]
    ids, off = _CKPT_INPUT
    out = np.zeros((2, 5))
    for f, (t, lo) in enumerate(((tables[0], 0), (tables[1], 2))):
        for b in range(2):
            out[b, lo : lo + t.shape[1]] = t[ids[off[f * 2 + b] : off[f * 2 + b + 1]]].sum(0)
    return ("ok", {"state": loaded, "out": out, **_ckpt_views(kind, loaded)})


def _ckpt_views(kind, loaded):
    """``split_embedding_weights()`` and ``get_optimizer_state()`` of the checkpoint module (tables of
    4 x 2 and 3 x 3), from the loaded flat arrays."""

    def per_table(flat, rowwise):
        return [flat[:4], flat[4:]] if rowwise else [flat[:8].reshape(4, 2), flat[8:].reshape(3, 3)]

    names = {"sgd": (), "adagrad": ("sum",), "rowwise_adagrad": ("sum",), "lars_sgd": ("momentum_buffer",)}
    names = names.get(kind, ("exp_avg", "exp_avg_sq"))
    rowwise = {"rowwise_adagrad": (True,), "partial_rowwise_adam": (False, True)}.get(kind, (False, False))
    flats = [per_table(loaded[f"momentum{i + 1}_host"], rowwise[i]) for i in range(len(names))]
    states = [{n: flats[i][t] for i, n in enumerate(names)} for t in range(2)] if names else []
    return {"tables": per_table(loaded["weights_host"], False), "optimizer_state": states}


# -- DenseTableBatchedEmbeddingBagsCodegen ----------------------------------------------------------------
def dense_base(seed):
    rows, dims = [5, 4], [3, 2]
    return {"rows": rows, "dims": dims, "use_cpu": True, **_lookup_input(seed, rows, [0, 1])}


def dense_call(args, kind):
    import torch

    from embnum.fbgemm_compat.training import DenseTableBatchedEmbeddingBagsCodegen

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    m = DenseTableBatchedEmbeddingBagsCodegen(
        _specs(args["rows"], args["dims"], lambda r, d: (r, d)), use_cpu=args["use_cpu"]
    )
    with torch.no_grad():
        m.weights.copy_(torch.from_numpy(_initial_weights(m.weights.shape[0])))
    a = {k: on(kind, args[k]) for k in ("indices", "offsets", "per_sample_weights")}
    out = m(a["indices"], a["offsets"], a["per_sample_weights"])
    out.sum().backward()
    return host({"out": out, "grad": m.weights.grad})


def dense_model(args):
    if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
        return None
    tables = _table_ints(args)
    if tables is None or not isinstance(args["use_cpu"], (bool, np.bool_)):
        return INVALID
    rows, dims = tables
    if sum(r * d for r, d in zip(rows, dims)) > 2**20:
        return None
    idx, off, psw = args["indices"], args["offsets"], args["per_sample_weights"]
    if not (index_array(idx) and index_array(off)):
        return INVALID
    if psw is not None and not (type(psw) is np.ndarray and psw.dtype.kind == "f" and psw.shape == idx.shape):
        return INVALID
    T = len(rows)
    o = [int(x) for x in off.tolist()]
    if not o or (len(o) - 1) % T or o[0] != 0 or o[-1] != idx.shape[0] or any(a > b for a, b in zip(o, o[1:])):
        return INVALID
    B = (len(o) - 1) // T
    w = _initial_weights(sum(r * d for r, d in zip(rows, dims))).astype(np.float64)
    starts = np.concatenate([[0], np.cumsum([r * d for r, d in zip(rows, dims)])])
    out, grad = np.zeros((B, sum(dims))), np.zeros(w.shape)
    if psw is not None and (not np.all(np.isfinite(psw.astype(np.float32))) or np.abs(psw).max(initial=0) > 2.0**60):
        return None
    for t in range(T):
        table = w[starts[t] : starts[t + 1]].reshape(rows[t], dims[t])
        col = sum(dims[:t])
        for b in range(B):
            for p in range(o[t * B + b], o[t * B + b + 1]):
                i = int(idx[p])
                if not 0 <= i < rows[t]:
                    return INVALID
                s = 1.0 if psw is None else float(np.float32(psw[p]))
                out[b, col : col + dims[t]] += s * table[i]
                grad[starts[t] + i * dims[t] : starts[t] + (i + 1) * dims[t]] += s
    return ("ok", {"out": out, "grad": grad})


# -- IntNBitTableBatchedEmbeddingBagsCodegen ----------------------------------------------------------------
_TYS = ["INT8", "FP16", "FP32", "INT4"]


def nbit_base(seed):
    rows, dims = [5, 4], [4, 8]
    return {
        "rows": rows,
        "dims": dims,
        "weight_tys": [_TYS[seed % 4], _TYS[(seed + 1) % 4]],
        "row_alignment": (None, 1, 16, 8)[seed % 4],
        **_lookup_input(seed, rows, [0, 1]),
    }


def _values(rows, dim):
    """The float table the quantized rows encode (exactly, at every type drawn: multiples of 0.5 in [-2, 5.5])."""
    return ((np.arange(rows * dim).reshape(rows, dim) * 5) % 16) * 0.5 - 2.0


def _encode(table, ty):
    """``(codes, scale_bias or None)`` of ``table`` as fbgemm's rows of ``ty`` (scale 0.5, bias -2)."""
    if ty in ("FP32", "FP16"):
        return table.astype(np.float32 if ty == "FP32" else np.float16).view(np.uint8), None
    q = ((table + 2.0) / 0.5).astype(np.uint8)
    if ty == "INT4":
        q = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    sb = np.concatenate(
        [np.full((table.shape[0], 1), 0.5, np.float16), np.full((table.shape[0], 1), -2.0, np.float16)], 1
    )
    return q, sb.view(np.uint8)


def nbit_call(args, kind):
    import torch

    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.inference import IntNBitTableBatchedEmbeddingBagsCodegen

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    tys = args["weight_tys"]
    specs = args["rows"]
    if (
        isinstance(tys, (list, tuple))
        and isinstance(args["rows"], (list, tuple))
        and isinstance(args["dims"], (list, tuple))
    ):
        if len(tys) == len(args["rows"]) == len(args["dims"]):
            specs = [
                (f"t{i}", r, d, _enum_of(C.SparseType, ty), C.EmbeddingLocation.HOST)
                for i, (r, d, ty) in enumerate(zip(args["rows"], args["dims"], tys))
            ]
    m = IntNBitTableBatchedEmbeddingBagsCodegen(
        specs,
        bounds_check_mode=C.BoundsCheckMode.FATAL,
        output_dtype=C.SparseType.FP32,
        row_alignment=args["row_alignment"],
    )
    m.initialize_weights()
    weights = []
    for _, r, d, ty, _ in m.embedding_specs:
        codes, sb = _encode(_values(r, d), ty.name)
        weights.append((torch.from_numpy(codes), None if sb is None else torch.from_numpy(sb)))
    m.assign_embedding_weights(weights)
    a = {k: on(kind, args[k]) for k in ("indices", "offsets", "per_sample_weights")}
    return host({"out": m(a["indices"], a["offsets"], a["per_sample_weights"])})


def nbit_model(args):
    if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
        return None
    tables = _table_ints(args, low=0)
    tys = args["weight_tys"]
    if tables is None or not isinstance(tys, (list, tuple)) or len(tys) != len(tables[0]):
        return INVALID
    if any(t not in _TYS for t in tys):
        return INVALID
    rows, dims = tables
    if any(d * {"INT8": 8, "INT4": 4, "FP16": 16, "FP32": 32}[ty] % 8 for d, ty in zip(dims, tys)):
        return INVALID
    ra = args["row_alignment"]
    if ra is not None and (not is_int(ra) or ra < 1):
        return INVALID
    if sum(r * d for r, d in zip(rows, dims)) > 2**20 or (ra is not None and ra > 2**20):
        return None
    idx, off, psw = args["indices"], args["offsets"], args["per_sample_weights"]
    if not (index_array(idx) and index_array(off)):
        return INVALID
    if psw is not None:
        return None  # per-id weights of the quantized lookup: the op tier's (tbe_forward_quantized)
    T = len(rows)
    o = [int(x) for x in off.tolist()]
    if not o or (len(o) - 1) % T or o[0] != 0 or o[-1] != idx.shape[0] or any(a > b for a, b in zip(o, o[1:])):
        return None  # the op's own rules on offsets (the op tier's)
    B = (len(o) - 1) // T
    out = np.zeros((B, sum(dims)))
    for t in range(T):
        table = _values(rows[t], dims[t])
        col = sum(dims[:t])
        for b in range(B):
            for p in range(o[t * B + b], o[t * B + b + 1]):
                i = int(idx[p])
                if i == -1:
                    continue  # a pruned row: the quantized lookup's rule (it adds nothing)
                if not 0 <= i < rows[t]:
                    return INVALID
                out[b, col : col + dims[t]] += table[i]
    return ("ok", {"out": out})


# -- PermutePooledEmbeddings / PermutePooledEmbeddingsSplit ------------------------------------------------
def ppe_base(seed):
    rng = np.random.default_rng(seed)
    dims = [int(d) for d in rng.integers(0, 4, 3 + seed % 2)]
    perm = [int(p) for p in rng.permutation(len(dims))]
    B = int(rng.integers(1, 4))
    return {
        "embs_dims": dims,
        "permute": perm,
        "pooled_embs": rng.standard_normal((B, sum(dims))).astype((np.float32, np.float64)[seed % 2]),
    }


def ppe_call(split):
    def call(args, kind):
        from embnum.fbgemm_compat import permute

        if kind != "torch":
            raise NotExpressible("the stand-in modules take tensors")
        cls = permute.PermutePooledEmbeddingsSplit if split else permute.PermutePooledEmbeddings
        return host(cls(args["embs_dims"], args["permute"])(on(kind, args["pooled_embs"])))

    return call


def ppe_model(args):
    dims, perm, x = int_list(args["embs_dims"]), int_list(args["permute"]), args["pooled_embs"]
    if type(args["embs_dims"]) is np.ndarray or type(args["permute"]) is np.ndarray:
        return None  # the stand-in takes tensors or lists
    if dims is None or perm is None or any(d < 0 for d in dims) or sorted(perm) != list(range(len(dims))):
        return INVALID
    if isinstance(x, np.ndarray) and not plain(x):
        return None
    if not plain(x) or x.ndim != 2 or x.shape[1] != sum(dims):
        return INVALID
    if x.dtype not in (np.float32, np.float64, np.float16):
        return None  # the op's dtypes (the op tier's)
    starts = np.concatenate([[0], np.cumsum(dims)]).astype(int)
    return ("ok", np.concatenate([x[:, starts[p] : starts[p + 1]] for p in perm] + [x[:, :0]], axis=1))


# -- the torch.ops.fbgemm aliases with no embnum op behind them -------------------------------------------------
def _fbgemm_op(name):
    import sys

    import torch

    from embnum.torch_bridge import register_fbgemm_aliases

    if "fbgemm_gpu" in sys.modules:
        raise NotExpressible("fbgemm_gpu is loaded in this process: its own ops hold the names")
    register_fbgemm_aliases()
    return getattr(torch.ops.fbgemm, name)


def _alias_call(name, *args):
    try:
        return _fbgemm_op(name)(*args)
    except RuntimeError as e:  # the schema parser's refusal of a Python value: fbgemm's schema, not embnum
        if any(w in str(e).lower() for w in ("expected a value of type", f"fbgemm::{name.lower()}()", "device string")):
            raise NotExpressible(f"fbgemm's schema refuses it: {str(e)[:200]}") from None
        raise


def _tensors(xs):
    if not isinstance(xs, (list, tuple)):
        return xs
    return [tensor(x) if isinstance(x, np.ndarray) else x for x in xs]


def _float_arrays(xs, shapes_agree):
    """``xs``: a non-empty list of plain 2-D float arrays of one dtype (``None``: a list the model leaves)."""
    if not isinstance(xs, list) or not xs:
        return INVALID
    if any(isinstance(x, np.ndarray) and not plain(x) for x in xs):
        return None
    if any(not plain(x) for x in xs) or len({x.dtype for x in xs}) != 1:
        return INVALID
    if shapes_agree and len({x.shape for x in xs}) != 1:
        return INVALID
    return xs


def merge_base(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    dt = (np.float32, np.float64, np.float16)[seed % 3]
    xs = [rng.standard_normal((B, int(d))).astype(dt) for d in rng.integers(0, 4, 2 + seed % 2)]
    return {"pooled_embeddings": xs, "uncat_dim_size": B, "target_device": "cpu", "cat_dim": 1}


def merge_call(args, kind):
    if kind != "torch":
        raise NotExpressible("an alias takes tensors")
    a = args
    return host(
        _alias_call(
            "merge_pooled_embeddings",
            _tensors(a["pooled_embeddings"]),
            a["uncat_dim_size"],
            a["target_device"],
            a["cat_dim"],
        )
    )


def merge_model(args):
    xs = _float_arrays(args["pooled_embeddings"], False)
    if xs in (None, INVALID):
        return xs
    n, dim, dev = args["uncat_dim_size"], args["cat_dim"], args["target_device"]
    if dev != "cpu" or not is_int(n) or not is_int(dim):
        return None  # the schema's coercions (a device, an int): fbgemm's, not embnum's
    if dim not in (0, 1, -1, -2) or any(x.ndim != 2 for x in xs):
        return INVALID
    dim %= 2
    if any(x.shape[1 - dim] != n for x in xs):
        return INVALID
    return ("ok", np.concatenate(xs, axis=dim))


def reduce_base(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(0, 4, 1 + seed % 2))
    dt = (np.float32, np.float64)[seed % 2]
    return {
        "input_tensors": [rng.standard_normal(shape).astype(dt) for _ in range(1 + seed % 3)],
        "target_device": "cpu",
    }


def reduce_call(name):
    def call(args, kind):
        if kind != "torch":
            raise NotExpressible("an alias takes tensors")
        return host(_alias_call(name, _tensors(args["input_tensors"]), args["target_device"]))

    return call


def reduce_model(summed):
    def model(args):
        xs = args["input_tensors"]
        if args["target_device"] != "cpu":
            return None
        if isinstance(xs, list) and not xs and not summed:
            return ("ok", [])  # nothing to move (fbgemm's loop over no tensors)
        if not isinstance(xs, list) or not xs or any(not isinstance(x, np.ndarray) for x in xs):
            return None if isinstance(xs, list) and xs else INVALID
        if any(not plain(x) for x in xs) or any(x.dtype.kind not in "fiub" for x in xs):
            return None
        if not summed:
            return ("ok", [x.copy() for x in xs])
        if len({x.shape for x in xs}) != 1:
            return INVALID
        if len({x.dtype for x in xs}) != 1:
            return None  # torch's type promotion
        out = xs[0].copy()
        with np.errstate(all="ignore"):
            for x in xs[1:]:
                out = out + x
        return ("ok", out)

    return model


def uvm_base(seed):
    return {"t": np.arange(3 + seed, dtype=(np.float32, np.int64)[seed % 2])}


def uvm_call(args, kind):
    if kind != "torch":
        raise NotExpressible("an alias takes tensors")
    return _alias_call("is_uvm_tensor", on(kind, args["t"]))


def uvm_model(args):
    return ("ok", False) if plain(args["t"]) else None


def p2d1_base(seed):
    rng = np.random.default_rng(seed)
    T, B = 2 + seed % 2, int(rng.integers(1, 4))
    lengths = rng.integers(0, 3, T * B).astype((np.int32, np.int64)[seed % 2])
    n = int(lengths.sum())
    return {
        "permute": rng.permutation(T).astype(np.int32),
        "lengths": lengths,
        "values": rng.integers(0, 100, n).astype(np.int64),
        "stride": B,
        "weights": rng.uniform(0, 1, n).astype(np.float32) if seed % 3 else None,
    }


def p2d1_call(args, kind):
    if kind != "torch":
        raise NotExpressible("an alias takes tensors")
    a = {k: on(kind, v) for k, v in args.items()}
    return host(
        list(
            _alias_call(
                "permute_2D_sparse_data_input1D", a["permute"], a["lengths"], a["values"], a["stride"], a["weights"]
            )
        )
    )


def p2d1_model(args):
    perm, lengths, values, stride, weights = (args[k] for k in ("permute", "lengths", "values", "stride", "weights"))
    if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
        return None
    if not is_int(stride):
        return None  # the schema's SymInt coercion
    if not (index_array(perm) and index_array(lengths)) or not plain(values) or values.ndim != 1:
        return INVALID
    if values.dtype not in (np.float16, np.float32, np.float64, I32, I64):
        return INVALID  # the op's value dtypes
    if weights is not None and (
        not plain(weights) or weights.shape != values.shape or weights.dtype not in (np.float16, np.float32, np.float64)
    ):
        return INVALID
    if stride < 1 or lengths.shape[0] % stride:
        return INVALID if lengths.shape[0] or stride < 0 else None
    T = lengths.shape[0] // stride
    ls = [int(x) for x in lengths.tolist()]
    if any(x < 0 for x in ls) or sum(ls) != values.shape[0]:
        return INVALID
    p = [int(x) for x in perm.tolist()]
    if any(not 0 <= x < T for x in p):
        return INVALID
    starts = np.concatenate([[0], np.cumsum(ls)]).astype(int)
    out_l, out_v, out_w = [], [], []
    for f in p:
        for b in range(stride):
            i = f * stride + b
            out_l.append(ls[i])
            out_v.append(values[starts[i] : starts[i + 1]])
            if weights is not None:
                out_w.append(weights[starts[i] : starts[i + 1]])
    ol = np.array(out_l, lengths.dtype)
    ov = np.concatenate(out_v + [values[:0]])
    ow = None if weights is None else np.concatenate(out_w + [weights[:0]])
    return ("ok", [ol, ov, ow])


# -- the dense module's and the inference module's checkpoints, the inference module's assign ------------------
def _dense_for_ckpt(seed):
    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.training import DenseTableBatchedEmbeddingBagsCodegen

    precision = (C.SparseType.FP32, C.SparseType.FP16)[seed % 2]
    return DenseTableBatchedEmbeddingBagsCodegen([(4, 2), (3, 3)], use_cpu=True, weights_precision=precision)


def _shifted(module, seed):
    """The module's state dict as NumPy, its floats shifted by the seed (the loaded state differs from
    the module's own)."""
    rng = np.random.default_rng(seed)
    args = {}
    for k, v in module.state_dict().items():
        a = v.detach().numpy().copy()
        args[k] = (a + rng.uniform(0, 1, a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
    args["seed"] = seed
    return args


def dense_ckpt_base(seed):
    return _shifted(_dense_for_ckpt(seed), seed)


def _load_checked(module, args, kind):
    """``module.load_state_dict`` of the drawn entries (``assign`` by the seed); a rejected checkpoint
    must leave the module as it was."""
    import torch

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    before = {k: v.clone() for k, v in module.state_dict().items()}
    try:
        module.load_state_dict({k: on(kind, v) for k, v in args.items() if k != "seed"}, assign=bool(seed % 2))
    except BaseException:
        if any(not torch.equal(before[k], v) for k, v in module.state_dict().items()):
            raise AssertionError("a rejected checkpoint changed the module") from None
        raise


def dense_ckpt_call(args, kind):
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _dense_for_ckpt(seed)
    _load_checked(m, args, kind)
    out = m(tensor(_CKPT_INPUT[0].copy()), tensor(_CKPT_INPUT[1].copy()))
    return host({"state": dict(m.state_dict()), "out": out, "tables": m.split_embedding_weights()})


def _pooled_ckpt_output(tables):
    """The two-feature batch ``_CKPT_INPUT`` (batch 2) pooled (SUM) over ``tables`` ``[4, 2]`` and ``[3, 3]``."""
    ids, off = _CKPT_INPUT
    out = np.zeros((2, 5))
    for f, (t, lo) in enumerate(((tables[0], 0), (tables[1], 2))):
        for b in range(2):
            out[b, lo : lo + t.shape[1]] = t[ids[off[f * 2 + b] : off[f * 2 + b + 1]]].astype(np.float64).sum(0)
    return out


def _layout_entry(x, like):
    """A layout entry: integer, equal to the module's (None: the model rejects it)."""
    if x.dtype.kind not in "iu" or not np.array_equal(x.astype(np.int64), like.astype(np.int64)):
        return None
    return like.copy()


def dense_ckpt_model(args):
    seed = args["seed"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None
    own = {k: v.detach().numpy() for k, v in _dense_for_ckpt(seed).state_dict().items()}
    loaded = {}
    for k, like in own.items():
        x = args[k]
        if isinstance(x, np.ndarray) and not plain(x):
            return None
        if not plain(x) or x.shape != like.shape:
            return INVALID
        if k != "weights":
            loaded[k] = _layout_entry(x, like)
            if loaded[k] is None:
                return INVALID
            continue
        if x.dtype.kind != "f":
            return INVALID
        with np.errstate(all="ignore"):
            loaded[k] = x.astype(like.dtype)
        if not np.all(np.isfinite(loaded[k])):
            return INVALID
    w = loaded["weights"]
    tables = [w[:8].reshape(4, 2), w[8:].reshape(3, 3)]
    out = _pooled_ckpt_output(tables).astype(np.float32)  # FP32 output (of FP16 weights too)
    return ("ok", {"state": loaded, "out": out, "tables": tables})


# the inference module of the checkpoint and assign surfaces: tables of 5 x 4 and 4 x 8 rows (by the seed
# INT8 and FP16, or INT4 and FP32: scale-bias rows and plain float rows), each table on a 128-byte line
_NBIT_TYS = (("INT8", "FP16"), ("INT4", "FP32"))
_NBIT_SHAPES = ((5, 4), (4, 8))


def _nbit_for_state(seed, initialize=True):
    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.inference import IntNBitTableBatchedEmbeddingBagsCodegen

    tys = _NBIT_TYS[seed % 2]
    specs = [
        (f"t{t}", r, d, C.SparseType[ty], C.EmbeddingLocation.HOST)
        for t, ((r, d), ty) in enumerate(zip(_NBIT_SHAPES, tys))
    ]
    m = IntNBitTableBatchedEmbeddingBagsCodegen(
        specs, bounds_check_mode=C.BoundsCheckMode.FATAL, output_dtype=C.SparseType.FP32
    )
    if initialize:
        m.initialize_weights()
    return m


_BYTES_PER = {"INT8": 1.0, "INT4": 0.5, "FP16": 2.0, "FP32": 4.0}


def _row_bytes(ty, dim):
    return int(dim * _BYTES_PER[ty]) + (4 if ty.startswith("INT") else 0)


def _nbit_parts(seed):
    """Per table ``(codes, scale_bias or None)`` encoding ``_values`` at the seed's types."""
    return [_encode(_values(r, d), ty) for (r, d), ty in zip(_NBIT_SHAPES, _NBIT_TYS[seed % 2])]


def _decoded(codes, sb, ty, rows, dim):
    """The float64 table ``[rows, dim]`` that fbgemm's rows ``codes`` (and ``scale_bias``) of ``ty`` mean."""
    if ty in ("FP32", "FP16"):
        return np.ascontiguousarray(codes).view(np.float32 if ty == "FP32" else np.float16).astype(np.float64)
    q = codes.astype(np.int64)
    if ty == "INT4":
        q = np.stack([q & 15, q >> 4], axis=2).reshape(rows, dim)
    sb = np.ascontiguousarray(sb).view(np.float16).astype(np.float64)
    return q * sb[:, :1] + sb[:, 1:2]


def _nbit_output(seed, parts):
    """The pooled (SUM) output of ``_CKPT_INPUT``'s shape of batch over tables ``parts``; None where a
    decoded value is not finite or past float32 (random bytes of a mutated buffer)."""
    tables = [_decoded(c, s, ty, r, d) for (c, s), ty, (r, d) in zip(parts, _NBIT_TYS[seed % 2], _NBIT_SHAPES)]
    ids, off = _NBIT_INPUT
    out = np.zeros((2, 12))
    for f, (t, lo) in enumerate(((tables[0], 0), (tables[1], 4))):
        for b in range(2):
            out[b, lo : lo + t.shape[1]] = t[ids[off[f * 2 + b] : off[f * 2 + b + 1]]].sum(0)
    if not np.all(np.isfinite(out)) or np.abs(out).max(initial=0) > 1e30:
        return None
    return out


_NBIT_INPUT = (np.array([0, 4, 2, 1, 3], np.int64), np.array([0, 2, 2, 3, 5], np.int64))


def _nbit_forward(m):
    return m(tensor(_NBIT_INPUT[0].copy()), tensor(_NBIT_INPUT[1].copy()))


def nbit_ckpt_base(seed):
    m = _nbit_for_state(seed)
    m.assign_embedding_weights([(tensor(c), None if s is None else tensor(s)) for c, s in _nbit_parts(seed)])
    args = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    args["seed"] = seed
    return args


def nbit_ckpt_call(args, kind):
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _nbit_for_state(seed)
    _load_checked(m, args, kind)
    return host({"state": dict(m.state_dict()), "out": _nbit_forward(m)})


def _nbit_layout(seed):
    """The module's layout entries (fbgemm's: each table on a 128-byte line, int8/int4 rows led by 4
    bytes of scale and bias) and the size of its packed buffer."""
    tys = _NBIT_TYS[seed % 2]
    sizes = [r * _row_bytes(ty, d) for (r, d), ty in zip(_NBIT_SHAPES, tys)]
    starts = [0, -(-sizes[0] // 128) * 128]
    codes = {"FP32": 0, "FP16": 1, "INT8": 2, "INT4": 3}
    dims = [d for _, d in _NBIT_SHAPES]
    layout = {
        "weights_offsets": np.array(starts, np.int64),
        "weights_tys": np.array([codes[t] for t in tys], np.uint8),
        "D_offsets": np.array([0, dims[0], dims[0] + dims[1]], np.int32),
        "rows_per_table": np.array([r for r, _ in _NBIT_SHAPES], np.int64),
    }
    return layout, starts, starts[1] + -(-sizes[1] // 128) * 128


def nbit_ckpt_model(args):
    seed = args["seed"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None
    layout, starts, size = _nbit_layout(seed)
    loaded = {}
    for k, like in layout.items():
        x = args[k]
        if isinstance(x, np.ndarray) and not plain(x):
            return None
        if not plain(x) or x.shape != like.shape:
            return INVALID
        loaded[k] = _layout_entry(x, like)
        if loaded[k] is None:
            return INVALID
    for k, n in (("weights_host", size), ("weights_dev", 0)):
        x = args[k]
        if isinstance(x, np.ndarray) and not plain(x):
            return None
        if not plain(x) or x.shape != (n,) or x.dtype != np.uint8:
            return INVALID
        loaded[k] = x.copy()
    buf, parts = loaded["weights_host"], []
    for (r, d), ty, start in zip(_NBIT_SHAPES, _NBIT_TYS[seed % 2], starts):
        rows = buf[start : start + r * _row_bytes(ty, d)].reshape(r, -1)
        parts.append((rows, None) if ty.startswith("FP") else (rows[:, 4:], rows[:, :4]))
    out = _nbit_output(seed, parts)
    return None if out is None else ("ok", {"state": loaded, "out": out})


def nbit_assign_base(seed):
    codes, sbs = zip(*_nbit_parts(seed))
    return {"codes": list(codes), "scale_bias": list(sbs), "seed": seed}


def nbit_assign_call(args, kind):
    import torch

    if kind != "torch":
        raise NotExpressible("the stand-in modules take tensors")
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _nbit_for_state(seed)
    codes, sbs = args["codes"], args["scale_bias"]
    pairs = list(zip(_tensors(codes), _tensors(sbs))) if isinstance(codes, list) and isinstance(sbs, list) else codes
    before = m.weights.clone()
    try:
        m.assign_embedding_weights(pairs)
    except BaseException:
        if not torch.equal(before, m.weights):
            raise AssertionError("a rejected assign changed the module") from None
        raise
    return host({"tables": m.split_embedding_weights(), "out": _nbit_forward(m)})


def nbit_assign_model(args):
    seed, codes, sbs = args["seed"], args["codes"], args["scale_bias"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None
    if not isinstance(codes, list) or not isinstance(sbs, list) or len(codes) != 2 or len(sbs) != 2:
        return None if isinstance(codes, list) and isinstance(sbs, list) else INVALID
    parts = []
    for (c, s), (r, d), ty in zip(zip(codes, sbs), _NBIT_SHAPES, _NBIT_TYS[seed % 2]):
        if any(isinstance(a, np.ndarray) and not plain(a) for a in (c, s)):
            return None
        n = _row_bytes(ty, d) - (4 if ty.startswith("INT") else 0)
        if not plain(c) or c.dtype != np.uint8 or c.shape != (r, n):
            return INVALID
        if ty.startswith("FP") and s is not None:
            return INVALID
        if ty.startswith("INT") and (not plain(s) or s.dtype != np.uint8 or s.shape != (r, 4)):
            return INVALID
        parts.append((c, s))
    out = _nbit_output(seed, parts)
    if out is None:
        return None
    return ("ok", {"tables": [[c, s] for c, s in parts], "out": out})


# -- fbgemm's quantized lookup operator (torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function) ------
_LOOKUP_OP = "int_nbit_split_embedding_codegen_lookup_function"
_LOOKUP_ARGS = (
    "dev_weights",
    "uvm_weights",
    "weights_placements",
    "weights_offsets",
    "weights_tys",
    "D_offsets",
    "total_D",
    "max_int2_D",
    "max_int4_D",
    "max_int8_D",
    "max_float16_D",
    "max_float32_D",
    "indices",
    "offsets",
    "pooling_mode",
    "indice_weights",
    "output_dtype",
    "lxu_cache_weights",
    "lxu_cache_locations",
    "row_alignment",
)


def lookup_base(seed):
    """The inference module's buffers (the checkpoint surface's tables, whose rows are packed to
    ``row_alignment`` 1 on the CPU) and a batch of 1 to 3 bags per feature, as fbgemm's module passes them."""
    m = _nbit_for_state(seed)
    m.assign_embedding_weights([(tensor(c), None if s is None else tensor(s)) for c, s in _nbit_parts(seed)])
    sd = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    tys = _NBIT_TYS[seed % 2]
    dims = dict(zip(tys, (d for _, d in _NBIT_SHAPES)))
    args = {
        "dev_weights": sd["weights_host"],
        "uvm_weights": np.zeros(0, np.uint8),
        "weights_placements": np.array([3, 3], np.int32),
        "weights_offsets": sd["weights_offsets"],
        "weights_tys": sd["weights_tys"],
        "D_offsets": sd["D_offsets"],
        "total_D": int(sd["D_offsets"][-1]),
        "max_int2_D": 0,
        **{f"max_{k}_D": dims.get(ty, 0) for k, ty in (("int4", "INT4"), ("int8", "INT8"))},
        **{f"max_{k}_D": dims.get(ty, 0) for k, ty in (("float16", "FP16"), ("float32", "FP32"))},
        **_lookup_input(seed, [r for r, _ in _NBIT_SHAPES], [0, 1]),
        "pooling_mode": seed % 4 // 2,
        "output_dtype": seed % 3 % 2,
        "lxu_cache_weights": None,
        "lxu_cache_locations": None,
        "row_alignment": (None, 1)[seed % 2],
    }
    args["indice_weights"] = args.pop("per_sample_weights") if args["pooling_mode"] == 0 else None
    args.pop("per_sample_weights", None)
    return args


def lookup_call(args, kind):
    import sys

    from embnum.fbgemm_compat import operators

    if kind != "torch":
        raise NotExpressible("an operator takes tensors")
    if "fbgemm_gpu" not in sys.modules:
        operators.register_operators()
    a = [_tensors(args[k]) if isinstance(args[k], list) else on(kind, args[k]) for k in _LOOKUP_ARGS]
    try:
        return host(_alias_call(_LOOKUP_OP, *a))
    except NotImplementedError as e:
        if "not available" not in str(e) and "only fp32" not in str(e):
            raise
        raise NotExpressible(f"a feature the stand-in refuses by name: {e}") from None


def lookup_model(args):
    """The operator's own rules (the feature placements, the row counts from the byte layout), then the
    ``ref`` op it calls."""
    import embnum

    if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
        return None
    ints = ("total_D", "pooling_mode", "output_dtype") + tuple(k for k in _LOOKUP_ARGS if k.startswith("max_"))
    if any(not is_int(args[k]) for k in ints) or not (args["row_alignment"] is None or is_int(args["row_alignment"])):
        return None  # the schema's int coercions (fbgemm's)
    if args["lxu_cache_weights"] is not None or args["lxu_cache_locations"] is not None:
        return None  # the cache arguments: drawn as tensors only by dtype/shape mutations of None (none)
    frame = [args[k] for k in ("weights_offsets", "weights_tys", "D_offsets", "weights_placements")]
    if any(not plain(x) or x.ndim != 1 or x.dtype.kind not in "iu" for x in frame):
        return INVALID
    woffs, codes, D, place = ([int(v) for v in x.tolist()] for x in frame)
    T = len(woffs)
    if len(codes) != T or len(D) != T + 1 or len(place) != T or any(not 0 <= p <= 4 for p in place):
        return INVALID
    if any(p not in (0, 3) for p in place) or any(4 < c <= 9 for c in codes):
        return None  # a feature the stand-in refuses by name (NotImplementedError: not drawn as an error)
    if (
        any(not 0 <= c <= 9 for c in codes)
        or args["pooling_mode"] not in (0, 1, 2)
        or args["output_dtype"] not in (0, 1)
    ):
        return INVALID
    ra = 1 if args["row_alignment"] is None else args["row_alignment"]
    w = args["dev_weights"]
    if D[-1] != args["total_D"] or ra < 1 or not plain(w) or w.ndim != 1:
        return INVALID
    if ra > 2**20 or args["pooling_mode"] == 2:
        return None  # the op's own rules (the op tier's)
    starts, rows = sorted(set(woffs)) + [w.shape[0]], []
    for t, (start, code) in enumerate(zip(woffs, codes)):
        dim = D[t + 1] - D[t]
        raw = (4 * dim, 2 * dim, dim + 4, dim // 2 + 4, dim // 4 + 4)[code]
        width = -(-raw // ra) * ra
        end = next((s for s in starts if s > start), w.shape[0])
        rows.append(max(end - start, 0) // max(width, 1))
        if rows[-1] < 1 and start >= 0:
            return INVALID
    psw = args["indice_weights"]
    if psw is not None and not (plain(psw) and psw.dtype.kind == "f"):
        return INVALID
    try:
        out = embnum.tbe_forward_quantized(
            w,
            args["weights_offsets"],
            args["weights_tys"],
            args["D_offsets"],
            np.array(rows, np.int64),
            args["indices"],
            args["offsets"],
            ("sum", "mean")[args["pooling_mode"]],
            None if psw is None else psw.astype(np.float32),
            row_alignment=ra,
            output_dtype=("float32", "float16")[args["output_dtype"]],
            backend="ref",
        )
    except hostile.CLEAN:
        return INVALID
    if psw is not None and (not np.all(np.isfinite(psw.astype(np.float32))) or np.abs(psw).max(initial=0) > 2.0**60):
        return None
    return ("ok", out)


# -- the communication codec (QuantizedCommCodec: TorchRec's qcomms) -------------------------------------------
def codec_base(seed):
    rng = np.random.default_rng(seed)
    precision = ("FP32", "FP16", "INT8")[seed % 3]
    x = rng.standard_normal(32 * (1 + seed % 2)).astype(np.float32)
    return {
        "comm_precision": precision,
        "loss_scale": 4.0 if precision == "FP16" and seed % 2 else None,
        "row_dim": 8 if seed % 4 == 3 else None,
        "input_tensor": x * 100 if seed == 4 else x,
        "input_len": x.shape[0],
    }


def codec_call(args, kind):
    import torch

    from embnum.fbgemm_compat import configs as C
    from embnum.fbgemm_compat.quantize import QuantizedCommCodec

    if kind != "torch":
        raise NotExpressible("the codec takes tensors")
    try:
        codec = QuantizedCommCodec(
            _enum_of(C.SparseType, args["comm_precision"]), loss_scale=args["loss_scale"], row_dim=args["row_dim"]
        )
    except NotImplementedError as e:
        if "not available" not in str(e):
            raise
        raise NotExpressible(f"a precision the stand-in refuses by name: {e}") from None
    ctx = codec.create_context()
    encoded = codec.encode(on(kind, args["input_tensor"]), ctx)
    decoded = codec.decode(encoded, ctx)
    size = codec.calc_quantized_size(args["input_len"], ctx)
    if encoded.dtype == torch.bfloat16:
        encoded = encoded.float()
    return host({"encoded": encoded, "decoded": decoded, "size": size})


def codec_model(args):
    import embnum

    p, ls, rd, x, n = (args[k] for k in ("comm_precision", "loss_scale", "row_dim", "input_tensor", "input_len"))
    if isinstance(x, np.ndarray) and not plain(x):
        return None
    if p in ("FP8", "NFP8", "MX4", "INT4", "INT2", "BF16"):
        return None  # refused by name (NotImplementedError) / BF16 rounding: not modelled here
    if p not in ("FP32", "FP16", "INT8"):
        return INVALID
    scale = None
    if ls is not None:
        scale = _f32(ls, minimum=0.0, strict=True)
        if scale is None:
            return INVALID
    if rd is not None and (not is_int(rd) or not 1 <= rd <= 2**31 - 1):
        return INVALID
    if not plain(x) or x.dtype.kind != "f":
        return INVALID
    if not is_int(n) or n < 0:
        return INVALID
    if p == "INT8" and (x.size % 32 or n % 32):
        return INVALID
    x32 = x.astype(np.float32)
    if p == "FP32":
        return ("ok", {"encoded": x, "decoded": x32, "size": int(n)})
    if p == "FP16":
        with np.errstate(all="ignore"):  # torch's product: float64 by the double, others in float32
            y = x
            if ls is not None:
                y = x * float(ls) if x.dtype == np.float64 else (x32 * np.float32(float(ls))).astype(x.dtype)
            enc = np.clip(y, -65504.0, 65504.0).astype(np.float16)
            dec = enc.astype(np.float32)
            dec = dec if ls is None else dec / np.float32(float(ls))
        return ("ok", {"encoded": enc, "decoded": dec, "size": int(n)})
    rows = embnum.float_to_fused_8bit_rowwise(x32.reshape(-1, 32), backend="ref")
    dec = embnum.fused_8bit_rowwise_to_float(rows, backend="ref").reshape(-1)
    return ("ok", {"encoded": rows.reshape(-1), "decoded": dec, "size": int(n) // 32 * 40})
