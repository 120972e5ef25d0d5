"""Surfaces of the torch modules for the hostile tier (``hostile_surfaces.py``):
EmbeddingBagCollection (forward and backward), TBE, FusedTBE, TBEOptimizer (through
``tbe_backward_update`` on each backend and FusedTBE), and the EBC's ``load_state_dict``."""

from __future__ import annotations

import math
import numbers

import numpy as np

import hostile
from hostile_containers import build_kjt, jagged_model
from hostile_models import (
    BEYOND_FLOAT32,
    I32,
    I64,
    INVALID,
    NotExpressible,
    backend_of,
    host,
    is_int,
    on,
    plain,
    tensor,
)

# -- the torch modules ------------------------------------------------------------------------------------
_MODULES: dict = {}


def _ebc(weighted):
    from embnum.modules import EmbeddingBagCollection, EmbeddingBagConfig

    key = ("ebc", weighted)
    if key not in _MODULES:
        tables = [
            EmbeddingBagConfig(5, 3, "t0", feature_names=["a", "b"]),
            EmbeddingBagConfig(4, 2, "t1", feature_names=["c"], pooling="sum" if weighted else "mean"),
        ]
        _MODULES[key] = EmbeddingBagCollection(tables, is_weighted=weighted, seed=1)
    return _MODULES[key]


_ROWS = {"a": 5, "b": 5, "c": 4}


