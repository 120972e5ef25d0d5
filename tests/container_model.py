"""A plain-Python model of a KeyedJaggedTensor (a list of bags per key) and the expected result
of each container method on it, for tests/test_containers.py. Nothing here calls embnum."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st


@dataclasses.dataclass
class Model:
    """``bags[t][b]``: the ids of key ``t``'s bag ``b``; ``wbags`` the same shape of weights (or None)."""

    keys: list
    bags: list
    wbags: list | None
    variable: bool  # built with stride_per_key_per_rank
    spkpr: list | None  # per key, per rank (variable batch)
    ldt: np.dtype
    vdt: np.dtype
    wdt: np.dtype | None
    stride: int | None = None  # fixed batch: the stride (needed when there are no keys)

    @property
    def strides(self):
        return [len(kb) for kb in self.bags]

    def fixed_stride(self):
        return self.stride if self.stride is not None else (len(self.bags[0]) if self.bags else 0)

    def lengths(self):
        return np.array([len(b) for kb in self.bags for b in kb], dtype=self.ldt)

    def values(self):
        return _cat([b for kb in self.bags for b in kb], self.vdt)

    def weights(self):
        if self.wbags is None:
            return None
        return _cat([w for kw in self.wbags for w in kw], self.wdt)

    def length_per_key(self):
        return [sum(len(b) for b in kb) for kb in self.bags]

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


def _cat(parts, dtype):
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


@st.composite
def models(draw, *, small=False, variable=None, weighted=None, max_keys=None):
    T = draw(st.integers(0, max_keys or (3 if small else 5)))
    names = draw(st.permutations([f"f{i}" for i in range(8)]))[:T]
    variable = draw(st.booleans()) if variable is None else variable
    if variable:
        R = draw(st.integers(1, 2))
        spkpr = [[draw(st.integers(0, 3)) for _ in range(R)] for _ in range(T)]
        strides, stride = [sum(r) for r in spkpr], None
    else:
        B = draw(st.integers(0, 4 if small else 6))
        spkpr, strides, stride = None, [B] * T, B
    ldt = np.dtype(draw(st.sampled_from([np.int32, np.int64])))
    vdt = np.dtype(draw(st.sampled_from([np.int32, np.int64])))
    weighted = draw(st.booleans()) if weighted is None else weighted
    wdt = np.dtype(draw(st.sampled_from([np.float32, np.float64]))) if weighted else None
    max_len = draw(st.sampled_from([0, 1, 3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bags = [[rng.integers(0, 50, rng.integers(0, max_len + 1)).astype(vdt) for _ in range(s)] for s in strides]
    wbags = [[rng.standard_normal(len(b)).astype(wdt) for b in kb] for kb in bags] if weighted else None
    return Model(list(names), bags, wbags, variable, spkpr, ldt, vdt, wdt, stride)


# -- expected results ------------------------------------------------------------------
def permute(m: Model, idx):
    return m.replace(
        keys=[m.keys[i] for i in idx],
        bags=[m.bags[i] for i in idx],
        wbags=None if m.wbags is None else [m.wbags[i] for i in idx],
        spkpr=None if m.spkpr is None else [m.spkpr[i] for i in idx],
    )


def key_range(m: Model, a, b):
    return m.replace(
        keys=m.keys[a:b],
        bags=m.bags[a:b],
        wbags=None if m.wbags is None else m.wbags[a:b],
        spkpr=None if m.spkpr is None else m.spkpr[a:b],
    )


def index_select(m: Model, rows):
    pick = lambda kb: [kb[r] for r in rows]  # noqa: E731
    return m.replace(
        bags=[pick(kb) for kb in m.bags],
        wbags=None if m.wbags is None else [pick(kw) for kw in m.wbags],
        stride=len(rows),
    )


def padded(bags, L, pad, dtype):
    out = np.full((len(bags), L), pad, dtype=dtype)
    for b, x in enumerate(bags):
        out[b, : min(L, len(x))] = x[:L]
    return out


def bucket_of(x, bs, R, keep, G=None, bounds=None):
    """fbgemm's block bucketize rule for one non-negative id (spec kjt.md 3.2, ``bs > 0``):
    ``(bucket, local id)``; ``G`` total blocks (default ``R``), ``bounds`` explicit bucket boundaries."""
    G = R if G is None else G
    Lb = G // R
    if bounds is not None:
        j = sum(1 for p in bounds if p <= x) - 1
        r, local = (j, x - bounds[j]) if j < R else (x % R, x // R)
    elif x < bs * G:
        r, local = x // (bs * Lb), x % (bs * Lb)
    else:
        r, local = (x % G) // Lb, x // G
    return int(r), int(x if keep else local)


def bucketize(m: Model, R, block_sizes, keep, pos, total_blocks=None, bounds=None):
    """``(per-bucket models, unbucketize_permute)``."""
    out = [[[[] for _ in kb] for kb in m.bags] for _ in range(R)]
    wout = [[[[] for _ in kb] for kb in m.bags] for _ in range(R)]
    where = []  # (bucket, key, bag, slot) per input id, input order
    for t, kb in enumerate(m.bags):
        for b, bag in enumerate(kb):
            for j, x in enumerate(bag.tolist()):
                G = None if total_blocks is None else total_blocks[t]
                r, local = bucket_of(x, block_sizes[t], R, keep, G, None if bounds is None else bounds[t])
                where.append((r, t, b, len(out[r][t][b])))
                out[r][t][b].append(local)
                wout[r][t][b].append(j if pos else (None if m.wbags is None else m.wbags[t][b][j]))
    # position of each (bucket, key, bag, slot) in the buckets' values laid end to end
    start, base = {}, 0
    for r in range(R):
        for t, kb in enumerate(out[r]):
            for b, bag in enumerate(kb):
                start[(r, t, b)] = base
                base += len(bag)
    perm = np.array([start[(r, t, b)] + s for r, t, b, s in where], dtype=m.vdt)
    wdt = m.vdt if pos else m.wdt
    models = [
        m.replace(
            bags=[[np.array(bag, m.vdt) for bag in kb] for kb in out[r]],
            wbags=None if (m.wbags is None and not pos) else [[np.array(w, wdt) for w in kw] for kw in wout[r]],
            wdt=wdt,
        )
        for r in range(R)
    ]
    return models, perm
