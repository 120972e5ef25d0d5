"""The TorchRec-shaped containers (embnum.JaggedTensor, KeyedJaggedTensor, KeyedTensor).

Every method on drawn KJTs (fixed and variable batch per key, no keys, empty bags,
weighted or not) against a plain-Python model (tests/container_model.py), on each
kind of array a container holds: NumPy (cpu backend), NumPy through the cuda backend
(Numba's simulator; ``backend="cuda"`` is passed to every op), CuPy (marked ``gpu``) and
torch tensors; gradients and torch.compile on torch; bad input; and (optional tier,
marker ``torchrec``) the same methods against torchrec's own classes.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import container_model as M
import embnum
from embnum._backend import cuda_simulated, gpu_present

KJT, KT, JT = embnum.KeyedJaggedTensor, embnum.KeyedTensor, embnum.JaggedTensor


# -- kinds of arrays ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    backend: str | None
    share: float  # of the profile's examples (the simulator is slow)

    def skip_reason(self):
        if self.name == "cuda-sim" and not cuda_simulated():
            return "the CUDA simulator is off (a GPU is present: see the gpu kind)"
        if self.name == "gpu":
            if not gpu_present():
                return "no GPU on this machine"
            try:
                import cupy  # noqa: F401
            except ImportError:
                return "CuPy is not installed"
        if self.name == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                return "torch is not installed"
        return None

    def arr(self, a):
        if a is None:
            return None
        if self.name == "torch":
            import torch

            return torch.from_numpy(np.array(a))
        if self.name == "gpu":
            import cupy

            return cupy.asarray(a)
        return a

    @property
    def small(self):
        return self.name == "cuda-sim"

    def settings(self):
        n = max(3, int(settings.default.max_examples * self.share))
        return settings(max_examples=n, suppress_health_check=[HealthCheck.function_scoped_fixture])


def host(a):
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return a.get()


KINDS = [
    Kind("numpy", None, 1.0),
    Kind("cuda-sim", "cuda", float(os.environ.get("EMBNUM_SIM_SHARE", "0.3"))),
    Kind("gpu", "cuda", 1.0),
    Kind("torch", None, 1.0),
]


@pytest.fixture(params=[pytest.param(k, id=k.name, marks=(pytest.mark.gpu,) if k.name == "gpu" else ()) for k in KINDS])
def kind(request):
    reason = request.param.skip_reason()
    if reason:
        pytest.skip(reason)
    return request.param


def build(m: M.Model, kind: Kind, how="lengths"):
    """The container of model ``m`` on ``kind``, built with lengths or offsets."""
    lengths = m.lengths()
    args = dict(
        keys=list(m.keys),
        values=kind.arr(m.values()),
        weights=kind.arr(m.weights()),
        stride_per_key_per_rank=m.spkpr if m.variable else None,
        stride=None if m.variable else m.fixed_stride(),
        backend=kind.backend,
    )
    if how == "offsets":
        return KJT.from_offsets_sync(offsets=kind.arr(np.concatenate([[0], np.cumsum(lengths)]).astype(m.ldt)), **args)
    return KJT(lengths=kind.arr(lengths), **args)


def same(got, want, what):
    got = host(got)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape and got.tobytes() == want.tobytes(), f"{what}: {got} != {want}"


def check_kjt(k, m: M.Model, kind: Kind):
    assert isinstance(k, KJT) and k.keys() == m.keys
    same(k.lengths(), m.lengths(), "lengths")
    same(k.values(), m.values(), "values")
    if m.wbags is None:
        assert k.weights_or_none() is None
    else:
        same(k.weights(), m.weights(), "weights")
    same(k.offsets(), np.concatenate([[0], np.cumsum(m.lengths())]).astype(m.ldt), "offsets")
    assert k.stride_per_key() == m.strides
    assert k.variable_stride_per_key() == m.variable
    if not m.variable:
        assert k.stride() == m.fixed_stride()
    else:
        assert k.stride_per_key_per_rank() == m.spkpr
    assert k.length_per_key() == m.length_per_key()
    assert k.offset_per_key() == np.concatenate([[0], np.cumsum(m.length_per_key(), dtype=np.int64)]).tolist()
    assert k.backend == kind.backend


def check_jt(jt, bags, wbags, m: M.Model):
    same(jt.lengths(), np.array([len(b) for b in bags], m.ldt), "jt lengths")
    same(jt.values(), M._cat(bags, m.vdt), "jt values")
    same(jt.offsets(), np.concatenate([[0], np.cumsum([len(b) for b in bags])]).astype(m.ldt), "jt offsets")
    if wbags is None:
        assert jt.weights_or_none() is None
    else:
        same(jt.weights(), M._cat(wbags, m.wdt), "jt weights")


def run(kind, strategy, body):
    @kind.settings()
    @given(data=st.data())
    def inner(data):
        body(data.draw(strategy(small=kind.small)), data)

    inner()


# -- properties ------------------------------------------------------------------------------
def test_construction_and_accessors(kind):
    def body(m, data):
        check_kjt(build(m, kind), m, kind)
        check_kjt(build(m, kind, "offsets"), m, kind)
        k = KJT.from_lengths_sync(
            m.keys,
            kind.arr(m.values()),
            kind.arr(m.lengths()),
            kind.arr(m.weights()),
            stride=None if m.variable else m.fixed_stride(),
            stride_per_key_per_rank=m.spkpr,
            backend=kind.backend,
        )
        assert k.length_per_key_or_none() == m.length_per_key()
        lop = np.concatenate([[0], np.cumsum(m.strides, dtype=np.int64)]).tolist()
        assert k.lengths_offset_per_key() == lop
        assert k.index_per_key() == {key: i for i, key in enumerate(m.keys)}

    run(kind, M.models, body)


def test_permute(kind):
    def body(m, data):
        T = len(m.keys)
        idx = data.draw(st.lists(st.integers(0, T - 1), max_size=2 * T + 1)) if T else []
        k = build(m, kind)
        if data.draw(st.booleans()):
            k = k.unsync()  # no cached length_per_key: the result computes it itself
        check_kjt(k.permute(idx), M.permute(m, idx), kind)

    run(kind, M.models, body)


def test_split_getitem_to_dict(kind):
    def body(m, data):
        T = len(m.keys)
        cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=3)))
        segments = np.diff([0, *cuts, T]).tolist()
        k = build(m, kind)
        parts = k.split(segments)
        start = 0
        for seg, part in zip(segments, parts):
            check_kjt(part, M.key_range(m, start, start + seg), kind)
            start += seg
        check_kjt(KJT.concat(parts), m, kind) if parts else None
        d = k.to_dict()
        assert list(d) == m.keys
        for t, key in enumerate(m.keys):
            check_jt(k[key], m.bags[t], None if m.wbags is None else m.wbags[t], m)
            check_jt(d[key], m.bags[t], None if m.wbags is None else m.wbags[t], m)
        if T:
            back = KJT.from_jt_dict(d)
            assert back.keys() == m.keys and back.stride_per_key() == m.strides
            same(back.values(), m.values(), "from_jt_dict values")
            same(back.lengths(), m.lengths(), "from_jt_dict lengths")

    run(kind, M.models, body)


def test_index_select_and_padded(kind):
    def body(m, data):
        B = m.fixed_stride()
        rows = data.draw(st.lists(st.integers(0, B - 1), max_size=5)) if B else []
        k = build(m, kind)
        check_kjt(k.index_select(kind.arr(np.array(rows, dtype=m.vdt))), M.index_select(m, rows), kind)
        L = data.draw(st.integers(0, 4))
        dense = k.to_padded_dense(L, padding_value=7)
        want = np.stack([M.padded(kb, L, 7, m.vdt) for kb in m.bags]) if m.keys else np.zeros((0, B, L), m.vdt)
        same(dense, want.reshape(len(m.keys), B, L), "to_padded_dense")
        for t, key in enumerate(m.keys):
            jt = k[key]
            same(jt.to_padded_dense(L, 7), M.padded(m.bags[t], L, 7, m.vdt), "jt.to_padded_dense")
            longest = max((len(b) for b in m.bags[t]), default=0)
            same(jt.to_padded_dense(), M.padded(m.bags[t], longest, 0, m.vdt), "jt.to_padded_dense()")
            if m.wbags is not None:
                same(jt.to_padded_dense_weights(L), M.padded(m.wbags[t], L, 0, m.wdt), "to_padded_dense_weights")
            assert [host(x).tolist() for x in jt.to_dense()] == [b.tolist() for b in m.bags[t]]

    run(kind, lambda small: M.models(small=small, variable=False), body)


def test_bucketize(kind):
    def body(m, data):
        T = len(m.keys)
        R = data.draw(st.integers(1, 4))
        bs = [data.draw(st.integers(1, 20)) for _ in range(T)]
        keep, pos, out_perm = (data.draw(st.booleans()) for _ in range(3))
        mode = data.draw(st.sampled_from(["blocks", "total_num_blocks", "row_pos"]))
        G = [R * data.draw(st.integers(1, 3)) for _ in range(T)] if mode == "total_num_blocks" else None
        bounds = None
        if mode == "row_pos":
            bounds = [[0, *sorted(data.draw(st.lists(st.integers(0, 60), min_size=R, max_size=R)))] for _ in range(T)]
        buckets, perm = build(m, kind).bucketize(
            R,
            bs,
            G,
            output_permute=out_perm,
            bucketize_pos=pos,
            block_bucketize_row_pos=None if bounds is None else [kind.arr(np.array(b, m.vdt)) for b in bounds],
            keep_original_indices=keep,
        )
        want, want_perm = M.bucketize(m, R, bs, keep, pos, G, bounds)
        assert len(buckets) == R
        for b, w in zip(buckets, want):
            check_kjt(b, w, kind)
        if out_perm:
            same(perm, want_perm, "unbucketize_permute")
        else:
            assert perm is None

    run(kind, M.models, body)


def test_empty():
    k = KJT.empty(is_weighted=True)
    assert k.keys() == [] and k.stride() == 0 and k.values().shape == (0,) and k.weights().shape == (0,)
    assert k.length_per_key() == [] and k.offsets().tolist() == [0]
    like = KJT.empty_like(KJT(["a"], np.arange(3), lengths=np.array([3], np.int32)))
    assert like.keys() == [] and like.lengths().dtype == np.int32 and like.values().dtype == np.arange(3).dtype
    assert JT.empty().lengths().shape == (0,)


# -- JaggedTensor and KeyedTensor ---------------------------------------------------------------
def test_jagged_tensor_dense_forms(kind):
    def body(m, data):
        bags = [b.astype(np.float64) for kb in m.bags for b in kb]
        assume(bags)
        jt = JT.from_dense([kind.arr(b) for b in bags], backend=kind.backend)
        assert [host(x).tolist() for x in jt.to_dense()] == [b.tolist() for b in bags]
        L = max(len(b) for b in bags) + data.draw(st.integers(0, 2))
        padded = M.padded(bags, L, 0, np.float64)
        lengths = np.array([len(b) for b in bags], m.ldt)
        back = JT.from_dense_lengths(kind.arr(padded), kind.arr(lengths), backend=kind.backend)
        same(back.values(), M._cat(bags, np.float64), "from_dense_lengths")
        same(back.to_padded_dense(L), padded, "to_padded_dense")

    run(kind, M.models, body)


@st.composite
def keyed_tensors(draw, small=False):
    names = iter(draw(st.permutations([f"k{i}" for i in range(9)])))
    B = draw(st.integers(0, 4))
    kts = []
    for _ in range(draw(st.integers(1, 3))):
        widths = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        keys = [next(names) for _ in widths]
        kts.append((keys, widths, np.random.default_rng(len(kts)).standard_normal((B, sum(widths)))))
    all_keys = [k for ks, _, _ in kts for k in ks]
    groups = draw(st.lists(st.lists(st.sampled_from(all_keys), max_size=4), min_size=1, max_size=3))
    return kts, groups


def test_keyed_tensor(kind):
    def body(case, data):
        kts, groups = case
        objs = []
        cols = {}
        for keys, widths, values in kts:
            splits = np.split(values, np.cumsum(widths)[:-1], axis=1)
            kt = KT.from_tensor_list(keys, [kind.arr(s) for s in splits], backend=kind.backend)
            assert kt.length_per_key() == widths and kt.keys() == keys and kt.key_dim() == 1
            assert kt.offset_per_key() == np.concatenate([[0], np.cumsum(widths)]).tolist()
            same(kt.values(), values, "from_tensor_list values")
            for key, s in zip(keys, splits):
                same(kt[key], s, "kt[key]")
                same(kt.to_dict()[key], s, "kt.to_dict()")
                cols[key] = s
            objs.append(kt)
        B = kts[0][2].shape[0]
        out = KT.regroup(objs, groups)
        assert len(out) == len(groups)
        for g, o in zip(groups, out):
            same(o, np.concatenate([cols[k] for k in g], axis=1) if g else np.zeros((B, 0)), "regroup")
        names = [f"g{j}" for j in range(len(groups))]
        as_dict = KT.regroup_as_dict(objs, groups, names)
        for name, o in zip(names, out):
            same(as_dict[name], host(o), "regroup_as_dict")

    run(kind, keyed_tensors, body)


# -- torch: gradients and torch.compile --------------------------------------------------------
def _torch_kjt(torch, m: M.Model, dtype=None):
    """``m``'s KJT on torch with float64 values ``0..N-1`` and weights ``0.5..N-0.5`` that need gradients
    (each output element then names its source)."""
    N = int(m.lengths().sum())
    v = torch.arange(N, dtype=torch.float64, requires_grad=True)
    w = (torch.arange(N, dtype=torch.float64) + 0.5).requires_grad_()
    k = KJT(
        m.keys,
        v,
        w,
        torch.from_numpy(m.lengths()),
        stride=None if m.variable else m.fixed_stride(),
        stride_per_key_per_rank=m.spkpr if m.variable else None,
    )
    return k, v, w


def _check_grad(torch, out, src_of, leaf, rng):
    """d(sum(out * c))/d(leaf) is the scatter-add of c to the sources of out's elements."""
    c = torch.from_numpy(rng.standard_normal(out.shape[0]))
    (g,) = torch.autograd.grad((out * c).sum(), leaf, allow_unused=True, retain_graph=True)
    g = torch.zeros_like(leaf) if g is None else g
    src = np.asarray(src_of(out.detach().numpy()), dtype=np.int64)
    want = np.bincount(src, weights=c.numpy(), minlength=leaf.shape[0])
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, atol=0)


