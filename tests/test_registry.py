"""The registry and the backends: public functions, backend choice, out=, enumeration."""

import inspect
import subprocess
import sys

import numpy as np
import pytest

import embnum
from embnum import _backend, _validate
from embnum._registry import exact_match


def test_every_op_is_public_and_enumerable():
    names = [op.name for op in embnum.ops()]
    assert len(names) == len(set(names)) > 0
    for name in names:
        assert getattr(embnum, name) is embnum.get_op(name).public
        assert name in embnum.__all__


@pytest.mark.parametrize("op", embnum.ops(), ids=lambda o: o.name)
def test_every_op_has_every_backend_and_an_example(op):
    for backend in ("ref", "cpu", "cuda"):
        assert callable(op.implementation(backend)), f"{op.name} has no {backend} implementation"
    assert op.example_fn is not None, f"{op.name} has no tour/benchmark example"
    assert op.declaration.__doc__, f"{op.name} has no docstring"


@pytest.mark.parametrize("op", embnum.ops(), ids=lambda o: o.name)
def test_public_signature(op):
    sig = inspect.signature(op.public)
    params = list(sig.parameters.values())
    assert params[-1].name == "backend" and params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    assert ("out" in sig.parameters) == op.takes_out
    assert op.public.__doc__ == op.declaration.__doc__


def test_import_loads_no_heavy_module():
    code = "import sys, embnum; print(sorted(m for m in ('torch', 'cupy', 'numba', 'numba.cuda') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class FakeCupyArray:
    """Looks like a CuPy array to embnum's backend detection (and is nothing more)."""

    __module__ = "cupy._core.core"
    __cuda_array_interface__ = {}
    shape, ndim, dtype = (3,), 1, np.dtype(np.int64)


def test_mixing_host_and_device_is_a_type_error():
    dev = FakeCupyArray()
    assert _backend.is_cupy(dev)
    with pytest.raises(TypeError, match="cannot mix host and device arrays"):
        embnum.segment_sum_csr(1, dev, np.zeros(3))


def test_backend_choice():
    x = np.array([1, 2], np.int64)
    assert _backend.select_backend({"x": x}, None).name == "cpu"
    assert _backend.select_backend({"x": x}, "ref").name == "ref"
    with pytest.raises(ValueError, match="backend must be one of"):
        embnum.complete_cumsum(x, backend="tpu")


def test_cuda_backend_refuses_numpy_without_the_simulator(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    with pytest.raises(TypeError, match="backend 'cuda' cannot take 'lengths'.*NUMBA_ENABLE_CUDASIM"):
        embnum.complete_cumsum(np.array([1, 2]), backend="cuda")


def test_ref_refuses_device_arrays():
    dev = FakeCupyArray()
    with pytest.raises(TypeError, match="backend 'ref' cannot take 'lengths'"):
        embnum.complete_cumsum(dev, backend="ref")


def test_out_is_filled_and_returned():
    out = np.full(5, -7, np.int32)
    got = embnum.complete_cumsum(np.array([2, 0, 3, 1], np.int32), out=out, backend="ref")
    assert got is out and out.tolist() == [0, 2, 2, 5, 6]


def test_out_checks():
    lengths = np.array([1, 2, 3])
    with pytest.raises(TypeError, match="out must be one array for this op"):
        embnum.complete_cumsum(lengths, out=[0, 0, 0, 0])
    with pytest.raises(TypeError, match="out must be an array"):
        embnum.complete_cumsum(lengths, out="nope")
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(4, np.int64)
        ro.flags.writeable = False
        embnum.complete_cumsum(lengths, out=ro)
    with pytest.raises(TypeError, match="wrong device"):
        embnum.complete_cumsum(lengths, out=FakeCupyArray())


def test_overlap_detection():
    a = np.arange(10)
    assert _validate.overlaps(a[2:5], a[4:8])
    assert not _validate.overlaps(a[2:4], a[4:8])
    assert not _validate.overlaps(a[::2], np.arange(3))
    assert _validate.overlaps(a[::-1], a[3:4])
    assert not _validate.overlaps(a[:0], a)


def test_exact_match_is_bitwise():
    assert exact_match(np.array([0.0]), np.array([0.0]), {})[1]
    assert not exact_match(np.array([0.0]), np.array([-0.0]), {})[1]
    assert exact_match(np.array([np.nan]), np.array([np.nan]), {})[1]
    assert not exact_match(np.array([1], np.int32), np.array([1], np.int64), {})[1]
    assert not exact_match([np.zeros(2)], [np.zeros(2), np.zeros(2)], {})[1]


def test_scalar_conversion():
    assert _validate.scalar_for("p", 1e6, np.float16) == np.inf
    assert _validate.scalar_for("p", 7.0, np.int32) == 7
    nan16 = np.array(0xFF80, np.uint16).view(np.float16)[()]
    kept = _validate.scalar_for("p", nan16, np.float16)
    assert np.array(kept).view(np.uint16) == 0xFF80
    with pytest.raises(TypeError, match="p must be a real number"):
        _validate.scalar_for("p", None, np.float32)
    with pytest.raises(TypeError):
        _validate.scalar_for("p", True, np.float32)


def test_sizes_reject_bools_and_floats():
    with pytest.raises(TypeError, match="range_size"):
        embnum.offsets_range(np.array([0]), True)
    assert embnum.offsets_range(np.array([0]), np.int64(2)).tolist() == [0, 1]


# -- the one-thread rule and the plain-NumPy check -------------------------
@pytest.mark.parametrize("op", embnum.ops(), ids=lambda o: o.name)
def test_one_thread_and_all_threads_agree(op, monkeypatch):
    """The registry runs small calls on one thread (``cpu._common.SERIAL_BYTES_OF``): the same
    call with the rule off (every call on all threads) and with every call on one thread
    gives bit-identical results, and leaves Numba's thread count as it was."""
    import numba

    from embnum.cpu import _common

    args = op.example_fn(np.random.default_rng(3), "small").args
    before = numba.get_num_threads()
    got = {}
    for limit in (0, 1 << 62):
        monkeypatch.setattr(_common, "SERIAL_BYTES", limit)  # TBE's own rule
        monkeypatch.setattr(_common, "SERIAL_OVERRIDE", limit)  # every kernel's threshold
        call = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}
        result = op.public(**call)
        # an in-place op (``mutates``): what it wrote into its own copies of the arrays
        got[limit] = [call[k] for k in op.mutates if call.get(k) is not None] if op.mutates else result
        assert numba.get_num_threads() == before
    _, ok = exact_match(
        [got[0]] if not isinstance(got[0], (list, tuple)) else list(got[0]),
        [got[1 << 62]] if not isinstance(got[1 << 62], (list, tuple)) else list(got[1 << 62]),
        None,
    )
    assert ok