def ebc_base(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    lengths = rng.integers(0, 3, 3 * B).astype((np.int32, np.int64)[seed % 2])
    o = np.concatenate([[0], np.cumsum(lengths)])
    values = np.concatenate(
        [rng.integers(0, _ROWS["abc"[b // B]], lengths[b]) for b in range(3 * B)] + [np.zeros(0, np.int64)]
    ).astype(np.int64)
    assert values.shape[0] == o[-1]
    return {
        "keys": ["a", "b", "c"],
        "values": values,
        "weights": rng.uniform(0, 2, values.shape[0]).astype(np.float32) if seed % 2 else None,
        "lengths": lengths,
        "stride": None,
    }


def ebc_call(args, kind):
    import torch

    if kind != "torch":
        raise NotExpressible("the modules take tensors")
    ebc = _ebc(args["weights"] is not None)
    for p in ebc.parameters():
        p.grad = None
    kt = ebc(build_kjt(args, kind, "init"))
    out = kt.values()
    out.sum().backward()
    grads = [ebc.embedding_bags[t].weight.grad for t in ("t0", "t1")]
    return host({"pooled": out, "grads": [torch.zeros(0) if g is None else g for g in grads]})


def ebc_model(args):
    m = jagged_model(args, True)
    if m in (INVALID, None):
        return m
    keys, stride, lengths, values, weights = m
    if any(k not in keys for k in "abc"):
        return INVALID
    if values.dtype not in (I32, I64):
        return INVALID
    weighted = args["weights"] is not None
    w = {t: _ebc(weighted).embedding_bags[t].weight.detach().double().numpy() for t in ("t0", "t1")}
    grads = {t: np.zeros_like(w[t]) for t in w}
    o = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    cols = []
    for f in "abc":
        t, mean = ("t1", not weighted) if f == "c" else ("t0", False)
        i = keys.index(f)
        col = np.zeros((stride, w[t].shape[1]))
        for b in range(stride):
            a, e = o[i * stride + b], o[i * stride + b + 1]
            ids = [int(x) for x in values[a:e].tolist()]
            if any(not 0 <= x < _ROWS[f] for x in ids):
                return INVALID
            psw = [1.0] * len(ids) if weights is None else [float(x) for x in weights[a:e].tolist()]
            scale = 1.0 / len(ids) if mean and ids else 1.0
            for x, s in zip(ids, psw):
                col[b] += w[t][x] * s * scale
                grads[t][x] += s * scale
        cols.append(col)
    return ("ok", {"pooled": np.concatenate(cols, axis=1), "grads": [grads["t0"], grads["t1"]]})


def tbe_base(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    lengths = rng.integers(0, 3, 2 * B)
    rows = [5] * B + [4] * B
    indices = np.concatenate([rng.integers(0, rows[b], lengths[b]) for b in range(2 * B)] + [np.zeros(0, np.int64)])
    return {
        "indices": indices.astype((np.int32, np.int64)[seed % 2]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype((np.int32, np.int64)[seed % 2]),
        "per_sample_weights": rng.uniform(0, 2, indices.shape[0]).astype(np.float32) if seed % 3 else None,
    }


def _tbe_module(fused):
    import embnum
    from embnum.modules import TBE, FusedTBE

    if fused:  # a fresh one per case: its update changes it
        return FusedTBE([5, 4], [3, 2], optimizer=embnum.TBEOptimizer("rowwise_adagrad", 0.5), seed=2)
    if "tbe" not in _MODULES:
        _MODULES["tbe"] = TBE([5, 4], [3, 2], seed=2)
    return _MODULES["tbe"]


def tbe_call(fused):
    def call(args, kind):
        import torch

        if kind != "torch":
            raise NotExpressible("the modules take tensors")
        m = _tbe_module(fused)
        a = {k: on(kind, v) for k, v in args.items()}
        out = m(a["indices"], a["offsets"], a["per_sample_weights"])
        if not fused:
            return host({"out": out})
        out.backward(torch.ones_like(out))
        return host({"out": out, "weights": m.weights, "momentum1": m.momentum1, "step": m.step})

    return call


def tbe_model(fused):
    def model(args):
        """The op's reference (fuzzed by the op tier) on the module's weights and layout."""
        import embnum

        m = _tbe_module(fused)
        if any(isinstance(a, np.ndarray) and not plain(a) for a in args.values()):
            return None
        w = m.weights.detach().numpy().copy()
        lay = [x.numpy() for x in m.layout()]
        try:
            out = embnum.tbe_forward(
                w, *lay, args["indices"], args["offsets"], "sum", args["per_sample_weights"], backend="ref"
            )
        except hostile.CLEAN:
            return INVALID
        if not fused:
            return ("ok", {"out": out})
        psw = args["per_sample_weights"]
        if psw is not None and psw.size and np.abs(psw.astype(np.float64)).max() >= 2.0**63:
            # a row gradient of such entries has float32 squares of inf (the fused update sums squares in
            # float32, as fbgemm): the float64 oracle's finite momentum is not what float32 can say
            return BEYOND_FLOAT32
        m1 = m.momentum1.numpy().copy()
        embnum.tbe_backward_update(
            np.ones_like(out),
            w,
            *lay,
            args["indices"],
            args["offsets"],
            "sum",
            args["per_sample_weights"],
            optimizer=m.optimizer,
            momentum1=m1,
            backend="ref",
        )
        return ("ok", {"out": out, "weights": w, "momentum1": m1, "step": 1})

    return model


# -- TBEOptimizer -------------------------------------------------------------------------------------------
_OPT_KINDS = [
    ("sgd", "none", 0.0),
    ("adagrad", "none", 0.0),
    ("rowwise_adagrad", "l2", 0.01),
    ("rowwise_adagrad", "decoupled", 0.01),
    ("adam", "decoupled", 0.01),
    ("lamb", "none", 0.0),
    ("partial_rowwise_adam", "none", 0.0),
    ("partial_rowwise_lamb", "decoupled", 0.02),
    ("lars_sgd", "l2", 0.01),
]


def opt_base(seed):
    kind, mode, wd = _OPT_KINDS[seed % len(_OPT_KINDS)]
    return dict(
        kind=kind,
        learning_rate=0.1,
        eps=1e-8,
        weight_decay=wd,
        weight_decay_mode=mode,
        beta1=0.9,
        beta2=0.999,
        max_gradient=None if seed % 2 else 2.0,
        eta=0.001,
        momentum=0.9,
        max_norm=None if seed % 3 else 1.5,
    )


def _opt_example():
    import embnum

    lay = embnum.tbe_layout([4, 3], [2, 3])
    rng = np.random.default_rng(0)
    return dict(
        weights=rng.standard_normal(lay.num_weights).astype(np.float32),
        layout=lay,
        indices=np.array([1, 3, 1, 0, 2], np.int64),
        offsets=np.array([0, 2, 3, 5], np.int64),
        grad=rng.standard_normal((1, 5)).astype(np.float32),
    )


def opt_call(args, kind):
    import embnum

    opt = embnum.TBEOptimizer(**args)
    ex = _opt_example()
    lay = ex["layout"]
    sizes = opt.state_sizes(lay.num_weights, int(lay.hash_size_cumsum[-1]))
    if kind == "torch":
        import torch

        from embnum.modules import FusedTBE

        m = FusedTBE([4, 3], [2, 3], optimizer=opt)
        with torch.no_grad():
            m.weights.copy_(torch.from_numpy(ex["weights"]))
        # two features, batch 1: offsets [0, 2, 3] -> bags (1, 3) of table 0, (1) of table 1
        out = m(torch.tensor([1, 3, 1]), torch.tensor([0, 2, 3]))
        out.backward(torch.from_numpy(ex["grad"]))
        states = {k: getattr(m, k) for k in sizes}
        return host({"weights": m.weights, **states})
    w = ex["weights"].copy()
    states = {k: np.zeros(n, np.float32) for k, n in sizes.items()}
    embnum.tbe_backward_update(
        ex["grad"],
        w,
        *lay.arrays(),
        np.array([1, 3, 1]),
        np.array([0, 2, 3]),
        "sum",
        optimizer=opt,
        step=1 if opt.uses_step else None,
        backend=backend_of(kind),
        **states,
    )
    return {"weights": w, **states}


def _f32(x, *, minimum=None, strict=False, below_one=False):
    """The float32 the kernels would read, if it is valid, else None."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        return None
    try:
        x64 = float(x)
    except OverflowError:
        return None
    with np.errstate(all="ignore"):
        v = float(np.float32(x64))
    if not math.isfinite(v):
        return None
    if minimum is not None and (v < minimum or (strict and v == minimum)):
        return None
    if below_one and v >= 1:
        return None
    return v


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


def opt_model(args):
    kind, mode = args["kind"], args["weight_decay_mode"]
    if not isinstance(kind, str) or not isinstance(mode, str):
        return INVALID
    names = {"exact_sgd": "sgd", "exact_adagrad": "adagrad", "exact_row_wise_adagrad": "rowwise_adagrad"}
    kind = names.get(kind.lower(), kind.lower())
    if kind not in _DECAY_OF or mode.lower() not in ("none", "l2", "decoupled"):
        return INVALID
    mode = mode.lower()
    checks = [
        _f32(args["learning_rate"]),
        _f32(args["eps"], minimum=0.0),
        _f32(args["weight_decay"], minimum=0.0),
        _f32(args["eta"], minimum=0.0),
        _f32(args["momentum"], minimum=0.0),
        _f32(args["beta1"], minimum=0.0, below_one=True),
        _f32(args["beta2"], minimum=0.0, below_one=True),
    ]
    for name in ("max_gradient", "max_norm"):
        if args[name] is not None:
            checks.append(_f32(args[name], minimum=0.0, strict=True))
    if any(c is None for c in checks):
        return INVALID
    decay = float(args["weight_decay"]) > 0
    modes = _DECAY_OF[kind]
    if not modes and (decay or mode != "none"):
        return INVALID
    if modes and (mode not in ("none",) + modes or (decay and mode == "none")):
        return INVALID
    if max(abs(c) for c in checks[:5]) >= 1e30:
        # a step (lr * g, lr * weight_decay * w, ...) past float32's range: the kernels' float32 and the
        # oracle's float64 overflow at different places (lr 3.4e38: ref 5.2e37 where cpu gives inf):
        # every kind must answer, not agree
        return BEYOND_FLOAT32
    return None  # valid: ref, cpu and the fused module must agree (the update's arithmetic is the op tier's)


# -- checkpoints ------------------------------------------------------------------------------------------------
_CKPT_KINDS = [None, "rowwise_adagrad", "adam", "adagrad", "lars_sgd"]


def _ckpt_module(seed):
    import embnum
    from embnum.modules import EmbeddingBagCollection, EmbeddingBagConfig

    kind = _CKPT_KINDS[seed % len(_CKPT_KINDS)]
    tables = [
        EmbeddingBagConfig(4, 2, "t0", feature_names=["a"]),
        EmbeddingBagConfig(3, 3, "t1", feature_names=["b"]),  # shares t0's call and step
        EmbeddingBagConfig(2, 2, "t2", feature_names=["c"], pooling="mean"),
    ]
    opt = None if kind is None else embnum.TBEOptimizer(kind, 0.1)
    return EmbeddingBagCollection(tables, optimizer=opt, seed=seed)


def ckpt_base(seed):
    return shifted_state(_ckpt_module(seed).state_dict(), seed)


def shifted_state(state, seed):
    """A checkpoint's entries as NumPy arrays, moved by the seed to a new state inside every domain,
    plus the ``seed`` (the base of the checkpoint surfaces)."""
    rng = np.random.default_rng(seed)
    args = {}
    for k, v in state.items():
        a = v.detach().numpy().copy()
        if a.dtype.kind == "f":
            a = (a + rng.uniform(0, 1, a.shape)).astype(a.dtype)  # a new state, inside every domain
        else:
            a = np.asarray(a + 3)  # a 0-d step stays an array (a + 3 alone is a NumPy scalar)
        args[k] = a
    args["seed"] = seed
    return args


_CKPT_FEATURES = dict(
    keys=["a", "b", "c"],
    values=np.array([0, 3, 2, 1, 0, 1, 1], np.int64),
    lengths=np.array([2, 0, 1, 2, 1, 1], np.int64),
)


def ckpt_call(args, kind):
    import embnum

    if kind != "torch":
        raise NotExpressible("the modules take tensors")
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _ckpt_module(seed)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    sd = {k: on(kind, v) for k, v in args.items() if k != "seed"}
    try:
        m.load_state_dict(sd, assign=bool(seed % 2))
    except BaseException:
        after = m.state_dict()
        import torch

        if any(not torch.equal(before[k], after[k]) for k in before):
            raise AssertionError("a rejected checkpoint changed the module") from None
        raise
    f = embnum.KeyedJaggedTensor(
        _CKPT_FEATURES["keys"],
        tensor(_CKPT_FEATURES["values"].copy()),
        lengths=tensor(_CKPT_FEATURES["lengths"].copy()),
    )
    return host({"state": dict(m.state_dict()), "pooled": m(f).values()})


def ckpt_model(args):
    seed = args["seed"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None  # the harness's own switch, mutated
    m = _ckpt_module(seed)
    kind = _CKPT_KINDS[seed % len(_CKPT_KINDS)]
    own = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    loaded, steps = {}, {}
    for k, like in own.items():
        x = args[k]
        if isinstance(x, np.ndarray) and not plain(x):
            return None
        if not plain(x):
            return INVALID
        name = k.rsplit(".", 1)[1]
        shape = () if like.ndim == 0 and x.shape == (1,) else x.shape
        if shape != like.shape:
            return INVALID
        if name == "step":
            if x.dtype.kind not in "iu":
                return INVALID
            v = int(x.reshape(-1)[0])
            if not 0 <= v <= 2**62:
                return INVALID
            steps[k.split(".")[1]] = v
            loaded[k] = np.array(v, np.int64)
            continue
        if x.dtype.kind != "f":
            return INVALID
        with np.errstate(all="ignore"):
            y = x.astype(np.float32).reshape(like.shape)
        if not np.all(np.isfinite(y)):
            return INVALID
        squares = name == "momentum2" or (name == "momentum1" and kind in ("adagrad", "rowwise_adagrad"))
        if squares and np.any(y < 0):
            return INVALID
        loaded[k] = y
    if "t0" in steps and steps.get("t0") != steps.get("t1"):
        return INVALID
    w = {t: loaded[f"embedding_bags.{t}.weight"].astype(np.float64) for t in ("t0", "t1", "t2")}
    o = np.concatenate([[0], np.cumsum(_CKPT_FEATURES["lengths"])])
    cols = []
    for i, (f, t) in enumerate(zip("abc", ("t0", "t1", "t2"))):
        col = np.zeros((2, w[t].shape[1]))
        for b in range(2):
            ids = _CKPT_FEATURES["values"][o[2 * i + b] : o[2 * i + b + 1]]
            if ids.shape[0]:
                col[b] = w[t][ids].sum(0) / (ids.shape[0] if t == "t2" else 1)
        cols.append(col)
    return ("ok", {"state": loaded, "pooled": np.concatenate(cols, axis=1)})
