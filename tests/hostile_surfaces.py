"""The hostile tier beyond the ops: the containers, ``KeyedTensor.regroup``, the torch modules,
``TBEOptimizer`` and checkpoints (``load_state_dict``).

A *surface* is a public entry point with a small valid input (``base(seed)``, a flat dict of
NumPy arrays, ints, lists and strings that :func:`hostile.mutations` can mutate), a call on
each *kind* of array (``numpy-ref``, ``numpy-cpu``: NumPy arrays and that backend;
``torch``: tensors), and a *model*: plain Python, independent of embnum, that says what the
mutated input must give: :data:`INVALID` (a clean error on every kind), ``("ok", result)``
(that result on every kind that answers) or ``None`` (the model has no verdict: the kinds
must agree). A call that returns for an input the model calls invalid, or returns another
result, is a *wrong* result. :func:`judge` runs in ``hostile_worker.py`` (a crash is a failed
case, not a dead run).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from hypothesis import strategies as st

import hostile

INVALID = "invalid"
KINDS = ("numpy-ref", "numpy-cpu", "torch")
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)
HOSTILE_FLOATS = (
    "1e39",
    "-1e39",
    "3.5e38",
    "3.4e38",
    "1e-50",
    "-1e-50",
    "1 - 1e-11",
    "1 - 1e-7",
    "-0.0",
    "0.0",
    "-1.0",
    "nan",
    "float('inf')",
    "-float('inf')",
    "10**400",
    "np.float64(1e39)",
    "np.float32(0.5)",
    "np.float16(2)",
)


class NotExpressible(Exception):
    """The input has no form on this kind (an object array as a tensor)."""


# -- kinds -----------------------------------------------------------------------------------
def tensor(a):
    import torch

    if type(a) is not np.ndarray:
        raise NotExpressible(f"torch has no {type(a).__name__}")
    if not a.flags.writeable:
        raise NotExpressible("torch tensors have no read-only flag")
    if a.dtype == np.uint64:
        return torch.from_numpy(a.view(np.int64).copy()).view(torch.uint64)
    try:
        return torch.from_numpy(a)
    except (TypeError, ValueError, RuntimeError) as e:
        raise NotExpressible(f"torch.from_numpy: {e}") from None


def on(kind, a):
    """``a`` as the kind's array (NumPy arrays stay; others are left alone)."""
    if kind == "torch" and isinstance(a, np.ndarray):
        return tensor(a)
    return a


def backend_of(kind):
    return {"numpy-ref": "ref", "numpy-cpu": "cpu", "torch": None}[kind]


def host(x):
    """Results as NumPy/Python, recursively (tensors detached and copied)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.uint64:
            return x.view(torch.int64).numpy().view(np.uint64).copy()
        return x.numpy().copy()
    if isinstance(x, np.ndarray):
        return np.array(x)
    if isinstance(x, dict):
        return {k: host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [host(v) for v in x]
    return x


def same(a, b, tol=0.0) -> bool:
    """Equal structure, dtypes and values (NaN equal to NaN; floats within ``tol`` relative)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y, tol) for x, y in zip(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if tol:
            return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
        if a.dtype != b.dtype:
            return False
        return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return a == b


# -- the model's checks (plain Python ints: nothing wraps) ------------------------------------------
def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def index_array(a, ndim=1) -> bool:
    return type(a) is np.ndarray and a.ndim == ndim and a.dtype in (I32, I64)


def str_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(k, str) for k in x) and len(set(x)) == len(x)


def int_list(x):
    """``x`` as a list of Python ints (a list/tuple of ints, or an integer 1-D array), or None."""
    if type(x) is np.ndarray:
        return [int(v) for v in x.tolist()] if x.ndim == 1 and x.dtype.kind in "iu" else None
    if isinstance(x, (list, tuple)) and all(is_int(v) for v in x):
        return [int(v) for v in x]
    return None


def plain(a) -> bool:
    """A plain ndarray (subclasses such as np.matrix or masked arrays: no verdict)."""
    return type(a) is np.ndarray


