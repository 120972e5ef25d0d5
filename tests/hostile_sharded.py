"""Surfaces of the sharded collection (``embnum.distributed.ShardedEmbeddingBagCollection``) for the hostile
tier (``hostile_surfaces.py``), on a one-process gloo group in the worker: its forward (a KJT of keys
``a``, ``b``, ``c`` over a table-wise and a row-wise table) and its ``load_state_dict`` (whole tensors;
``assign`` by the seed). The model pools the module's own tables in plain Python."""

from __future__ import annotations

import numpy as np

from hostile_containers import build_kjt, jagged_model
from hostile_models import I32, I64, INVALID, NotExpressible, host, is_int, on, plain, tensor
from hostile_modules import _CKPT_FEATURES, ebc_base, shifted_state

_MODULES: dict = {}
_KINDS = ("rowwise_adagrad", "adam", "sgd", "adagrad")


def _group():
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _module(kind, weighted=False, fresh=False):
    import embnum
    from embnum.distributed import ROW_WISE, TABLE_WISE, ParameterSharding, ShardedEmbeddingBagCollection
    from embnum.modules import EmbeddingBagConfig

    key = (kind, weighted)
    if fresh or key not in _MODULES:
        _group()
        tables = [
            EmbeddingBagConfig(5, 3, "t0", feature_names=["a", "b"]),
            EmbeddingBagConfig(4, 2, "t1", feature_names=["c"], pooling="sum" if weighted else "mean"),
        ]
        plan = {"t0": ParameterSharding(TABLE_WISE, (0,)), "t1": ParameterSharding(ROW_WISE, None)}
        m = ShardedEmbeddingBagCollection(
            tables, plan, optimizer=embnum.TBEOptimizer(kind, 0.1), is_weighted=weighted, seed=3
        )
        if fresh:
            return m
        _MODULES[key] = m
    return _MODULES[key]


_ROWS = {"a": 5, "b": 5, "c": 4}


def forward_call(args, kind):
    if kind != "torch":
        raise NotExpressible("the sharded collection takes tensors")
    m = _module("sgd", args["weights"] is not None)
    return host({"pooled": m(build_kjt(args, kind, "init")).values()})


def forward_model(args):
    m = jagged_model(args, True)
    if m in (INVALID, None):
        return m
    keys, stride, lengths, values, weights = m
    if any(k not in keys for k in "abc") or values.dtype not in (I32, I64):
        return INVALID
    weighted = args["weights"] is not None
    sd = _module("sgd", weighted).state_dict()
    w = {t: sd[f"embedding_bags.{t}.weight"].double().numpy() for t in ("t0", "t1")}
    o = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    cols = []
    for f in "abc":
        t, mean = ("t1", not weighted) if f == "c" else ("t0", False)
        i = keys.index(f)
        col = np.zeros((stride, w[t].shape[1]))
        for b in range(stride):
            ids = [int(x) for x in values[o[i * stride + b] : o[i * stride + b + 1]].tolist()]
            if any(not 0 <= x < _ROWS[f] for x in ids):
                return INVALID
            a = o[i * stride + b]
            psw = [1.0] * len(ids) if weights is None else [float(x) for x in weights[a : a + len(ids)].tolist()]
            for x, s in zip(ids, psw):
                col[b] += w[t][x] * s
            if mean and ids:
                col[b] /= len(ids)
        cols.append(col)
    return ("ok", {"pooled": np.concatenate(cols, axis=1)})


def ckpt_base(seed):
    """The checkpoint's entries, shifted by the seed. It also runs in the pytest process (the cases are
    drawn there): a group it had to create is destroyed again, so that nothing else in that process
    (the README's own ``init_process_group``) meets it."""
    import torch.distributed as dist

    own = not dist.is_initialized()
    try:
        state = _module(_KINDS[seed % len(_KINDS)], fresh=own).state_dict()
    finally:
        if own:
            dist.destroy_process_group()
    return shifted_state(state, seed)


_INPUT = _CKPT_FEATURES  # the unsharded collection's checkpoint batch (keys a, b, c)


def ckpt_call(args, kind):
    import torch

    import embnum

    if kind != "torch":
        raise NotExpressible("the sharded collection takes tensors")
    seed = args["seed"] if is_int(args["seed"]) and 0 <= args["seed"] < 50 else 0
    m = _module(_KINDS[seed % len(_KINDS)], fresh=True)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    try:
        m.load_state_dict({k: on(kind, v) for k, v in args.items() if k != "seed"}, assign=bool(seed % 2))
    except BaseException:
        if any(not torch.equal(before[k], v) for k, v in m.state_dict().items()):
            raise AssertionError("a rejected checkpoint changed the module") from None
        raise
    f = embnum.KeyedJaggedTensor(
        _INPUT["keys"], tensor(_INPUT["values"].copy()), lengths=tensor(_INPUT["lengths"].copy())
    )
    return host({"state": dict(m.state_dict()), "pooled": m(f).values()})


def ckpt_model(args):
    seed = args["seed"]
    if not is_int(seed) or not 0 <= seed < 50:
        return None
    kind = _KINDS[seed % len(_KINDS)]
    own = {k: v.numpy() for k, v in _module(kind).state_dict().items()}
    loaded, steps = {}, []
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
            if x.dtype.kind not in "iu" or not 0 <= int(x.reshape(-1)[0]) <= 2**62:
                return INVALID
            steps.append(int(x.reshape(-1)[0]))
            continue
        if x.dtype.kind != "f":
            return INVALID
        with np.errstate(all="ignore"):
            y = x.astype(np.float32).reshape(like.shape)
        squares = name == "momentum2" or (name == "momentum1" and kind in ("adagrad", "rowwise_adagrad"))
        if not np.all(np.isfinite(y)) or (squares and np.any(y < 0)):
            return INVALID
        loaded[k] = y
    for k in own:
        if k.endswith(".step"):
            loaded[k] = np.array(max(steps), np.int64)  # one step for every shard
    w = {t: loaded[f"embedding_bags.{t}.weight"].astype(np.float64) for t in ("t0", "t1")}
    o = np.concatenate([[0], np.cumsum(_INPUT["lengths"])])
    cols = []
    for i, (f, t) in enumerate(zip("abc", ("t0", "t0", "t1"))):
        col = np.zeros((2, w[t].shape[1]))
        for b in range(2):
            ids = _INPUT["values"][o[2 * i + b] : o[2 * i + b + 1]]
            if ids.shape[0]:
                col[b] = w[t][ids].sum(0) / (ids.shape[0] if t == "t1" else 1)
        cols.append(col)
    return ("ok", {"state": loaded, "pooled": np.concatenate(cols, axis=1)})


forward_base = ebc_base