def test_one_thread_rule_restores_the_thread_count_when_the_kernel_raises():
    import numba

    from embnum.cpu import _common

    before = numba.get_num_threads()

    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _common.on_one_thread(boom)
    assert numba.get_num_threads() == before


def test_only_plain_numpy_skips_the_backend_search():
    """Plain NumPy arrays (and no array at all) run on the cpu backend without a backend
    search; an ndarray subclass or a CuPy-looking array is bound by name and searched."""
    from embnum._registry import _all_plain_numpy

    x = np.arange(3)
    assert _all_plain_numpy({"a": x, "b": [x, x], "c": 3, "d": "sum", "e": None})
    assert not _all_plain_numpy({"a": x, "m": np.ma.masked_array(x)})
    assert not _all_plain_numpy({"a": x, "d": [FakeCupyArray()]})
    assert _all_plain_numpy({"c": 3, "k": [["a"], ["b"]]})  # no array: the cpu backend, as select_backend picks
    np.testing.assert_array_equal(embnum.complete_cumsum(np.array([1, 2])), [0, 1, 3])
    buf = np.empty(3, np.int64)
    assert embnum.complete_cumsum(np.array([1, 2]), out=buf) is buf


def test_returns_is_declared_and_mutates_implies_none():
    from embnum._registry import RETURNS, op

    for o in embnum.ops():
        assert o.returns in RETURNS
        assert o.takes_out == (o.returns in ("array", "list", "tuple"))
        assert (o.returns == "none") == bool(o.mutates)
    with pytest.raises(ValueError, match="returns nothing"):
        op("jagged", returns="array", mutates=("x",))
    with pytest.raises(ValueError, match="in-place"):
        op("jagged", returns="none")
    with pytest.raises(ValueError, match="returns must be"):
        op("jagged", returns="arrays")


@pytest.mark.parametrize("op", embnum.ops(), ids=lambda o: o.name)
def test_plan_agrees_with_declared_returns(op):
    """The example's plan has the declared kind (the oracle path checks it on every call)."""
    import warnings

    from embnum._registry import _check_returns

    example = op.example_fn(np.random.default_rng(0), "small")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = op.declaration(**op.bind((), dict(example.args)))
    _check_returns(op, plan)


def test_stub_matches_the_registry():
    """src/embnum/__init__.pyi is what ``python -m embnum._stub`` writes for the ops registered
    now (regenerate it after changing a declaration)."""
    from embnum import _stub

    assert _stub.STUB.read_text() == _stub.render(), "stale stub: run python -m embnum._stub"
    assert _stub.STUB.with_name("py.typed").exists()


def test_stub_declares_every_public_name():
    """Every name ``embnum`` exports appears in the stub (IDE completion, mypy)."""
    from embnum import _stub

    text = _stub.STUB.read_text()
    for name in embnum.__all__:
        assert f"def {name}(" in text or f" as {name}\n" in text or f"{name}:" in text, name