# -- jagged containers ------------------------------------------------------------------------------
def _jagged_base(seed, *, offsets=False, keyed=True):
    rng = np.random.default_rng(seed)
    T, B = (2, int(rng.integers(1, 4))) if keyed else (1, int(rng.integers(1, 5)))
    ldt = (np.int32, np.int64)[seed % 2]
    lengths = rng.integers(0, 4, T * B).astype(ldt)
    n = int(lengths.sum())
    args = {}
    if keyed:
        args["keys"] = ["a", "b"]
    args["values"] = rng.integers(0, 50, n).astype(np.int64)
    args["weights"] = rng.standard_normal(n).astype(np.float32) if seed % 3 else None
    if offsets:
        args["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(ldt)
    else:
        args["lengths"] = lengths
    if keyed:
        args["stride"] = B if seed % 4 < 2 else None
    return args


def _jagged_model(args, keyed):
    """``(keys, stride, lengths, values, weights)`` checked, or INVALID / None."""
    values, weights = args["values"], args.get("weights")
    arrays = [values] + [args[k] for k in ("weights", "lengths", "offsets") if args.get(k) is not None]
    if any(isinstance(a, np.ndarray) and not plain(a) for a in arrays):
        return None
    if keyed and not str_list(args["keys"]):
        return INVALID
    if not plain(values) or values.dtype.kind not in "biufc" or values.ndim < 1 or (keyed and values.ndim != 1):
        return INVALID
    n = values.shape[0]
    if weights is not None and (not plain(weights) or weights.dtype.kind != "f" or weights.shape != (n,)):
        return INVALID
    if "offsets" in args:
        offs = args["offsets"]
        if not index_array(offs) or offs.shape[0] == 0:
            return INVALID
        o = [int(v) for v in offs.tolist()]
        if o[0] != 0 or o[-1] != n or any(b < a for a, b in zip(o, o[1:])):
            return INVALID
        lengths = np.diff(offs).astype(offs.dtype)
    else:
        lengths = args["lengths"]
        if not index_array(lengths):
            return INVALID
        ls = [int(v) for v in lengths.tolist()]
        if any(v < 0 for v in ls) or sum(ls) != n:
            return INVALID
    if not keyed:
        return None, None, lengths, values, weights
    keys, stride, n_bags = list(args["keys"]), args["stride"], lengths.shape[0]
    if stride is None:
        if (not keys and n_bags) or (keys and n_bags % len(keys)):
            return INVALID
        stride = n_bags // len(keys) if keys else 0
    elif not is_int(stride) or stride < 0 or stride * len(keys) != n_bags or (not keys and n_bags):
        return INVALID
    return keys, int(stride), lengths, values, weights


def _bags(lengths, values, weights):
    o = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    return o, [(values[a:b], None if weights is None else weights[a:b]) for a, b in zip(o[:-1], o[1:])]


def _kjt_expected(keys, stride, lengths, values, weights):
    o = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    out = {"keys": list(keys), "stride": stride, "lengths": lengths, "offsets": o.astype(lengths.dtype)}
    lpk = []
    for t, k in enumerate(keys):
        a, b = o[t * stride], o[(t + 1) * stride]
        lpk.append(int(b - a))
        out[k] = [values[a:b], lengths[t * stride : (t + 1) * stride], None if weights is None else weights[a:b]]
    out["length_per_key"] = lpk
    out["offset_per_key"] = [0] + list(np.cumsum(lpk).tolist()) if lpk else [0]
    return out


def _kjt_readout(k):
    out = {"keys": k.keys(), "stride": k.stride(), "lengths": k.lengths(), "offsets": k.offsets()}
    for key in k.keys():
        jt = k[key]
        out[key] = [jt.values(), jt.lengths(), jt.weights_or_none()]
    out["length_per_key"] = k.length_per_key()
    out["offset_per_key"] = k.offset_per_key()
    return host(out)


def _kjt(args, kind, how):
    import embnum

    a = {k: on(kind, v) for k, v in args.items()}
    be = backend_of(kind)
    if how == "lengths_sync":
        return embnum.KeyedJaggedTensor.from_lengths_sync(
            a["keys"], a["values"], a["lengths"], a["weights"], a["stride"], backend=be
        )
    if how == "offsets_sync":
        return embnum.KeyedJaggedTensor.from_offsets_sync(
            a["keys"], a["values"], a["offsets"], a["weights"], a["stride"], backend=be
        )
    return embnum.KeyedJaggedTensor(
        a["keys"], a["values"], a["weights"], a.get("lengths"), a.get("offsets"), a["stride"], backend=be
    )


def _constructor(how):
    offsets = how.startswith("offsets")

    def base(seed):
        return _jagged_base(seed, offsets=offsets)

    def call(args, kind):
        return _kjt_readout(_kjt(args, kind, how))

    def model(args):
        m = _jagged_model(args, True)
        return m if m in (INVALID, None) else ("ok", _kjt_expected(*m))

    return base, call, model


def _jt_base(seed):
    return _jagged_base(seed, keyed=False)


def _jt_call(args, kind):
    import embnum

    a = {k: on(kind, v) for k, v in args.items()}
    jt = embnum.JaggedTensor(a["values"], a["weights"], a["lengths"], backend=backend_of(kind))
    return host({"lengths": jt.lengths(), "offsets": jt.offsets(), "bags": jt.to_dense()})


def _jt_model(args):
    m = _jagged_model(args, False)
    if m in (INVALID, None):
        return m
    _, _, lengths, values, weights = m
    o, bags = _bags(lengths, values, weights)
    return ("ok", {"lengths": lengths, "offsets": o.astype(lengths.dtype), "bags": [b[0] for b in bags]})


# -- methods of one valid KJT (keys a, b, c; stride 2; weighted) ----------------------------------
_LENGTHS = np.array([1, 2, 0, 3, 2, 1], np.int64)
_VALUES = np.array([5, 17, 3, 40, 9, 0, 23, 11, 8], np.int64)
_WEIGHTS = np.linspace(0.5, 4.5, 9, dtype=np.float32)


def _fixed_kjt(kind, ids=np.int64):
    import embnum

    return embnum.KeyedJaggedTensor(
        ["a", "b", "c"],
        on(kind, _VALUES.astype(ids)),
        on(kind, _WEIGHTS.copy()),
        on(kind, _LENGTHS.copy()),
        backend=backend_of(kind),
    )


def _per_key(ids=np.int64):
    o = np.concatenate([[0], np.cumsum(_LENGTHS)])
    return [
        (_VALUES[o[2 * t] : o[2 * t + 2]].astype(ids), _LENGTHS[2 * t : 2 * t + 2], _WEIGHTS[o[2 * t] : o[2 * t + 2]])
        for t in range(3)
    ]


def _permute_base(seed):
    rng = np.random.default_rng(seed)
    idx = [int(i) for i in rng.integers(0, 3, int(rng.integers(1, 5)))]
    return {"indices": idx, "indices_tensor": np.array(idx, np.int64) if seed % 2 else None}


def _permute_call(args, kind):
    k = _fixed_kjt(kind)
    p = k.permute(on(kind, args["indices"]), on(kind, args["indices_tensor"]))
    return host({"keys": p.keys(), "values": p.values(), "lengths": p.lengths(), "weights": p.weights()})


def _permute_model(args):
    idx, it = int_list(args["indices"]), args["indices_tensor"]
    if isinstance(args["indices"], np.ndarray) and not plain(args["indices"]):
        return None
    if idx is None or any(not 0 <= i < 3 for i in idx):
        return INVALID
    if it is not None:
        if isinstance(it, np.ndarray) and not plain(it):
            return None
        if not index_array(it) or [int(v) for v in it.tolist()] != idx:
            return INVALID
    pk = _per_key()
    cat = lambda j, dt: np.concatenate([pk[i][j] for i in idx]).astype(dt) if idx else np.zeros(0, dt)  # noqa: E731
    keys = [["a", "b", "c"][i] for i in idx]
    return (
        "ok",
        {"keys": keys, "values": cat(0, np.int64), "lengths": cat(1, np.int64), "weights": cat(2, np.float32)},
    )


def _split_base(seed):
    return {"segments": [[3], [1, 2], [0, 3, 0], [2, 1]][seed % 4]}


def _split_call(args, kind):
    parts = _fixed_kjt(kind).split(on(kind, args["segments"]))
    return host(
        [{"keys": p.keys(), "values": p.values(), "lengths": p.lengths(), "weights": p.weights()} for p in parts]
    )


def _split_model(args):
    if isinstance(args["segments"], np.ndarray) and not plain(args["segments"]):
        return None
    seg = int_list(args["segments"])
    if seg is None or any(s < 0 for s in seg) or sum(seg) != 3:
        return INVALID
    pk, out, start = _per_key(), [], 0
    for s in seg:
        part = pk[start : start + s]
        cat = lambda j, dt: np.concatenate([p[j] for p in part]).astype(dt) if part else np.zeros(0, dt)  # noqa: E731
        keys = ["a", "b", "c"][start : start + s]
        out.append(
            {"keys": keys, "values": cat(0, np.int64), "lengths": cat(1, np.int64), "weights": cat(2, np.float32)}
        )
        start += s
    return ("ok", out)


def _index_select_base(seed):
    rng = np.random.default_rng(seed)
    return {"indices": rng.integers(0, 2, int(rng.integers(0, 4))).astype((np.int32, np.int64)[seed % 2])}


def _index_select_call(args, kind):
    r = _fixed_kjt(kind).index_select(on(kind, args["indices"]))
    return host(
        {"keys": r.keys(), "stride": r.stride(), "values": r.values(), "lengths": r.lengths(), "weights": r.weights()}
    )


def _index_select_model(args):
    idx = args["indices"]
    if isinstance(idx, np.ndarray) and not plain(idx):
        return None
    if not index_array(idx) or any(not 0 <= int(i) < 2 for i in idx.tolist()):
        return INVALID
    o = np.concatenate([[0], np.cumsum(_LENGTHS)])
    vals, lens, ws = [], [], []
    for t in range(3):
        for i in idx.tolist():
            b = 2 * t + int(i)
            vals.append(_VALUES[o[b] : o[b + 1]])
            ws.append(_WEIGHTS[o[b] : o[b + 1]])
            lens.append(_LENGTHS[b])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    return (
        "ok",
        {
            "keys": ["a", "b", "c"],
            "stride": idx.shape[0],
            "values": cat(vals, np.int64),
            "lengths": np.array(lens, np.int64),
            "weights": cat(ws, np.float32),
        },
    )


def _padded_base(seed):
    return {"desired_length": [0, 1, 3, 4][seed % 4]}


def _padded_call(args, kind):
    return host(_fixed_kjt(kind).to_padded_dense(args["desired_length"]))


def _padded_model(args):
    L = args["desired_length"]
    if L is None:
        L = int(_LENGTHS.max())
    elif not is_int(L) or L < 0:
        return INVALID
    if L > 2**20:
        return None  # a large allocation: a result or a clean out-of-memory error
    o = np.concatenate([[0], np.cumsum(_LENGTHS)])
    out = np.zeros((3, 2, int(L)), np.int64)
    for b in range(6):
        bag = _VALUES[o[b] : o[b + 1]][: int(L)]
        out[b // 2, b % 2, : bag.shape[0]] = bag
    return ("ok", out)


# -- bucketize ---------------------------------------------------------------------------------------
def _bucketize_base(seed):
    rng = np.random.default_rng(seed)
    return {
        "num_buckets": int(rng.integers(1, 4)),
        "block_sizes": rng.integers(1, 30, 3).astype(np.int64),
        "output_permute": bool(seed % 2),
        "bucketize_pos": bool(seed % 3 == 0),
        "keep_original_indices": False,
        "ids32": bool(seed % 4 >= 2),
    }


def _bucketize_call(args, kind):
    k = _fixed_kjt(kind, np.int32 if args["ids32"] is True else np.int64)
    bs = args["block_sizes"]
    buckets, unperm = k.bucketize(
        args["num_buckets"],
        on(kind, bs),
        output_permute=args["output_permute"],
        bucketize_pos=args["bucketize_pos"],
        keep_original_indices=args["keep_original_indices"],
    )
    return host({"buckets": [[b.values(), b.lengths(), b.weights_or_none()] for b in buckets], "unperm": unperm})


def _bucketize_model(args):
    R, bs = args["num_buckets"], args["block_sizes"]
    flags = [args[k] for k in ("output_permute", "bucketize_pos", "keep_original_indices")]
    if not isinstance(args["ids32"], bool):
        return None  # the harness's own switch, mutated
    if isinstance(bs, np.ndarray) and not plain(bs):
        return None
    if any(not isinstance(f, (bool, np.bool_)) for f in flags):
        return INVALID
    out_perm, pos, keep = (bool(f) for f in flags)
    if not is_int(R) or R < 1:
        return INVALID
    if R * 6 > 2**48:
        return INVALID
    if R > 2**16:
        return None  # a large output: a result or a clean out-of-memory error
    if type(bs) is np.ndarray and not index_array(bs):
        return INVALID
    sizes = int_list(bs)
    if sizes is None or len(sizes) != 3 or any(b < 0 for b in sizes):
        return INVALID
    ids = np.int32 if args["ids32"] else np.int64
    bits = 32 if args["ids32"] else 64
    imax = 2 ** (bits - 1) - 1
    if any(b * R > imax for b in sizes):
        return INVALID
    o = np.concatenate([[0], np.cumsum(_LENGTHS)])
    where = []  # (bucket, bag, local id, position, input index)
    for b in range(6):
        t = b // 2
        for p, i in enumerate(range(o[b], o[b + 1])):
            x = int(_VALUES[i]) % 2**bits
            if keep:
                r, local = (x // sizes[t], x) if x < sizes[t] * R else (x % R, x)
            elif x < sizes[t] * R:
                r, local = x // sizes[t], x % sizes[t]
            else:
                r, local = x % R, x // R
            where.append((r, b, local, p, i))
    order = sorted(range(len(where)), key=lambda j: (where[j][0], where[j][1], j))
    buckets = []
    for r in range(R):
        js = [j for j in order if where[j][0] == r]
        vals = np.array([where[j][2] for j in js], np.int64).astype(ids)
        lens = np.array([sum(1 for j in js if where[j][1] == b) for b in range(6)], np.int64)
        if pos:
            w = np.array([where[j][3] for j in js], np.int64).astype(ids)
        else:
            w = _WEIGHTS[[where[j][4] for j in js]].astype(np.float32)
        buckets.append([vals, lens, w])
    unperm = None
    if out_perm:
        unperm = np.empty(len(where), ids)
        for slot, j in enumerate(order):
            unperm[where[j][4]] = slot
    return ("ok", {"buckets": buckets, "unperm": unperm})


# -- JaggedTensor.from_dense_lengths -------------------------------------------------------------------
def _fdl_base(seed):
    rng = np.random.default_rng(seed)
    B, L = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    return {
        "values": rng.standard_normal((B, L)).astype(np.float32),
        "lengths": rng.integers(0, L + 1, B).astype((np.int32, np.int64)[seed % 2]),
    }


def _fdl_call(args, kind):
    import embnum

    jt = embnum.JaggedTensor.from_dense_lengths(on(kind, args["values"]), on(kind, args["lengths"]))
    return host({"lengths": jt.lengths(), "bags": jt.to_dense()})


def _fdl_model(args):
    v, l = args["values"], args["lengths"]
    if any(isinstance(a, np.ndarray) and not plain(a) for a in (v, l)):
        return None
    if not plain(v) or v.ndim < 2 or v.dtype.kind not in "biufc" or not index_array(l) or l.shape[0] != v.shape[0]:
        return INVALID
    ls = [int(x) for x in l.tolist()]
    if any(not 0 <= x <= v.shape[1] for x in ls):
        return INVALID
    return ("ok", {"lengths": l, "bags": [v[b, :x] for b, x in enumerate(ls)]})


# -- KeyedTensor.regroup --------------------------------------------------------------------------------
def _regroup_base(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    dt = (np.float32, np.float64)[seed % 2]
    return {
        "keys0": ["a", "b"],
        "lengths0": [int(x) for x in rng.integers(0, 4, 2)],
        "keys1": ["c"],
        "lengths1": [int(rng.integers(1, 4))],
        "groups": [["c", "a"], ["b"], ["a", "a"]][: int(rng.integers(1, 4))],
        "B": B,
        "dtype": str(np.dtype(dt)),
    }


def _regroup_arrays(args):
    """The KTs' values, built from the (possibly mutated) lengths when they are plain ints."""
    out = []
    for i in (0, 1):
        ls = int_list(args[f"lengths{i}"])
        width = sum(ls) if ls is not None and all(0 <= x <= 64 for x in ls) else 3
        B = args["B"] if is_int(args["B"]) and 0 <= args["B"] <= 8 else 2
        dt = args["dtype"] if args["dtype"] in ("float32", "float64", "float16") else "float32"
        out.append((np.arange(B * width, dtype=np.float64).reshape(B, width) + 100 * i).astype(dt))
    return out


def _regroup_call(args, kind):
    import embnum

    v = _regroup_arrays(args)
    kts = [
        embnum.KeyedTensor(args[f"keys{i}"], on(kind, args[f"lengths{i}"]), on(kind, v[i]), backend=backend_of(kind))
        for i in (0, 1)
    ]
    return host(embnum.KeyedTensor.regroup(kts, args["groups"]))


def _regroup_model(args):
    if not all(str_list(args[f"keys{i}"]) for i in (0, 1)):
        return INVALID
    lens = [int_list(args[f"lengths{i}"]) for i in (0, 1)]
    if any(isinstance(args[f"lengths{i}"], np.ndarray) for i in (0, 1)):
        return None
    if any(ls is None or any(x < 0 for x in ls) for ls in lens):
        return INVALID
    if any(len(ls) != len(args[f"keys{i}"]) for i, ls in enumerate(lens)):
        return INVALID
    if any(x > 64 for ls in lens for x in ls) or set(args["keys0"]) & set(args["keys1"]):
        return None
    groups = args["groups"]
    if not isinstance(groups, (list, tuple)) or not all(
        isinstance(g, (list, tuple)) and all(isinstance(k, str) for k in g) for g in groups
    ):
        return INVALID
    v = _regroup_arrays(args)
    cols = {}
    for i in (0, 1):
        start = 0
        for k, n in zip(args[f"keys{i}"], lens[i]):
            cols[k] = v[i][:, start : start + n]
            start += n
    if any(k not in cols for g in groups for k in g):
        return INVALID
    B = v[0].shape[0]
    return ("ok", [np.concatenate([cols[k] for k in g], axis=1) if g else np.zeros((B, 0), v[0].dtype) for g in groups])


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


def _ebc_base(seed):
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


def _ebc_call(args, kind):
    import torch

    if kind != "torch":
        raise NotExpressible("the modules take tensors")
    ebc = _ebc(args["weights"] is not None)
    for p in ebc.parameters():
        p.grad = None
    kt = ebc(_kjt(args, kind, "init"))
    out = kt.values()
    out.sum().backward()
    grads = [ebc.embedding_bags[t].weight.grad for t in ("t0", "t1")]
    return host({"pooled": out, "grads": [torch.zeros(0) if g is None else g for g in grads]})


def _ebc_model(args):
    m = _jagged_model(args, True)
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


def _tbe_base(seed):
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


def _tbe_call(fused):
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


def _tbe_model(fused):
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


def _opt_base(seed):
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


def _opt_call(args, kind):
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


def _opt_model(args):
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


def _ckpt_base(seed):
    m = _ckpt_module(seed)
    rng = np.random.default_rng(seed)
    args = {}
    for k, v in m.state_dict().items():
        a = v.detach().numpy().copy()
        if a.dtype.kind == "f":
            a = (a + rng.uniform(0, 1, a.shape)).astype(a.dtype)  # a new state, inside every domain
        else:
            a = a + 3
        args[k] = a
    args["seed"] = seed
    return args


_CKPT_FEATURES = dict(
    keys=["a", "b", "c"],
    values=np.array([0, 3, 2, 1, 0, 1, 1], np.int64),
    lengths=np.array([2, 0, 1, 2, 1, 1], np.int64),
)


def _ckpt_call(args, kind):
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


def _ckpt_model(args):
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


def _float_mutations(args):
    """A hostile float in one float entry of an array, or as a float parameter."""
    arrays = [
        t for t, a in hostile.leaves(args).items() if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size
    ]
    scalars = [
        t
        for t, a in hostile.leaves(args).items()
        if t[1] is None and (a is None or (isinstance(a, float) and not isinstance(a, bool)))
    ]
    options = []
    if arrays:
        options.append(
            st.tuples(st.just("fentry"), st.sampled_from(arrays), st.floats(0, 1), st.sampled_from(HOSTILE_FLOATS))
        )
    if scalars:
        options.append(st.tuples(st.just("float"), st.sampled_from(scalars), st.sampled_from(HOSTILE_FLOATS)))
    return st.one_of(options) if options else None


def apply(args, mutation):
    """:func:`hostile.apply`, plus the float mutations of this tier."""
    if mutation[0] == "float":
        args = dict(args)
        args[mutation[1][0]] = hostile.scalar(mutation[2])
        return hostile.apply(args, ("none", None))
    if mutation[0] == "fentry":
        args = hostile.apply(args, ("none", None))
        a = hostile._get(args, mutation[1])
        b = a.copy()
        try:
            with np.errstate(all="ignore"):
                b.reshape(-1)[min(int(mutation[2] * b.size), b.size - 1)] = hostile.scalar(mutation[3])
        except OverflowError:
            raise hostile.NotApplicable("no float of this dtype holds it") from None
        hostile._set(args, mutation[1], b)
        return args
    return hostile.apply(args, mutation)


def mutations(args):
    """The ops tier's mutations, and (where the input has floats) the float ones."""
    fm = _float_mutations(args)
    return hostile.mutations(args) if fm is None else st.one_of(hostile.mutations(args), fm)


# -- the table ---------------------------------------------------------------------------------------------------
SURFACES = {
    "KeyedJaggedTensor(lengths=)": (*_constructor("lengths"), KINDS),
    "KeyedJaggedTensor(offsets=)": (*_constructor("offsets"), KINDS),
    "KeyedJaggedTensor.from_lengths_sync": (*_constructor("lengths_sync"), KINDS),
    "KeyedJaggedTensor.from_offsets_sync": (*_constructor("offsets_sync"), KINDS),
    "JaggedTensor": (_jt_base, _jt_call, _jt_model, KINDS),
    "JaggedTensor.from_dense_lengths": (_fdl_base, _fdl_call, _fdl_model, KINDS),
    "KeyedJaggedTensor.permute": (_permute_base, _permute_call, _permute_model, KINDS),
    "KeyedJaggedTensor.split": (_split_base, _split_call, _split_model, KINDS),
    "KeyedJaggedTensor.index_select": (_index_select_base, _index_select_call, _index_select_model, KINDS),
    "KeyedJaggedTensor.to_padded_dense": (_padded_base, _padded_call, _padded_model, KINDS),
    "KeyedJaggedTensor.bucketize": (_bucketize_base, _bucketize_call, _bucketize_model, KINDS),
    "KeyedTensor.regroup": (_regroup_base, _regroup_call, _regroup_model, KINDS),
    "EmbeddingBagCollection": (_ebc_base, _ebc_call, _ebc_model, ("torch",)),
    "TBE": (_tbe_base, _tbe_call(False), _tbe_model(False), ("torch",)),
    "FusedTBE": (_tbe_base, _tbe_call(True), _tbe_model(True), ("torch",)),
    "TBEOptimizer": (_opt_base, _opt_call, _opt_model, KINDS),
    "EmbeddingBagCollection.load_state_dict": (_ckpt_base, _ckpt_call, _ckpt_model, ("torch",)),
}
TOLERANCE = {
    "TBE": 1e-6,
    "FusedTBE": 1e-6,
    "EmbeddingBagCollection": 1e-5,
    "EmbeddingBagCollection.load_state_dict": 1e-5,
    "TBEOptimizer": 1e-5,
}


def _update_agrees(got, want):
    """The op tier's comparison of ``tbe_backward_update`` results (weights, then each state)."""
    import embnum

    if got.keys() != want.keys():
        return False
    check = embnum.get_op("tbe_backward_update").check_fn
    return bool(check([got[k] for k in got], [want[k] for k in got], None)[1])


COMPARE = {"TBEOptimizer": _update_agrees}
PARAMS = {  # words an error may name besides the input's keys
    "EmbeddingBagCollection": ["features", "indices", "offsets", "per_sample_weights", "weights", "lengths"],
    "TBE": ["indices", "offsets", "per_sample_weights"],
    "FusedTBE": ["indices", "offsets", "per_sample_weights"],
    "KeyedJaggedTensor.bucketize": ["block_sizes", "num_buckets", "my_size", "indices"],
    "JaggedTensor.from_dense_lengths": ["values", "lengths"],
    "KeyedTensor.regroup": ["keys", "length_per_key", "values", "groups", "lengths", "pooled_embs"],
    "KeyedJaggedTensor.to_padded_dense": ["desired_length", "max_lengths"],
    "KeyedJaggedTensor.split": ["segments"],
    "KeyedJaggedTensor.index_select": ["indices"],
    "KeyedJaggedTensor.permute": ["indices", "indices_tensor"],
    "EmbeddingBagCollection.load_state_dict": ["state_dict"],
}


def judge(case) -> dict:
    """The verdict on ``(surface name, seed, mutation, kinds)`` (see the module docstring)."""
    import traceback
    import warnings

    name, seed, mutation, kinds = case
    base_fn, call, model, _ = SURFACES[name]
    base = base_fn(seed)
    try:
        mutated = apply(base, mutation)
    except hostile.NotApplicable as e:
        return dict(outcomes={}, problems=[], na=str(e), named_target=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expect = model(mutated)
    params = list(base) + PARAMS.get(name, [])
    target = mutation[1][0] if len(mutation) > 1 and mutation[1] else None
    outcomes, results, problems, named = {}, {}, [], True
    for kind in kinds:
        args = apply(base, mutation)
        before = hostile.snapshot(args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[kind] = call(args, kind)
            outcomes[kind] = ("ok",)
        except NotExpressible as e:
            outcomes[kind] = ("na", str(e))
            continue
        except BaseException as e:  # noqa: BLE001 - every exception is judged
            msg = str(e)
            outcomes[kind] = ("error", type(e).__name__, msg[:400])
            if not isinstance(e, hostile.CLEAN):
                tb = "".join(traceback.format_exception(e)[-3:])
                problems.append(f"{kind}: unclean {type(e).__name__}: {msg[:300]}\n{tb[-800:]}")
            elif type(e).__name__ == "AllocationError":
                outcomes[kind] = ("error", "AllocationError", msg[:400])
            elif not hostile.names_an_argument(msg, params):
                problems.append(f"{kind}: {type(e).__name__} names no argument: {msg[:300]}")
            named &= target is not None and target in msg
        moved = hostile.changed(before, args)
        if moved:
            problems.append(f"{kind}: changed inputs {moved} ({outcomes[kind][0]})")
    answered = {k: o for k, o in outcomes.items() if o[0] != "na"}
    tol = TOLERANCE.get(name, 0.0)
    wrong = False
    if expect == INVALID:
        for k, o in answered.items():
            if o[0] == "ok":
                problems.append(f"WRONG {k}: returned a result for an input the model rejects")
                wrong = True
    elif expect is not None:
        for k, o in answered.items():
            if o[0] == "ok" and not same(results[k], expect[1], tol):
                problems.append(
                    f"WRONG {k}: result differs from the model's\n got {results[k]!r:.600}\n want {expect[1]!r:.600}"
                )
                wrong = True
            elif o[0] == "error" and o[1] != "AllocationError":
                problems.append(f"{k}: {o[1]} for an input the model accepts: {o[2][:200]}")
    agree = COMPARE.get(name, lambda a, b: same(a, b, tol))
    kinds_ok = [k for k, o in answered.items() if o[0] == "ok"]
    if len({o[0] for o in answered.values()}) > 1 and expect is None:
        problems.append(f"the kinds disagree: {answered}")
    for k in kinds_ok[1:]:
        if not agree(results[k], results[kinds_ok[0]]):
            problems.append(f"WRONG {k} and {kinds_ok[0]} give different results")
            wrong = True
    return dict(
        outcomes=outcomes, problems=problems, na=None, named_target=named, wrong=wrong, model=expect is not None
    )
