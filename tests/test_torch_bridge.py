"""The torch bridge machinery, over every bridged op: zero copies, opcheck,
torch.compile(fullgraph=True), and bridge == NumPy op."""

import numpy as np
import pytest

import embnum

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")

BRIDGED = [name for name in tb.__all__ if name not in ("to_array", "to_tensor")]


def _example(name):
    """The op's small tour example, as tensors (float inputs of differentiable ops require grad)."""
    op = embnum.get_op(name)
    spec = tb.BRIDGES[name]
    args = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)

    def conv(key, a):
        if isinstance(a, np.ndarray):
            t = torch.tensor(a)
            if key in op.differentiable and t.is_floating_point():
                t = t.to(spec.grad_dtype).requires_grad_()
            return t
        if isinstance(a, list):
            return [conv(key, x) for x in a]
        return a

    return spec.encode({k: conv(k, a) for k, a in args.items()})


def _clone_mutated(name, args):
    """Fresh copies of the arguments an in-place op writes (other arguments shared)."""
    mutates = embnum.get_op(name).mutates
    return {k: a.clone() if k in mutates and isinstance(a, torch.Tensor) else a for k, a in args.items()}


def _result(name, args, returned):
    """What to compare: the returned value, or the written arguments of an in-place op."""
    mutates = embnum.get_op(name).mutates
    if mutates:
        return [args[k] for k in mutates if args.get(k) is not None]
    return list(returned) if isinstance(returned, tuple) else returned


def _tensors(result):
    """The tensors of an op's result (one tensor, or a tuple/list with None slots)."""
    items = result if isinstance(result, (list, tuple)) else [result]
    return [t for t in items if t is not None]


def _loss(result):
    """A scalar that depends on every differentiable output."""
    return sum(t.sum() for t in _tensors(result) if t.requires_grad)