@pytest.mark.parametrize("op", [o for o in embnum.ops() if o.takes_out], ids=lambda o: o.name)
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_rejected_out_is_not_written(op, backend):
    """``out=`` buffers the op could fill (right shapes and dtypes, garbage-filled), with the
    last one made unacceptable (read-only): the call raises before writing any of them."""
    import warnings

    example = op.example_fn(np.random.default_rng(0), "small")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = op.public(**example.args, backend="ref")
    results = [want] if op.returns == "array" else list(want)
    bufs = [None if r is None else np.frombuffer(b"\x5a" * r.nbytes, r.dtype).reshape(r.shape).copy() for r in results]
    last = max(i for i, b in enumerate(bufs) if b is not None)
    bufs[last].flags.writeable = False
    out = bufs[0] if op.returns == "array" else tuple(bufs) if op.returns == "tuple" else bufs
    with pytest.raises(ValueError, match="read-only"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op.public(**example.args, backend=backend, out=out)
    for b in bufs:
        assert b is None or b.tobytes() == b"\x5a" * b.nbytes, "a rejected call wrote into out"


def test_out_accepts_an_array_whose_flags_have_no_writeable():
    """CuPy's ``flags`` has no ``writeable`` (device memory is always writable): ``out=`` must not
    ask for it (a CuPy ``out=`` once raised AttributeError)."""
    from embnum import _validate

    class Flags:
        c_contiguous = True
        f_contiguous = False
        owndata = True

    class DeviceLike:  # what _backend.is_cupy recognises: a cupy module and the CUDA array interface
        __module__ = "cupy._core.core"
        __cuda_array_interface__ = {}
        shape, dtype, flags, size, itemsize = (3,), np.dtype(np.float32), Flags(), 3, 4

        class data:
            ptr = 4096

        strides = (4,)

    o = DeviceLike()
    assert _validate.writable(o)
    assert _validate.out_arrays(o, [((3,), np.float32)], {}, lambda a: True) == [o]


@pytest.mark.parametrize("op", embnum.ops(), ids=lambda o: o.name)
def test_bind_is_the_signatures_binding(op):
    """``Op.bind`` (every argument by name, in the signature's order, defaults filled in) gives
    what ``inspect.Signature.bind`` gives for the example call passed by keyword (as given and
    with every parameter named), positionally and mixed, and the same TypeError for an unknown
    (added, or in place of a known one), a repeated and a missing argument."""
    args = op.example_fn(np.random.default_rng(0), "small").args

    def exact(a, k):
        bound = op.signature.bind(*a, **k)
        bound.apply_defaults()
        return list(bound.arguments.items())

    full = exact((), args)
    positional = [v for (n, v), p in zip(full, op.signature.parameters.values()) if p.kind is not p.KEYWORD_ONLY]
    keyword = {n: v for n, v in full[len(positional) :]}
    head = tuple(positional[:1])
    every = [((), args), ((), dict(full)), (tuple(positional), keyword), (head, dict(full[len(head) :]))]
    for a, k in every:
        assert list(op.bind(a, k).items()) == exact(a, k)
    first, value = full[0]
    # an unknown name in place of a known one (as many keywords as parameters) too
    swapped = {**dict(full[1:]), "no_such_argument": 1}
    wrong = [((), {**args, "no_such_argument": 1}), ((), swapped), ((value,), {first: value})]
    if any(p.default is p.empty for p in op.signature.parameters.values()):
        wrong.append(((), {}))
    for a, k in wrong:
        with pytest.raises(TypeError) as got:
            op.bind(a, k)
        with pytest.raises(TypeError) as want:
            exact(a, k)
        assert str(got.value) == str(want.value)


def test_the_package_imports_every_op_and_helper_by_name():
    """``embnum/__init__.py`` names each op and helper (plain imports a reader and a type checker
    follow); a declared op missing there fails here."""
    import importlib

    declarations = importlib.import_module("embnum.ops")
    helpers = {h for f in declarations.FAMILIES for h in getattr(getattr(declarations, f), "HELPERS", ())}
    exported = {name for name in embnum.__all__ if name in vars(embnum)}
    assert exported == set(embnum.__all__), sorted(set(embnum.__all__) - exported)
    assert {o.name for o in embnum.ops()} | helpers <= exported
    assert all(vars(embnum)[o.name] is o for o in embnum.ops())


def test_public_function_keeps_signature():
    """The public op keeps its signature, docstring, name and identity across its first call."""
    x = np.arange(4, dtype=np.int32)
    fn = embnum.complete_cumsum
    before = (inspect.signature(fn), fn.__doc__, fn.__name__)
    fn(x)  # loads the cpu kernel
    assert embnum.complete_cumsum is fn
    assert (inspect.signature(fn), fn.__doc__, fn.__name__) == before
    np.testing.assert_array_equal(fn(x), [0, 0, 1, 3, 6])
