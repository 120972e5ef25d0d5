"""Surfaces of the containers for the hostile tier (``hostile_surfaces.py``): the
KeyedJaggedTensor constructors and methods, JaggedTensor, KeyedTensor.regroup. Each surface is
``base(seed)`` (a valid input), ``call(args, kind)`` and ``model(args)`` (plain Python: INVALID,
``("ok", result)`` or None for no verdict)."""

from __future__ import annotations

import numpy as np

from hostile_models import INVALID, NotExpressible, backend_of, host, index_array, int_list, is_int, on, plain, str_list  # noqa: F401,E501


# -- jagged containers ------------------------------------------------------------------------------
def jagged_base(seed, *, offsets=False, keyed=True):
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


def jagged_model(args, keyed):
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


def build_kjt(args, kind, how):
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


def constructor(how):
    offsets = how.startswith("offsets")

    def base(seed):
        return jagged_base(seed, offsets=offsets)

    def call(args, kind):
        return _kjt_readout(build_kjt(args, kind, how))

    def model(args):
        m = jagged_model(args, True)
        return m if m in (INVALID, None) else ("ok", _kjt_expected(*m))

    return base, call, model


def jt_base(seed):
    return jagged_base(seed, keyed=False)


def jt_call(args, kind):
    import embnum

    a = {k: on(kind, v) for k, v in args.items()}
    jt = embnum.JaggedTensor(a["values"], a["weights"], a["lengths"], backend=backend_of(kind))
    return host({"lengths": jt.lengths(), "offsets": jt.offsets(), "bags": jt.to_dense()})


def jt_model(args):
    m = jagged_model(args, False)
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


def permute_base(seed):
    rng = np.random.default_rng(seed)
    idx = [int(i) for i in rng.integers(0, 3, int(rng.integers(1, 5)))]
    return {"indices": idx, "indices_tensor": np.array(idx, np.int64) if seed % 2 else None}


def permute_call(args, kind):
    k = _fixed_kjt(kind)
    p = k.permute(on(kind, args["indices"]), on(kind, args["indices_tensor"]))
    return host({"keys": p.keys(), "values": p.values(), "lengths": p.lengths(), "weights": p.weights()})


def permute_model(args):
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


def split_base(seed):
    return {"segments": [[3], [1, 2], [0, 3, 0], [2, 1]][seed % 4]}


def split_call(args, kind):
    parts = _fixed_kjt(kind).split(on(kind, args["segments"]))
    return host(
        [{"keys": p.keys(), "values": p.values(), "lengths": p.lengths(), "weights": p.weights()} for p in parts]
    )


def split_model(args):
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


def index_select_base(seed):
    rng = np.random.default_rng(seed)
    return {"indices": rng.integers(0, 2, int(rng.integers(0, 4))).astype((np.int32, np.int64)[seed % 2])}


def index_select_call(args, kind):
    r = _fixed_kjt(kind).index_select(on(kind, args["indices"]))
    return host(
        {"keys": r.keys(), "stride": r.stride(), "values": r.values(), "lengths": r.lengths(), "weights": r.weights()}
    )


def index_select_model(args):
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


def padded_base(seed):
    return {"desired_length": [0, 1, 3, 4][seed % 4]}


def padded_call(args, kind):
    return host(_fixed_kjt(kind).to_padded_dense(args["desired_length"]))


def padded_model(args):
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
def bucketize_base(seed):
    rng = np.random.default_rng(seed)
    return {
        "num_buckets": int(rng.integers(1, 4)),
        "block_sizes": rng.integers(1, 30, 3).astype(np.int64),
        "output_permute": bool(seed % 2),
        "bucketize_pos": bool(seed % 3 == 0),
        "keep_original_indices": False,
        "ids32": bool(seed % 4 >= 2),
    }


def bucketize_call(args, kind):
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


def bucketize_model(args):
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
def fdl_base(seed):
    rng = np.random.default_rng(seed)
    B, L = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    return {
        "values": rng.standard_normal((B, L)).astype(np.float32),
        "lengths": rng.integers(0, L + 1, B).astype((np.int32, np.int64)[seed % 2]),
    }


def fdl_call(args, kind):
    import embnum

    jt = embnum.JaggedTensor.from_dense_lengths(on(kind, args["values"]), on(kind, args["lengths"]))
    return host({"lengths": jt.lengths(), "bags": jt.to_dense()})


def fdl_model(args):
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
def regroup_base(seed):
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


def regroup_call(args, kind):
    import embnum

    v = _regroup_arrays(args)
    kts = [
        embnum.KeyedTensor(args[f"keys{i}"], on(kind, args[f"lengths{i}"]), on(kind, v[i]), backend=backend_of(kind))
        for i in (0, 1)
    ]
    return host(embnum.KeyedTensor.regroup(kts, args["groups"]))


def regroup_model(args):
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