def _numpy(x):
    """A bridge result as NumPy: tensors converted, lists/tuples item by item, the rest as is."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:  # NumPy has no bfloat16: compare the bit patterns
            x = x.view(torch.uint16)
        return x.detach().numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(_numpy(v) for v in x)
    return x


def test_every_op_is_bridged():
    assert sorted(BRIDGED) == sorted(op.name for op in embnum.ops())


def test_dlpack_views_share_memory():
    t = torch.arange(12.0).reshape(3, 4)[:, 1:]  # strided too
    a = tb.to_array(t)
    assert a.ctypes.data == t.data_ptr() and a.strides == tuple(s * 4 for s in t.stride())
    back = tb.to_tensor(a)
    assert back.data_ptr() == t.data_ptr()


def test_bridge_passes_input_memory_and_returns_output_memory_without_copies(monkeypatch):
    seen = {}
    op = embnum.get_op("jagged_to_padded_dense")
    real = op.implementation("cpu")

    def spy(values, offsets, max_lengths, padding_value, out):
        seen["values"] = values.ctypes.data
        seen["offsets"] = offsets[0].ctypes.data
        seen["out"] = out.ctypes.data
        real(values, offsets, max_lengths, padding_value, out)

    cpu = embnum._backend.BACKENDS["cpu"]
    monkeypatch.setitem(op._kernels, cpu, (spy, op._kernels[cpu][1], cpu.runner(spy)))
    values = torch.arange(12.0).reshape(6, 2)
    offsets = torch.tensor([0, 2, 3, 3, 6])
    dense = tb.jagged_to_padded_dense(values, [offsets], [2])
    assert seen["values"] == values.data_ptr()
    assert seen["offsets"] == offsets.data_ptr()
    assert seen["out"] == dense.data_ptr()


@pytest.mark.parametrize("name", BRIDGED)
def test_opcheck(name):
    """Schema, fake implementation, autograd registration and AOT dispatch of the custom op."""
    args = _example(name)
    torch_op = getattr(torch.ops.embnum, name).default
    values = list(_clone_mutated(name, args).values()) + [None]
    utils = list(torch.library._OPCHECK_DEFAULT_UTILS)
    wants_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in values)
    if wants_grad and _int_before_float(torch_op(*values)):
        # opcheck's aot_dispatch_dynamic sums every output into one accumulator that starts
        # as the first output's (integer) sum, and the in-place add of a float sum fails in
        # torch itself; test_compile_fullgraph_aot_eager covers those ops' AOT path and grads
        utils.remove("test_aot_dispatch_dynamic")
    torch.library.opcheck(torch_op, values, test_utils=utils)


def _int_before_float(result):
    kinds = [t.is_floating_point() for t in _tensors(result)]
    return bool(kinds) and not kinds[0] and any(kinds)


@pytest.mark.parametrize("name", BRIDGED)
def test_bridge_equals_numpy_op(name):
    op = embnum.get_op(name)
    np_args = op.example_fn(np.random.default_rng(1), "small").args
    ref_args = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in np_args.items()}
    want = _result(name, ref_args, op.public(**ref_args, backend="ref"))
    t_args = {
        k: torch.tensor(v)
        if isinstance(v, np.ndarray)
        else [torch.tensor(x) for x in v]
        if isinstance(v, list) and v and isinstance(v[0], np.ndarray)
        else v
        for k, v in np_args.items()
    }
    got = _result(name, t_args, getattr(tb, name)(**t_args))
    err, ok = op.check_fn(_numpy(got), want, np_args)
    assert ok, err


@pytest.mark.parametrize("name", BRIDGED)
def test_torch_op_callable_without_backend(name):
    """``torch.ops.embnum.<name>(...)`` with the op's own arguments only (the schema gives
    ``backend`` the default None): the same result, and the same gradients, as with the
    backend named."""
    args = _example(name)
    torch_op = getattr(torch.ops.embnum, name)
    assert torch_op.default._schema.arguments[-1].name == "backend"
    assert torch_op.default._schema.arguments[-1].default_value is None
    plain_args, named_args = _clone_mutated(name, args), _clone_mutated(name, args)
    plain = torch_op(*plain_args.values())
    named = torch_op(*named_args.values(), "cpu")
    torch.testing.assert_close(_result(name, plain_args, plain), _result(name, named_args, named), rtol=0, atol=0)
    leaves = [
        t
        for k in embnum.get_op(name).differentiable
        for t in (args[k] if isinstance(args[k], list) else [args[k]])
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if leaves and not embnum.get_op(name).mutates:
        for a, b in zip(torch.autograd.grad(_loss(plain), leaves), torch.autograd.grad(_loss(named), leaves)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", BRIDGED)
def test_eager_autograd_path_equals_the_registered_one(name):
    """An eager call that needs a gradient runs through the op's own ``autograd.Function``
    (no dispatcher; ``_call._eager_autograd``): the same outputs, the same gradients
    (every differentiable input, lists included) and the same ``needs_input_grad`` seen by
    the formula as ``torch.ops.embnum.<name>`` (the registered autograd) gives."""
    op = embnum.get_op(name)
    args = _example(name)
    leaves = [
        t
        for k in op.differentiable
        for t in (args[k] if isinstance(args[k], list) else [args[k]])
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if op.mutates or not leaves or tb.BRIDGES[name].backward is None or tb.BRIDGES[name].codecs:
        pytest.skip("no eager autograd path: in place, nothing differentiable, or codecs (registered path only)")
    eager = getattr(tb, name)(**args)
    registered = getattr(torch.ops.embnum, name)(*args.values())
    kinds = {type(t.grad_fn).__name__ for t in _tensors(eager) if t.requires_grad}
    assert kinds == {f"Eager_{name}Backward"}, kinds
    assert not any(type(t.grad_fn).__name__.startswith("Eager") for t in _tensors(registered) if t.requires_grad)
    torch.testing.assert_close(_result(name, args, eager), _result(name, args, registered), rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(_loss(eager), leaves), torch.autograd.grad(_loss(registered), leaves)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", BRIDGED)
def test_compile_fullgraph_aot_eager(name):
    torch._dynamo.reset()  # one code object serves every op here: start each from a clean cache
    args = _example(name)
    fn = getattr(tb, name)
    op = embnum.get_op(name)
    eager_args, compiled_args = _clone_mutated(name, args), _clone_mutated(name, args)
    eager = _result(name, eager_args, fn(**eager_args))
    compiled = _result(
        name, compiled_args, torch.compile(lambda kw: fn(**kw), backend="aot_eager", fullgraph=True)(compiled_args)
    )
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    diff = [
        k
        for k in op.differentiable
        if any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in (args[k] if isinstance(args[k], list) else [args[k]])
        )
    ]
    if diff:
        leaves = [t for k in diff for t in (args[k] if isinstance(args[k], list) else [args[k]])]
        g_eager = torch.autograd.grad(_loss(eager), leaves)
        g_comp = torch.autograd.grad(
            torch.compile(lambda kw: _loss(fn(**kw)), backend="aot_eager", fullgraph=True)(args), leaves
        )
        for a, b in zip(g_eager, g_comp):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compile_inductor_training_step():
    """One inductor compile (slow on this machine): a padded-dense layer trained through the bridge."""
    values = torch.randn(10, 4, requires_grad=True)
    offsets = torch.tensor([0, 3, 3, 7, 10])
    weight = torch.randn(4, 2, requires_grad=True)

    def step(v, w):
        dense = tb.jagged_to_padded_dense(v, [offsets], [3], 0.0)
        return (dense @ w).square().mean()

    loss_c = torch.compile(step, backend="inductor", fullgraph=True)(values, weight)
    gc = torch.autograd.grad(loss_c, [values, weight])
    loss_e = step(values, weight)
    ge = torch.autograd.grad(loss_e, [values, weight])
    torch.testing.assert_close(loss_c, loss_e)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b)


def test_bridge_errors_come_from_the_op():
    with pytest.raises(ValueError, match="offsets\\[0\\]\\[-1\\] = 7"):
        tb.jagged_to_padded_dense(torch.zeros(6, 2), [torch.tensor([0, 7])], [2])
    with pytest.raises(TypeError, match="bfloat16"):
        tb.complete_cumsum(torch.ones(3, dtype=torch.bfloat16))


# -- the one bfloat16 rule ------------------------------------------------------------------
def test_bfloat16_rule_round_to_bfloat16():
    """Rounding back: torch's nearest-even rounding, except that a NaN keeps its top 16 bits."""
    from embnum.torch_bridge._library import round_to_bfloat16

    bits = torch.tensor([0x3F80, 0x7FC1, 0xFFA5, 0x7F81, 0x0001, 0x8000, 0x7F80], dtype=torch.int32)
    b = bits.to(torch.int16).view(torch.bfloat16)
    assert torch.equal(round_to_bfloat16(b.float()).view(torch.int16), b.view(torch.int16))  # exact way back
    x = torch.tensor([1.00390625, 1.01171875, -3.0e38, 1e-40, float("inf")])
    assert torch.equal(round_to_bfloat16(x).view(torch.int16), x.to(torch.bfloat16).view(torch.int16))


