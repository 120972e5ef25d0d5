"""The TBE training step reads nothing back from the device (bounds modes "none" and "warning").

On a GPU the reads that would stop the host are: the layout buffers copied back by every TBE op
(``FusedTBE.cuda()`` keeps them on the device), the step counter read as a Python int before every
update, and the bounds checks. Here, without a GPU:

* the step counter: the module's training step runs with every torch-level read counted (``int()``,
  ``float()``, ``bool()``, ``.item()``, ``.tolist()`` of any tensor): none after the first step, for
  an optimizer that needs the step (Adam) and one that does not;
* the layout: :func:`embnum.ops.tbe.trust_device_layout` on array objects that stand for device
  arrays (a NumPy subclass: the ops treat any array that is not exactly ``np.ndarray`` as data to
  copy back), with every ``to_host`` counted: three copies before, none once trusted;
* the bounds checks read nothing on CuPy arrays in these modes (``embnum._tbe_bounds``); the
  GPU tests below count every read of a whole ``FusedTBE`` step on CUDA tensors, and capture one in
  a CUDA graph (which fails on any synchronisation).
"""

import numpy as np
import pytest

import embnum
from embnum import _validate

torch = pytest.importorskip("torch")


class _Device(np.ndarray):
    """A NumPy array the TBE ops treat as device data (not exactly ``np.ndarray``)."""


