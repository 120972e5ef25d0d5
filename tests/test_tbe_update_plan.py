"""FusedTBE's backward through its prepared update plan (``embnum.ops.tbe.UpdatePlan``) equals the
op's generic path.

The module's backward updates the lookups its planned forward checked, past the bridge and the
registry (argument binding, the layout, the lookups and the state checked again). Here a module and
its twin whose backward always takes the generic path (``FusedTBE.apply_gradient``) train on the
same Hypothesis-drawn steps, on the cpu backend and the cuda one (the simulator without a GPU):
the same weights, state and step, bit for bit, and the same errors.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import embnum
from embnum.ops import tbe as tbe_ops

torch = pytest.importorskip("torch")
from embnum.modules import FusedTBE  # noqa: E402

KINDS = [
    "sgd",
    "adagrad",
    "rowwise_adagrad",
    "adam",
    "lamb",
    "partial_rowwise_adam",
    "partial_rowwise_lamb",
    "lars_sgd",
]


def _planned_runs(monkeypatch):
    """How many updates ran through a plan."""
    calls = []
    real = tbe_ops.UpdatePlan.run

    def run(self, *a):
        calls.append(1)
        return real(self, *a)

    monkeypatch.setattr(tbe_ops.UpdatePlan, "run", run)
    return calls


def _twins(rows, dims, opt, **kw):
    """A module and its twin (same weights) whose backward never takes the plan."""
    m, generic = FusedTBE(rows, dims, optimizer=opt, **kw), FusedTBE(rows, dims, optimizer=opt, **kw)
    generic.planned_update = lambda grad, checked: False
    return m, generic


def _state(m):
    return [x.detach().clone() for x in (m.weights, m.momentum1, m.momentum2, m.iter) if x is not None]


def _same_bits(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        bits = {torch.float16: torch.int16, torch.float32: torch.int32}.get(x.dtype)
        assert torch.equal(x.view(bits), y.view(bits)) if bits else torch.equal(x, y)


@st.composite
def _case(draw):
    T = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 6), min_size=T, max_size=T))
    pooling = draw(st.sampled_from(["sum", "mean", "none"]))
    dims = (
        [draw(st.integers(1, 6))] * T
        if pooling == "none"
        else draw(st.lists(st.integers(1, 6), min_size=T, max_size=T))
    )
    kind = draw(st.sampled_from(KINDS))
    opt = embnum.TBEOptimizer(
        kind,
        learning_rate=0.05,
        max_gradient=draw(st.sampled_from([None, 0.3])),
        max_norm=draw(st.sampled_from([None, 0.5])),
    )
    steps = []
    for _ in range(2):
        B = draw(st.integers(0, 3))
        lengths = draw(st.lists(st.integers(0, 3), min_size=T * B, max_size=T * B))
        ids = [draw(st.integers(0, rows[t // max(B, 1)] - 1)) for t in range(T * B) for _ in range(lengths[t])]
        itype = draw(st.sampled_from([torch.int32, torch.int64]))
        off = torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), dtype=itype)
        psw = torch.rand(len(ids)) if pooling == "sum" and draw(st.booleans()) else None
        steps.append((torch.tensor(ids, dtype=itype), off, psw, draw(st.integers(0, 2**31))))
    return dict(
        rows=rows,
        dims=dims,
        pooling=pooling,
        opt=opt,
        steps=steps,
        wdt=draw(st.sampled_from([torch.float32, torch.float16])),
        backend=draw(st.sampled_from(["cpu", "cuda"])),
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=_case())
def test_the_planned_update_equals_the_generic_path(monkeypatch, c):
    kw = dict(pooling_mode=c["pooling"], weights_dtype=c["wdt"], backend=c["backend"])
    m, generic = _twins(c["rows"], c["dims"], c["opt"], **kw)
    runs = _planned_runs(monkeypatch)
    for ids, off, psw, seed in c["steps"]:
        for mod in (m, generic):
            out = mod(ids, off, psw)
            g = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(out.shape)).astype(np.float32))
            out.backward(g.to(out.dtype))
    assert len(runs) == len(c["steps"])  # the twin's steps took the generic path
    _same_bits(_state(m), _state(generic))
    assert m.step == generic.step == len(c["steps"])


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_planned_update_raises_what_the_op_raises_and_changes_nothing(backend):
    opt = embnum.TBEOptimizer("adagrad", learning_rate=0.1)
    m, generic = _twins([4, 3], [2, 2], opt, backend=backend)
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    for mod in (m, generic):
        mod.momentum1 = torch.zeros(mod.momentum1.shape[0] + 1)  # state of the wrong size
    errors = []
    for mod in (m, generic):
        before = _state(mod)
        out = mod(ids, off)
        with pytest.raises(ValueError) as err:
            out.sum().backward()
        errors.append(str(err.value))
        _same_bits(_state(mod), before)
    assert errors[0] == errors[1] and "momentum1" in errors[0]


def test_the_update_plan_is_made_again_when_the_optimizer_or_the_state_changes(monkeypatch):
    m = FusedTBE([4, 3], [2, 2], optimizer=embnum.TBEOptimizer("adam", learning_rate=0.1), backend="cpu")
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    m(ids, off).sum().backward()
    first = m._update[1]
    m(ids, off).sum().backward()
    assert m._update[1] is first  # kept
    m.momentum2 = m.momentum2.clone()  # a replaced buffer: another array
    m(ids, off).sum().backward()
    assert m._update[1] is not first
    second = m._update[1]
    m.optimizer = embnum.TBEOptimizer("adam", learning_rate=0.2)
    m(ids, off).sum().backward()
    assert m._update[1] is not second and m._update[1].optimizer is m.optimizer
    assert m.step == 4


def test_a_wanted_per_sample_weights_gradient_takes_the_generic_path(monkeypatch):
    m, generic = _twins([4, 3], [2, 2], embnum.TBEOptimizer("sgd", learning_rate=0.1), backend="cpu")
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    runs = _planned_runs(monkeypatch)
    grads = []
    for mod in (m, generic):
        psw = torch.rand(4, generator=torch.Generator().manual_seed(0)).requires_grad_()
        mod(ids, off, psw).sum().backward()
        grads.append(psw.grad)
    assert runs == []
    assert torch.equal(grads[0], grads[1])
    _same_bits(_state(m), _state(generic))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_repaired_lookup_is_updated_as_the_forward_repaired_it(monkeypatch, backend):
    """bounds mode "warning": the forward repairs a copy of the ids (a bad id reads row 0) and warns;
    the planned update steps those same repaired lookups, as the generic path's own repair does,
    without checking (and warning) a second time."""
    opt = embnum.TBEOptimizer("rowwise_adagrad", learning_rate=0.1)
    m, generic = _twins([4, 3], [2, 2], opt, backend=backend, bounds_check_mode="warning")
    ids, off = torch.tensor([0, 1, 9, 5]), torch.tensor([0, 1, 2, 3, 4])
    runs = _planned_runs(monkeypatch)
    with pytest.warns(RuntimeWarning) as planned:
        m(ids, off).sum().backward()
    with pytest.warns(RuntimeWarning):
        generic(ids, off).sum().backward()
    assert runs == [1] and len(planned) == 1
    _same_bits(_state(m), _state(generic))
    assert torch.equal(ids, torch.tensor([0, 1, 9, 5]))


@pytest.mark.gpu
def test_a_cuda_step_allocates_only_torch_memory():
    """A planned CUDA step (the plans made in the first) takes its output, its scratch and its plans'
    device tables from torch's caching allocator: CuPy's own pool does not grow, and torch holds no
    more memory after the step than before it (its outputs and scratch freed back to torch)."""
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    cupy = pytest.importorskip("cupy")
    pool = cupy.get_default_memory_pool()
    m = FusedTBE([3000, 2000], [64, 32], optimizer=embnum.TBEOptimizer("lamb", learning_rate=0.05)).cuda()
    rng = np.random.default_rng(2)
    idx = torch.from_numpy(rng.integers(0, 2000, 500)).cuda()
    off = torch.from_numpy(np.linspace(0, 500, 2 * 32 + 1).astype(np.int64)).cuda()
    g = torch.ones(32, 96, device="cuda")
    torch.cuda.synchronize()
    in_pool = pool.used_bytes()
    m(idx, off).backward(g)  # the first step makes the plans
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    m(idx, off).backward(g)
    torch.cuda.synchronize()
    assert pool.used_bytes() == in_pool
    assert torch.cuda.memory_allocated() == before
    assert m.step == 2