def test_bfloat16_rule_moves_nan_payloads_and_rejects_float32_beside_it():
    payloads = torch.tensor([0x7FC1, 0xFFA5, 0x7F81, 0x3F80, 0xC0A0, 0x0001], dtype=torch.int32)
    values = payloads.to(torch.int16).view(torch.bfloat16)
    lengths, permute = torch.tensor([2, 1, 3]), torch.tensor([2, 0, 1])
    _, moved, _ = tb.permute_1d_sparse_data(permute, lengths, values)
    want = torch.cat([values[3:], values[:2], values[2:3]])
    assert moved.dtype == torch.bfloat16 and torch.equal(moved.view(torch.int16), want.view(torch.int16))
    with pytest.raises(TypeError, match="float32 beside bfloat16"):
        tb.permute_1d_sparse_data(permute, lengths, values, torch.ones(6))
    _, _, w = tb.permute_1d_sparse_data(permute, lengths, torch.arange(6), values)  # weights only: moved too
    assert w.dtype == torch.bfloat16 and torch.equal(w.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_cuda_tensors_stay_on_the_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    values = torch.randn(6, 3, device="cuda", requires_grad=True)
    offsets = torch.tensor([0, 2, 3, 3, 6], device="cuda")
    dense = tb.jagged_to_padded_dense(values, [offsets], [2])
    assert dense.device == values.device
    dense.sum().backward()
    want = embnum.jagged_to_padded_dense(values.detach().cpu().numpy(), [offsets.cpu().numpy()], [2], backend="ref")
    np.testing.assert_array_equal(dense.detach().cpu().numpy(), want)
    assert values.grad.device == values.device


@pytest.mark.gpu
def test_cuda_outputs_and_scratch_come_from_torchs_allocator():
    """A bridged op on CUDA tensors allocates through torch's caching allocator: torch counts its
    output, CuPy's own pool stays untouched, and the memory returns to torch once freed."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cupy = pytest.importorskip("cupy")
    values = torch.randn(4096, 64, device="cuda")
    offsets = torch.arange(0, 4097, 8, device="cuda")
    torch.cuda.synchronize()
    pool_before = cupy.get_default_memory_pool().used_bytes()
    before = torch.cuda.memory_allocated()
    dense = tb.jagged_to_padded_dense(values, [offsets], [8])
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before >= dense.numel() * dense.element_size()
    assert cupy.get_default_memory_pool().used_bytes() == pool_before
    want = embnum.jagged_to_padded_dense(values.cpu().numpy(), [offsets.cpu().numpy()], [8], backend="ref")
    np.testing.assert_array_equal(dense.cpu().numpy(), want)
    del dense
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


# -- the bridge's host path ------------------------------------------------------------------
def test_host_path_only_for_plain_cpu_calls_without_grad(monkeypatch):
    """A bridge call runs the NumPy op on views of its tensors (no dispatcher) only when nothing
    could notice: plain CPU tensors, no gradient wanted, no mode, no tracing, no profiler."""
    from torch.overrides import TorchFunctionMode

    fn = tb.jagged_to_padded_dense
    hosted = []
    run_host = fn._run_host
    monkeypatch.setattr(fn, "_run_host", lambda *a: hosted.append(1) or run_host(*a))

    def on_host(values, offsets):
        """Whether the call ran the NumPy op directly (not inside an autograd Function)."""
        hosted.clear()
        out = fn(values, [offsets], [3])
        return bool(hosted) and out.grad_fn is None

    x, offs = torch.ones(4), torch.tensor([0, 1, 4])
    assert on_host(x, offs)
    assert not on_host(torch.ones(4, requires_grad=True), offs)  # the autograd Function's forward
    with torch.no_grad():
        assert on_host(torch.ones(4, requires_grad=True), offs)
    assert not on_host(x, torch.nn.Parameter(offs, requires_grad=False))  # a subclass in a list

    class PassThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough():
        assert not on_host(x, offs)
    with torch.autograd.profiler.profile():
        assert not on_host(x, offs)


def test_modes_and_fake_tensors_see_the_torch_op():
    """Calls that must reach the dispatcher do: a function mode sees the custom op, and fake
    tensors get the fake implementation (not the NumPy kernel)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode

    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    lengths = torch.tensor([2, 0, 3])
    with Spy():
        tb.complete_cumsum(lengths)
    assert any("embnum.complete_cumsum" in s for s in seen)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(lengths)
        out = tb.complete_cumsum(fake)
    assert out.shape == (4,) and type(out).__name__ == "FakeTensor"


def test_plain_list_checks_return_new_lists():
    """The schema check of a list argument gives back a new list (nested ones too), never the caller's."""
    from embnum.torch_bridge import _values

    ints = (1, 2, 3)
    assert _values.check_value("arg", "int[]", ints) == [1, 2, 3]
    nested = [["a"], ["b", "c"]]
    got = _values.check_value("arg", "str[][]", nested)
    assert got == nested and got is not nested and got[0] is not nested[0]