def _counting(monkeypatch):
    """A list that grows by one entry per torch-level read of a tensor while ``on[0]``."""
    reads, on = [], [False]
    for name in ("__int__", "__float__", "__bool__", "__index__", "item", "tolist"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            if on[0]:
                reads.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads, on


@pytest.mark.parametrize("kind", ["rowwise_adagrad", "adam"])
@pytest.mark.parametrize("mode", ["none", "warning"])
def test_the_training_step_reads_no_tensor_back(monkeypatch, kind, mode):
    from embnum.modules import FusedTBE

    reads, on = _counting(monkeypatch)
    opt = embnum.TBEOptimizer(kind, learning_rate=0.05)
    mod = FusedTBE([20, 30], [4, 8], optimizer=opt, bounds_check_mode=mode, backend="cpu")
    ref = FusedTBE([20, 30], [4, 8], optimizer=opt, bounds_check_mode=mode, backend="ref")
    rng = np.random.default_rng(0)
    for step in range(3):
        idx = torch.from_numpy(rng.integers(0, 20, 9))
        off = torch.tensor([0, 2, 3, 5, 6, 8, 9])
        g = torch.from_numpy(rng.standard_normal((3, 12)).astype(np.float32))
        ref(idx, off).backward(g)
        reads.clear()
        on[0] = True
        mod(idx, off).backward(g)
        on[0] = False
        assert reads == [], (step, reads)
    assert mod.step == 3 and int(mod.iter) == 3
    assert torch.allclose(mod.weights, ref.weights, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["EXACT_ROWWISE_ADAGRAD", "ADAM"])
def test_the_fbgemm_stand_in_training_step_reads_no_tensor_back(monkeypatch, optimizer):
    """The stand-in for fbgemm's training TBE (built directly: the import hook is not needed) keeps
    its ``iter`` on the device and the step on the host, as ``FusedTBE``; a step set through
    ``set_optimizer_step`` or a restored ``iter`` is read once."""
    from embnum.fbgemm_compat.configs import ComputeDevice, EmbeddingLocation, EmbOptimType
    from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen

    specs = [(20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU), (30, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    mod = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType[optimizer], learning_rate=0.05)
    reads, on = _counting(monkeypatch)
    rng = np.random.default_rng(1)
    for step in range(3):
        idx = torch.from_numpy(rng.integers(0, 20, 9))
        off = torch.tensor([0, 2, 3, 5, 6, 8, 9])
        g = torch.from_numpy(rng.standard_normal((3, 12)).astype(np.float32))
        reads.clear()
        on[0] = True
        mod(idx, off).backward(g)
        on[0] = False
        assert reads == [], (step, reads)
    assert int(mod.iter[0]) == 3
    mod.set_optimizer_step(10)
    mod(idx, off).backward(g)
    assert int(mod.iter[0]) == 11


@pytest.mark.parametrize("mode", ["none", "warning"])
def test_the_collection_training_step_reads_no_tensor_back(monkeypatch, mode):
    """The fused ``EmbeddingBagCollection``: its groups' ``FusedTBE`` steps read nothing. (Regrouping
    a KeyedJaggedTensor by key on a device still reads once per permute to validate it:
    ``tests/test_host_reads.py``; docs/gpu.md.)"""
    from collection_inputs import random_kjt, small_tables
    from embnum.modules import EmbeddingBagCollection

    tables = small_tables()
    ebc = EmbeddingBagCollection(tables, optimizer=embnum.TBEOptimizer("adam", learning_rate=0.05))
    for g in ebc._groups:
        g.bounds_check_mode = mode
    reads, on = _counting(monkeypatch)
    rng = np.random.default_rng(2)
    for step in range(3):
        kjt = random_kjt(rng, tables, 4)
        out = ebc(kjt).values()
        grad = torch.from_numpy(rng.standard_normal(tuple(out.shape)).astype(np.float32))
        reads.clear()
        on[0] = True
        ebc(kjt).values().backward(grad)
        on[0] = False
        assert reads == [], (step, reads)


def _counting_bridge_calls(monkeypatch):
    """A list that grows by the op's name at each call of an ``embnum.torch_bridge`` op (on a device
    each op checks its inputs with a read back; the collection's planned step calls none)."""
    from embnum.torch_bridge._call import BridgedOp

    calls = []
    real = BridgedOp.__call__

    def counted(self, *a, **k):
        calls.append(self.__name__)
        return real(self, *a, **k)

    monkeypatch.setattr(BridgedOp, "__call__", counted)
    return calls


@pytest.mark.parametrize("mode", ["none", "warning"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_collection_on_a_device_regroups_and_steps_reading_nothing(monkeypatch, mode, weighted):
    """The cuda backend (the simulator here): features in another key order than every TBE call's,
    with a key no table reads. A forward + backward + fused update reads no tensor back and calls
    no bridge op (a KJT permute or ``offsets()`` would: each checks its input with one read on a
    device): the regrouping and the offsets are torch operations on the device
    (``embnum.modules._regroup``), and every TBE call goes through its plans. The results are the
    cpu backend's, which regroups with the KJT's permute."""
    from collection_inputs import random_kjt, small_tables
    from embnum.modules import EmbeddingBagCollection

    tables = [t for t in small_tables() if t.pooling == "sum"] if weighted else small_tables()
    opt = embnum.TBEOptimizer("adam", learning_rate=0.05)
    ebc = EmbeddingBagCollection(tables, weighted, optimizer=opt, backend="cuda", bounds_check_mode=mode)
    ref = EmbeddingBagCollection(tables, weighted, optimizer=opt, backend="cpu", bounds_check_mode=mode)
    reads, on = _counting(monkeypatch)
    calls = _counting_bridge_calls(monkeypatch)
    rng = np.random.default_rng(3)
    for step in range(3):
        kjt = random_kjt(rng, tables, 4, weighted=weighted)
        assert kjt.keys() != ref._feature_names
        want = ref(kjt).values()
        grad = torch.from_numpy(rng.standard_normal(tuple(want.shape)).astype(np.float32))
        want.backward(grad)
        if step:  # the first step makes the plans (the layout validated once)
            reads.clear()
            calls.clear()
            on[0] = True
        got = ebc(kjt).values()
        got.backward(grad)
        on[0] = False
        assert torch.equal(got.detach(), want.detach())
        if step:
            assert reads == [] and calls == [], (step, reads, calls)
    for (k, a), b in zip(ebc.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k


def test_the_step_count_follows_writes_from_elsewhere():
    """The host copy of the step is re-read when ``iter`` changed behind the module's back."""
    from embnum.modules import FusedTBE

    mod = FusedTBE([5], [2], optimizer=embnum.TBEOptimizer("adam", learning_rate=0.1))
    mod(torch.tensor([1]), torch.tensor([0, 1])).backward(torch.ones(1, 2))
    assert mod.step == 1
    mod.iter.fill_(7)  # written in place
    assert mod.step == 7
    mod.load_state_dict({**mod.state_dict(), "iter": torch.tensor(4)})
    assert mod.step == 4
    mod.step = 9
    assert int(mod.iter) == 9 and mod.step == 9


def test_a_trusted_device_layout_is_not_copied_back(monkeypatch):
    from embnum.ops import tbe as tbe_ops

    copies = []
    real = _validate.to_host
    monkeypatch.setattr(_validate, "to_host", lambda a, dtype=None: copies.append(1) or real(a, dtype))
    lay = embnum.tbe_layout([3, 5], [2, 4])
    w = np.zeros(lay.num_weights, np.float32)
    dev = [np.array(a).view(_Device) for a in lay.arrays()]
    want = tbe_ops.layout(w, *lay.arrays())
    got = tbe_ops.layout(w, *dev)
    assert len(copies) == 3 and all(np.array_equal(a, b) for a, b in zip(got, want))
    tbe_ops.trust_device_layout(w, *dev)
    copies.clear()
    got = tbe_ops.layout(w, *dev)
    assert copies == [] and all(np.array_equal(a, b) for a, b in zip(got, want))
    got[0][0] = 99  # each call gets copies: a caller cannot change the trusted layout
    assert tbe_ops.layout(w, *dev)[0][0] == want[0][0]
    other = [np.array(a).view(_Device) for a in lay.arrays()]  # the same values elsewhere: not trusted
    tbe_ops.layout(w, *other)
    assert len(copies) == 3
    tbe_ops.layout(np.zeros(lay.num_weights + 1, np.float32), *dev)  # another len(weights): not trusted
    assert len(copies) == 6


def test_an_invalid_device_layout_is_not_trusted():
    from embnum.ops import tbe as tbe_ops

    lay = embnum.tbe_layout([3, 5], [2, 4])
    bad = [np.array(a).view(_Device) for a in lay.arrays()]
    bad[1][1] = 0  # D_offsets must grow
    with pytest.raises(ValueError, match="D_offsets must grow"):
        tbe_ops.trust_device_layout(np.zeros(lay.num_weights, np.float32), *bad)


# -- on a GPU -----------------------------------------------------------------------------------
def _cuda_module(kind="rowwise_adagrad", mode="none"):
    from embnum.modules import FusedTBE

    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    opt = embnum.TBEOptimizer(kind, learning_rate=0.05)
    return FusedTBE([2000, 3000], [64, 32], optimizer=opt, bounds_check_mode=mode).cuda()


def _cuda_batch(rng):
    idx = torch.from_numpy(rng.integers(0, 2000, 400)).cuda()
    off = torch.from_numpy(np.linspace(0, 400, 2 * 64 + 1).astype(np.int64)).cuda()
    g = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)).cuda()
    return idx, off, g


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["none", "warning"])
def test_a_cuda_training_step_reads_nothing_back(monkeypatch, mode):
    import sys

    from embnum import _backend

    mod = _cuda_module(mode=mode)
    reads, on = _counting(monkeypatch)
    real = _backend.to_host

    def counted(a, dtype=None):
        if on[0]:
            reads.append("to_host")
        return real(a, dtype)

    for m in list(sys.modules.values()):  # every embnum module that copies device data through it
        if (getattr(m, "__name__", "") or "").startswith("embnum") and getattr(m, "to_host", None) is real:
            monkeypatch.setattr(m, "to_host", counted)
    rng = np.random.default_rng(0)
    idx, off, g = _cuda_batch(rng)
    mod(idx, off).backward(g)  # the first step trusts the layout (its one read)
    for _ in range(3):
        idx, off, g = _cuda_batch(rng)
        reads.clear()
        on[0] = True
        mod(idx, off).backward(g)
        on[0] = False
        assert reads == [], reads
    torch.cuda.synchronize()
    assert mod.step == 4


@pytest.mark.gpu
def test_a_cuda_training_step_is_captured_in_a_cuda_graph():
    """Capture fails on any synchronisation or host read inside the step; replaying the graph
    then trains as the same steps run eagerly."""
    eager, graphed = _cuda_module(), _cuda_module()
    rng = np.random.default_rng(1)
    idx, off, g = _cuda_batch(rng)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream: compiles, caches, pools
        for _ in range(2):
            graphed(idx, off).backward(g)
            eager(idx, off).backward(g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        graphed(idx, off).backward(g)
    for _ in range(3):
        graph.replay()
        eager(idx, off).backward(g)
    torch.cuda.synchronize()
    assert torch.allclose(graphed.weights, eager.weights, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_a_cuda_collection_step_regroups_without_a_sync(monkeypatch):
    """On CUDA tensors, features in another key order: after the first step (plans made), a step
    runs under torch's sync debug mode "error" (a torch operation that synchronises raises) and
    calls no bridge op; it trains as the cpu collection does."""
    from collection_inputs import random_kjt, small_tables
    from embnum.modules import EmbeddingBagCollection

    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    tables = small_tables()
    opt = embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.05)
    ebc = EmbeddingBagCollection(tables, optimizer=opt, device="cuda", bounds_check_mode="none")
    ref = EmbeddingBagCollection(tables, optimizer=opt, bounds_check_mode="none")
    calls = _counting_bridge_calls(monkeypatch)
    rng = np.random.default_rng(4)
    for step in range(3):
        kjt = random_kjt(rng, tables, 8)
        on_gpu = embnum.KeyedJaggedTensor(kjt.keys(), kjt.values().cuda(), None, kjt.lengths().cuda())
        want = ref(kjt).values()
        grad = torch.from_numpy(rng.standard_normal(tuple(want.shape)).astype(np.float32))
        want.backward(grad)
        g = grad.cuda()
        calls.clear()
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            got = ebc(on_gpu).values()
            got.backward(g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if step:
            assert calls == [], calls
        assert torch.allclose(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