def test_torch_gradients_of_values_and_weights():
    torch = pytest.importorskip("torch")

    @settings(max_examples=max(3, settings.default.max_examples // 2))
    @given(m=M.models(weighted=True), data=st.data())
    def inner(m, data):
        rng = np.random.default_rng(0)
        k, v, w = _torch_kjt(torch, m)
        T = len(m.keys)
        idx = data.draw(st.lists(st.integers(0, T - 1), max_size=2 * T + 1)) if T else []
        outs = [k.permute(idx)]
        if T:
            outs += k.split([T // 2, T - T // 2]) + [k[m.keys[-1]]]
        if not m.variable and m.fixed_stride():
            rows = data.draw(st.lists(st.integers(0, m.fixed_stride() - 1), max_size=4))
            outs.append(k.index_select(torch.tensor(rows, dtype=torch.int64)))
        for o in outs:
            _check_grad(torch, o.values(), lambda a: a, v, rng)
            _check_grad(torch, o.weights(), lambda a: a - 0.5, w, rng)
        # bucketize moves integer ids: only the weights have a gradient
        ids = KJT(
            m.keys, torch.from_numpy(m.values()), w, torch.from_numpy(m.lengths()), stride_per_key_per_rank=m.spkpr
        )
        buckets, _ = ids.bucketize(3, [7] * T)
        for b in buckets:
            _check_grad(torch, b.weights(), lambda a: a - 0.5, w, rng)

    inner()


def test_torch_compile_fullgraph():
    """permute, split, [key] (fixed and variable batch), index_select, bucketize and KT.regroup trace
    without graph breaks (no host reads while tracing) and give the eager results and gradients."""
    torch = pytest.importorskip("torch")

    def f(values, weights, lengths, pooled):
        k = KJT(["a", "b", "c"], values, weights, lengths)
        p = k.permute([2, 0, 0])
        s = k.split([1, 2])
        b, _ = k.bucketize(2, [4, 4, 4])
        sel = k.index_select(torch.tensor([2, 0]))
        kt = KT.from_tensor_list(["x", "y"], [pooled[:, :1], pooled[:, 1:]])
        (g,) = KT.regroup([kt], [["y", "x", "y"]])
        vbe = KJT(["a", "b"], values[:6], weights[:6], lengths[:5], stride_per_key_per_rank=[[1, 1], [2, 1]])
        vp, vs = vbe.permute([1, 0, 1]), vbe.split([1, 1])[1]
        parts = [p.weights(), s[1].weights(), k["b"].weights(), b[1].weights(), sel.weights(), g.reshape(-1)]
        parts += [vp.weights(), vs.weights(), vbe["a"].weights()]
        lengths_out = torch.cat([p.lengths(), vp.lengths()])
        return torch.cat([x * (i + 1) for i, x in enumerate(parts)]), lengths_out, b[0].values()

    lengths = torch.tensor([1, 2, 0, 2, 1, 0, 3, 0, 0], dtype=torch.int32)
    values = torch.arange(9)
    results = []
    for fn in (f, torch.compile(f, fullgraph=True, dynamic=False)):
        w = torch.linspace(0, 1, 9, dtype=torch.float64, requires_grad=True)
        pooled = torch.randn(2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
        out, pl, bv = fn(values, w, lengths, pooled)
        out.sum().backward()
        results.append([out.detach(), pl, bv, w.grad, pooled.grad])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- bad input -----------------------------------------------------------------------------------
_I = lambda *x: np.array(x, dtype=np.int64)  # noqa: E731
_BAD = [
    (dict(keys=["a", "a"], values=_I(0, 1), lengths=_I(1, 1)), ValueError, ("keys", "'a'")),
    (dict(keys="ab", values=_I(0), lengths=_I(1)), TypeError, ("keys",)),
    (dict(keys=["a"], values=_I(0, 1), lengths=_I(1, 2)), ValueError, ("lengths sums to 3", "len(values) = 2")),
    (dict(keys=["a"], values=_I(0), lengths=_I(2, -1)), ValueError, ("lengths", "-1")),
    (dict(keys=["a", "b"], values=_I(0, 1, 2), lengths=_I(1, 2, 0)), ValueError, ("len(lengths) = 3", "len(keys) = 2")),
    (dict(keys=["a", "b"], values=_I(0, 1, 2), lengths=_I(1, 2), stride=2), ValueError, ("stride = 2",)),
    (
        dict(keys=["a", "b"], values=_I(0, 1, 2), lengths=_I(1, 2), stride_per_key_per_rank=[[1], [2]]),
        ValueError,
        ("stride_per_key_per_rank sums to 3", "2 entries"),
    ),
    (
        dict(keys=["a", "b"], values=_I(0), lengths=_I(1), stride_per_key_per_rank=[[1]]),
        ValueError,
        ("stride_per_key_per_rank", "one list per key"),
    ),
    (dict(keys=[], values=_I(0), lengths=_I(1)), ValueError, ("keys is empty",)),
    (dict(keys=["a"], values=_I(0, 1), offsets=_I(1, 2)), ValueError, ("offsets[0]",)),
    (dict(keys=["a"], values=_I(0, 1), offsets=_I(0, 2, 1, 2)), ValueError, ("non-decreasing", "offsets[2]")),
    (dict(keys=["a"], values=_I(0, 1), offsets=_I(0, 1)), ValueError, ("offsets[-1] = 1", "len(values) = 2")),
    (dict(keys=["a"], values=_I(0, 1), lengths=_I(2, 0), offsets=_I(0, 1, 2)), ValueError, ("disagree", "bag 0")),
    (dict(keys=["a"], values=_I(0, 1), lengths=_I(2), weights=np.ones(3)), ValueError, ("len(weights) = 3",)),
    (dict(keys=["a"], values=_I(0, 1), lengths=_I(2), weights=_I(1, 1)), TypeError, ("weights", "float")),
    (dict(keys=["a"], values=np.zeros((2, 1)), lengths=_I(2)), ValueError, ("values", "1-D")),
    (dict(keys=["a"], values=_I(0, 1), lengths=np.array([2.0])), TypeError, ("lengths", "integer")),
    (dict(keys=["a"], values=_I(0, 1)), ValueError, ("lengths or offsets",)),
]


@pytest.mark.parametrize("array_kind", ["numpy", "torch"])
@pytest.mark.parametrize("case", range(len(_BAD)))
def test_kjt_rejects_bad_input(case, array_kind):
    kwargs, exc, words = _BAD[case]
    if array_kind == "torch":
        torch = pytest.importorskip("torch")
        kwargs = {k: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for k, a in kwargs.items()}
    before = {k: host(a).copy() for k, a in kwargs.items() if hasattr(a, "shape")}
    with pytest.raises(exc) as info:
        KJT(**kwargs)
    for w in words:
        assert w in str(info.value), f"{info.value!r} does not name {w!r}"
    for k, a in before.items():
        assert host(kwargs[k]).tobytes() == a.tobytes()


def test_mixed_kinds_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="lengths is a torch array but values is a numpy array"):
        KJT(["a"], _I(0, 1), lengths=torch.tensor([2]))


def test_methods_reject_bad_arguments():
    k = KJT(["a", "b"], _I(0, 1, 2), lengths=_I(1, 2, 0, 0))
    with pytest.raises(IndexError, match=r"indices\[1\] = 2 is out of range for 2 keys"):
        k.permute([0, 2])
    with pytest.raises(ValueError, match="segments sum to 1 but there are 2 keys"):
        k.split([1])
    with pytest.raises(KeyError, match="'z'"):
        k["z"]
    with pytest.raises(ValueError, match="block_sizes must have one entry per key"):
        k.bucketize(2, [4])
    with pytest.raises(IndexError, match="out of range"):
        k.index_select(_I(0, 2))
    vbe = KJT(["a", "b"], _I(0, 1, 2), lengths=_I(1, 2, 0), stride_per_key_per_rank=[[2], [1]])
    with pytest.raises(ValueError, match="fixed batch size"):
        vbe.index_select(_I(0))
    with pytest.raises(ValueError, match="fixed batch size"):
        vbe.to_padded_dense(2)
    with pytest.raises(ValueError, match="keys of kjt_list"):
        KJT.concat([k, k])


def test_keyed_tensor_rejects_bad_input():
    with pytest.raises(ValueError, match="keys must be distinct"):
        KT(["a", "a"], [1, 1], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="one entry per key"):
        KT(["a", "b"], [2], np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"length_per_key sums to 3 but values.shape\[1\] = 2"):
        KT(["a", "b"], [1, 2], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="groups and keys"):
        KT.regroup_as_dict([KT(["a"], [2], np.zeros((2, 2)))], [["a"]], ["x", "y"])
    with pytest.raises(ValueError, match="is not a key of any input"):
        KT.regroup([KT(["a"], [2], np.zeros((2, 2)))], [["b"]])


# -- differential tier: torchrec's own containers ------------------------------------------------
def _torchrec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("fbgemm_gpu")
    trj = pytest.importorskip("torchrec.sparse.jagged_tensor")
    return torch, trj


def _theirs(trj, m, kjt):
    return trj.KeyedJaggedTensor(
        keys=list(m.keys),
        values=kjt.values(),
        weights=kjt.weights_or_none(),
        lengths=kjt.lengths(),
        stride=None if m.variable else m.fixed_stride(),
        stride_per_key_per_rank=m.spkpr if m.variable else None,
    )


def _same_kjt(ours, theirs):
    assert ours.keys() == theirs.keys()
    if not ours.keys():
        # torchrec's split makes a keyless part with int32 lengths and empty offsets; embnum keeps the
        # lengths dtype and its offsets are [0] (a complete cumsum)
        assert ours.values().shape == theirs.values().shape == (0,) and ours.lengths().shape == (0,)
        return
    for name in ("values", "lengths", "weights_or_none", "offsets"):
        a, b = getattr(ours, name)(), getattr(theirs, name)()
        if a is None or b is None:
            assert a is None and b is None, name
            continue
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), f"{name}: {a} != {b}"
    for name in ("stride_per_key", "length_per_key", "offset_per_key", "variable_stride_per_key"):
        assert getattr(ours, name)() == getattr(theirs, name)(), name
    if not ours.variable_stride_per_key():
        assert ours.stride() == theirs.stride()


@pytest.mark.torchrec
def test_kjt_against_torchrec():
    torch, trj = _torchrec()
    from torchrec.distributed.embedding_sharding import bucketize_kjt_before_all2all

    torch_kind = Kind("torch", None, 1.0)

    @settings(max_examples=max(3, settings.default.max_examples // 2))
    @given(m=M.models(max_keys=4), data=st.data())
    def inner(m, data):
        T = len(m.keys)
        assume(T > 0)  # torchrec derives the stride of a KJT without keys differently (always 0)
        ours = build(m, torch_kind)
        theirs = _theirs(trj, m, ours)
        _same_kjt(ours, theirs)
        assert ours.lengths_offset_per_key() == theirs.lengths_offset_per_key()
        idx = data.draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=2 * T))
        _same_kjt(ours.permute(idx), theirs.permute(idx))
        cut = data.draw(st.integers(0, T))
        for a, b in zip(ours.split([cut, T - cut]), theirs.split([cut, T - cut])):
            _same_kjt(a, b)
        for key in m.keys:
            a, b = ours[key], theirs[key]
            for name in ("values", "lengths", "weights_or_none"):
                x, y = getattr(a, name)(), getattr(b, name)()
                assert (x is None and y is None) or x.tolist() == y.tolist(), (key, name)
        _same_kjt(KJT.concat(ours.split([cut, T - cut])), trj.KeyedJaggedTensor.concat(theirs.split([cut, T - cut])))
        # conversions share the tensors
        back = embnum.from_torchrec(ours.to_torchrec())
        _same_kjt(back, theirs)
        assert back.values() is ours.values()
        # row-wise bucketize: torchrec's KJT holds the buckets end to end (bucket-major lengths)
        R = data.draw(st.integers(1, 4))
        bs = torch.tensor([data.draw(st.integers(1, 20)) for _ in range(T)], dtype=ours.values().dtype)
        buckets, perm = ours.bucketize(R, bs, output_permute=True)
        whole, their_perm = bucketize_kjt_before_all2all(theirs, R, bs, output_permute=True)
        assert torch.equal(perm, their_perm)
        assert torch.equal(torch.cat([b.lengths() for b in buckets]), whole.lengths().view(-1))
        assert torch.equal(torch.cat([b.values() for b in buckets]), whole.values())
        if m.wbags is not None:
            assert torch.equal(torch.cat([b.weights() for b in buckets]), whole.weights())

    inner()


@pytest.mark.torchrec
def test_kt_against_torchrec():
    torch, trj = _torchrec()

    @settings(max_examples=max(3, settings.default.max_examples // 2))
    @given(case=keyed_tensors())
    def inner(case):
        kts, groups = case
        assume(all(groups))  # torchrec's regroup fails on an empty group (torch.cat of no tensors)
        ours, theirs = [], []
        for keys, widths, values in kts:
            t = torch.from_numpy(values)
            ours.append(KT(keys, widths, t))
            theirs.append(trj.KeyedTensor(keys, widths, t))
            assert ours[-1].offset_per_key() == theirs[-1].offset_per_key()
            for key in keys:
                assert torch.equal(ours[-1][key], theirs[-1][key])
        for a, b in zip(KT.regroup(ours, groups), trj.KeyedTensor.regroup(theirs, groups)):
            assert torch.equal(a, b)
        back = embnum.from_torchrec(ours[0].to_torchrec())
        assert back.keys() == ours[0].keys() and back.values() is ours[0].values()

    inner()


@pytest.mark.torchrec
def test_jt_against_torchrec():
    """A JaggedTensor on NumPy arrays goes to torchrec through DLPack (no copy) and comes back
    holding torchrec's tensors; anything else is refused by name."""
    torch, trj = _torchrec()

    @given(
        lengths=st.lists(st.integers(0, 4), max_size=6),
        weighted=st.booleans(),
        dtype=st.sampled_from([np.int32, np.int64]),
    )
    def inner(lengths, weighted, dtype):
        n = sum(lengths)
        values = np.arange(n, dtype=np.float32) * 1.5
        weights = np.arange(n, dtype=np.float32) + 0.25 if weighted else None
        ours = JT(values, weights, lengths=np.array(lengths, dtype=dtype))
        theirs = ours.to_torchrec()
        assert isinstance(theirs, trj.JaggedTensor)
        assert theirs.values().data_ptr() == values.ctypes.data or n == 0
        assert theirs.lengths().tolist() == lengths and theirs.values().tolist() == values.tolist()
        assert (theirs.weights_or_none() is None) == (weights is None)
        back = embnum.from_torchrec(theirs)
        assert isinstance(back, JT) and back.values() is theirs.values() and back.lengths() is theirs.lengths()
        assert JT.from_torchrec(theirs).values() is theirs.values()

    inner()
    with pytest.raises(TypeError, match="from_torchrec takes a torchrec .* got ndarray"):
        embnum.from_torchrec(np.zeros(3))
    with pytest.raises(TypeError, match="expected a torchrec KeyedTensor, got JaggedTensor"):
        KT.from_torchrec(trj.JaggedTensor(values=torch.zeros(2), lengths=torch.tensor([2])))
