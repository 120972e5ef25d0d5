"""FusedTBE's forward through its prepared plan (``embnum.ops.tbe.ForwardPlan``) equals the op's generic path.

The module's forward skips the registry (argument binding, backend choice, the layout check) and
calls the kernel on a plan made once per layout and settings. Here both paths run on the same
Hypothesis-drawn lookups, on the cpu backend and the cuda one (the simulator without a GPU): the
same output bits, the same errors, and a plan made again when a setting or the layout changes.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import embnum
from embnum.ops import tbe as tbe_ops

torch = pytest.importorskip("torch")
from embnum.modules import FusedTBE  # noqa: E402
from embnum.torch_bridge import tbe_forward  # noqa: E402

OPT = embnum.TBEOptimizer("sgd", learning_rate=0.1)


def _generic(m, indices, offsets, psw=None):
    return tbe_forward(
        m.weights.detach(),
        *m.layout(),
        indices,
        offsets,
        m.pooling_mode,
        psw,
        output_dtype=m.output_dtype,
        bounds_check_mode=m.bounds_check_mode,
        backend=m.backend,
    )


def _plan(m):
    """The module's current forward plan."""
    return m.forward_call(m.weights)[0]


def _planned_calls(monkeypatch):
    """How many forwards ran through a plan."""
    calls = []
    real = tbe_ops.ForwardPlan.run

    def run(self, *a):
        calls.append(1)
        return real(self, *a)

    monkeypatch.setattr(tbe_ops.ForwardPlan, "run", run)
    return calls


@st.composite
def _case(draw):
    T = draw(st.integers(1, 3))
    rows = draw(st.lists(st.integers(1, 6), min_size=T, max_size=T))
    pooling = draw(st.sampled_from(["sum", "mean", "none"]))
    dims = (
        [draw(st.integers(1, 5))] * T
        if pooling == "none"
        else draw(st.lists(st.integers(1, 5), min_size=T, max_size=T))
    )
    B = draw(st.integers(0, 3))
    lengths = draw(st.lists(st.integers(0, 3), min_size=T * B, max_size=T * B))
    ids = [draw(st.integers(0, rows[t // max(B, 1)] - 1)) for t in range(T * B) for _ in range(lengths[t])] if B else []
    itype = draw(st.sampled_from([torch.int32, torch.int64]))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), dtype=itype)
    psw = draw(st.booleans()) and pooling == "sum"
    return dict(
        rows=rows,
        dims=dims,
        pooling=pooling,
        indices=torch.tensor(ids, dtype=itype),
        offsets=offsets,
        # (drawn, not torch.rand: a failure then reproduces from Hypothesis's blob)
        psw=torch.tensor(draw(st.lists(st.floats(0, 1, width=32), min_size=len(ids), max_size=len(ids))))
        if psw
        else None,
        out=draw(st.sampled_from(["float32", "float16"])),
        wdt=draw(st.sampled_from([torch.float32, torch.float16])),
        backend=draw(st.sampled_from(["cpu", "cuda"])),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=_case())
def test_the_planned_forward_equals_the_generic_path(monkeypatch, c):
    m = FusedTBE(
        c["rows"],
        c["dims"],
        optimizer=OPT,
        pooling_mode=c["pooling"],
        output_dtype=c["out"],
        weights_dtype=c["wdt"],
        backend=c["backend"],
    )
    with monkeypatch.context() as mp:
        calls = _planned_calls(mp)
        got = m(c["indices"], c["offsets"], c["psw"])
    want = _generic(m, c["indices"], c["offsets"], c["psw"])
    assert calls == [1]
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = torch.int16 if got.dtype == torch.float16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_planned_forward_raises_what_the_op_raises(monkeypatch, backend):
    m = FusedTBE([4, 3], [2, 2], optimizer=OPT, backend=backend)
    off = torch.tensor([0, 1, 2, 3, 4])
    cases = [
        (torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])),  # len(offsets) - 1 not a multiple of T
        (torch.tensor([0, 1, 9, 0]), off),  # an id outside table 1
        (torch.tensor([0, 1, 2, 0]), torch.tensor([0, 3, 2, 3, 4])),  # offsets going down
        (torch.tensor([0.0, 1.0, 2.0, 0.0]), off),  # float indices: not planned, the op's error
    ]
    for ids, o in cases:
        with pytest.raises((ValueError, IndexError, TypeError)) as planned:
            m(ids, o)
        with monkeypatch.context() as mp:  # the module as it was: every call through the op
            mp.setattr(FusedTBE, "forward_call", lambda self, w: None)
            with pytest.raises((ValueError, IndexError, TypeError)) as generic:
                m(ids, o)
        assert type(planned.value) is type(generic.value)
        assert str(planned.value) == str(generic.value)
    with pytest.raises(ValueError, match="per_sample_weights"):
        m(torch.tensor([0, 1, 2, 0]), off, torch.ones(3))


def test_the_plan_is_made_again_when_a_setting_or_the_layout_changes(monkeypatch):
    m = FusedTBE([4, 3], [2, 2], optimizer=OPT, backend="cpu")
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    m(ids, off)
    first = _plan(m)
    assert _plan(m) is first  # kept
    m.pooling_mode = "mean"
    assert _plan(m) is not first
    assert torch.equal(m(ids, off), _generic(m, ids, off))
    second = _plan(m)
    m.bounds_check_mode = "warning"
    third = _plan(m)
    assert third is not second
    with torch.no_grad():
        m.D_offsets.copy_(m.D_offsets.clone())  # a written layout buffer (its version moves)
    assert _plan(m) is not third
    assert torch.equal(m(ids, off), _generic(m, ids, off))


def test_a_ref_backend_module_takes_the_generic_path(monkeypatch):
    m = FusedTBE([4, 3], [2, 2], optimizer=OPT, backend="ref")
    calls = _planned_calls(monkeypatch)
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    assert torch.equal(m(ids, off), _generic(m, ids, off))
    assert calls == []


def test_a_planned_forward_still_trains(monkeypatch):
    m = FusedTBE([4, 3], [2, 2], optimizer=OPT, backend="cpu")
    ids, off = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    before = m.weights.detach().clone()
    m(ids, off).sum().backward()
    assert not torch.equal(before, m.weights.detach())
    assert m.step == 1


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_planned_forward_repairs_and_warns_as_the_op(monkeypatch, backend):
    m = FusedTBE([4, 3], [2, 2], optimizer=OPT, backend=backend, bounds_check_mode="warning")
    ids, off = torch.tensor([0, 1, 9, 5]), torch.tensor([0, 1, 2, 3, 4])  # two ids outside table 1
    calls = _planned_calls(monkeypatch)
    with pytest.warns(RuntimeWarning) as planned:
        got = m(ids, off)
    assert calls == [1]
    with pytest.warns(RuntimeWarning) as generic:
        want = _generic(m, ids, off)
    assert [str(w.message) for w in planned] == [str(w.message) for w in generic]
    assert torch.equal(got, want)
    assert torch.equal(ids, torch.tensor([0, 1, 9, 5]))  # the caller's ids untouched
