"""What a planned FusedTBE forward keeps between calls, and when it stops trusting it.

The module keeps its forward's parts (``FusedTBE.forward_call``, one cache: the plan, the weights'
array view, the output dtype) while the layout buffers, where and how the weights are stored, and the settings
stay the same; the backend's prepared launch (``cuda.tbe.ForwardLaunch``) keeps the weights'
contiguous form and the kernel their alignment allows per weights array. Each test changes one of
those things between two calls and checks that the next call reads what is there now: the op's
generic path on the same tensors gives the same bits.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embnum

torch = pytest.importorskip("torch")
from embnum.modules import FusedTBE  # noqa: E402
from embnum.torch_bridge import tbe_forward  # noqa: E402

OPT = embnum.TBEOptimizer("sgd", learning_rate=0.1)
IDS, OFF = torch.tensor([0, 3, 1, 2, 2, 0]), torch.tensor([0, 2, 3, 5, 6])


def _generic(m, indices, offsets):
    return tbe_forward(
        m.weights.detach(),
        *m.layout(),
        indices,
        offsets,
        m.pooling_mode,
        None,
        output_dtype=m.output_dtype,
        bounds_check_mode=m.bounds_check_mode,
        backend=m.backend,
    )


def _same(m, indices=IDS, offsets=OFF):
    got, want = m(indices, offsets), _generic(m, indices, offsets)
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = torch.int16 if got.dtype == torch.float16 else torch.int32
    assert torch.equal(got.detach().view(bits), want.view(bits))
    return got


def _module(backend, **kw):
    return FusedTBE([4, 3], [4, 8], optimizer=OPT, backend=backend, **kw)


BACKENDS = ["cpu", "cuda"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_forward_call_is_kept_while_nothing_changes(backend):
    m = _module(backend)
    _same(m)
    first = m.forward_call(m.weights)
    _same(m)
    assert m.forward_call(m.weights) is first
    assert _address(first[1]) == m.weights.data_ptr() and first[1].shape == tuple(m.weights.shape)


def _address(a):
    """Where an array's first element lives (a NumPy array here: CPU, or the simulator's)."""
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_replaced_weights_are_read(backend):
    m = _module(backend)
    before = _same(m)
    first = m.forward_call(m.weights)
    m.weights = torch.nn.Parameter(m.weights.detach() * 3 + 1)
    after = _same(m)
    assert not torch.equal(before, after)
    assert m.forward_call(m.weights) is not first


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_given_new_data_are_read(backend):
    m = _module(backend)
    before = _same(m)
    m.weights.data = torch.full_like(m.weights, 0.5)
    after = _same(m)
    assert not torch.equal(before, after)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_given_another_storage_in_place_are_read(backend):
    """``set_`` keeps the Parameter object and moves it onto other memory. (Resizing the storage
    under a kept view cannot happen on the CPU: torch refuses to resize a storage that a NumPy
    array views.)"""
    m = _module(backend)
    before = _same(m)
    n = m.weights.shape[0]
    with torch.no_grad():
        m.weights.set_(torch.arange(n, dtype=torch.float32) / n)
    after = _same(m)
    assert not torch.equal(before, after)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shift", [1, 2, 4])
def test_weights_moved_to_another_alignment_are_read(backend, shift):
    """``set_`` onto the same values ``shift`` float32 elements further into another storage (a
    pointer 16-byte aligned only when ``shift`` is 4): a new entry whose view is at the new place,
    the same bits as the op's generic path, and the original weights read again after."""
    m = _module(backend)
    first = _same(m)
    kept = m.forward_call(m.weights)
    n = m.weights.shape[0]
    room = torch.zeros(n + 8)
    room[shift : shift + n] = m.weights.detach()
    original = m.weights.detach().clone()
    with torch.no_grad():
        m.weights.set_(room.untyped_storage(), shift, (n,))
    assert room.data_ptr() % 16 == 0 and (m.weights.data_ptr() % 16 == 0) == (shift == 4)
    moved = _same(m)
    now = m.forward_call(m.weights)
    assert now is not kept and _address(now[1]) == m.weights.data_ptr()
    assert torch.equal(moved, first)
    with torch.no_grad():
        m.weights.set_(original)
    assert torch.equal(_same(m), first)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_moved_by_to_are_read(backend):
    m = _module(backend)
    first = _same(m)
    m.to(torch.float16)
    assert m.weights.dtype == torch.float16
    half = _same(m)
    assert not torch.equal(first, half)  # (float16 weights round; the ids here read rounded rows)
    m.to(torch.float32)
    _same(m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_layout_buffer_and_replaced_buffers_are_read(backend):
    m = _module(backend)
    _same(m)
    first = m.forward_call(m.weights)
    with torch.no_grad():
        m.D_offsets.copy_(m.D_offsets.clone())  # the same values, a new version
    assert m.forward_call(m.weights) is not first
    _same(m)
    second = m.forward_call(m.weights)
    m.D_offsets = m.D_offsets.clone()  # a new buffer, same values
    assert m.forward_call(m.weights) is not second
    _same(m)


@settings(max_examples=20, deadline=None)
@given(shift=st.integers(0, 3), ids=st.lists(st.integers(0, 2), min_size=0, max_size=6), data=st.data())
def test_the_prepared_launch_follows_the_weights_array(shift, ids, data):
    """cuda's ForwardLaunch keeps the weights' contiguous form and kernel per weights array: an array
    of other values shifted by ``shift`` elements (its pointer a multiple of 16 bytes only when
    ``shift`` is 0) between two calls on the first gives the bits of the op's generic path (which
    prepares every call afresh), through the vector kernel exactly when the pointer is aligned."""
    from embnum.cuda import tbe as cuda_tbe
    from embnum.ops.tbe import ForwardPlan

    split = data.draw(st.integers(0, len(ids)))
    m = _module("cuda")
    w = m.weights.detach().numpy()
    layout = tuple(b.numpy() for b in m.layout())
    plan = ForwardPlan(w, *layout, "sum", "float32", "fatal", "cuda")
    assert isinstance(plan._launch, cuda_tbe.ForwardLaunch)
    indices = np.array(ids, np.int64)
    offsets = np.array([0, split, len(ids), len(ids), len(ids)], np.int64)
    room = np.zeros(w.shape[0] + 8, np.float32)
    shifted = room[8 - shift : 8 - shift + w.shape[0]]
    shifted[:] = w * 2 + 1
    kernels = []
    real = cuda_tbe.launch

    def launch(kernel, *a):
        kernels.append(kernel)
        return real(kernel, *a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cuda_tbe, "launch", launch)
        for weights in (w, shifted, w):
            ids_c, off_c, B = plan.lookups(indices, offsets, None)
            out = np.empty(plan.shape(ids_c.shape[0], B), np.float32)
            plan.run(weights, ids_c, off_c, B, None, out)
            kernels.append("planned")
            want = embnum.tbe_forward(weights, *layout, indices, offsets, "sum", backend="cuda")
            np.testing.assert_array_equal(out.view(np.int32), want.view(np.int32))
    vector, element = cuda_tbe._FORWARD_POOLED["vector"], cuda_tbe._FORWARD_POOLED["element"]
    planned = [kernels[i - 1] for i, k in enumerate(kernels) if k == "planned"]
    assert planned == [vector, vector if shift == 0 else element, vector]


@pytest.mark.gpu
def test_cuda_moves_the_forward_call():
    """``.cuda()`` and back: each call reads the weights where they are now."""
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    m = _module(None)
    _same(m)
    first = m.forward_call(m.weights)
    m.cuda()
    got = m(IDS.cuda(), OFF.cuda())
    assert m.forward_call(m.weights) is not first
    assert torch.equal(got.cpu(), _generic(m.cpu(), IDS, OFF))
    _same(m)


@pytest.mark.parametrize("dims", [[4, 8], [4, 6], [3, 8]])
def test_the_update_launch_keeps_the_layouts_half_of_the_gradient_alignment(dims):
    """cuda's UpdateLaunch tests once whether every dim is a multiple of 4 (the layout's half of
    whether the gradient's slices take vector loads); a call then tests only the gradient's pointer
    and row length, and decides as the per-call test does."""
    from embnum import _tbe_bounds
    from embnum.cuda import tbe as cuda_tbe

    woff, doff, hcs = embnum.tbe_layout([3, 2], dims).arrays()
    prepared = cuda_tbe.UpdateLaunch(woff, doff, hcs, _tbe_bounds.rows_per_feature(hcs), 0)
    assert prepared._dims4 == all(d % 4 == 0 for d in dims)
    ids, off = np.zeros(2, np.int64), np.array([0, 1, 2], np.int64)
    kept = cuda_tbe.Lookups(*prepared.dev, ids, off, 1, 2, int(hcs[-1]), prepared.host[1], prepared._dims4)
    fresh = kept._replace(dims4=None)
    for g in (np.ones((1, sum(dims)), np.float32), np.ones((1, sum(dims) + 1), np.float32)[:, 1:]):
        assert cuda_tbe._gradient_rows(g, kept)[1:] == cuda_tbe._gradient_rows(g, fresh)[1:]
