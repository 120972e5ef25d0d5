"""The TBE bridge's host path (the NumPy op on views, no dispatcher): ops with argument
codecs and the in-place ``tbe_backward_update`` run their common case (plain CPU tensors needing
no gradient, nothing watching the dispatcher) without the dispatcher, with the same results,
errors and version-counter bumps as the dispatcher path; anything else still goes through
``torch.ops.embnum``. The optimizer codec's caches return exactly what encode/decode return."""

import ast
import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import embnum

torch = pytest.importorskip("torch")
tb = pytest.importorskip("embnum.torch_bridge")
from embnum.torch_bridge import tbe as tb_tbe  # noqa: E402

TBE_OPS = [
    "tbe_forward",
    "tbe_backward",
    "tbe_backward_sparse",
    "tbe_grad_per_sample_weights",
    "tbe_backward_update",
    "tbe_forward_quantized",
]


def _args(name):
    """The op's small example as CPU tensors (copies), the optimizer left a TBEOptimizer."""
    op = embnum.get_op(name)
    args = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)
    return {k: torch.tensor(a) if isinstance(a, np.ndarray) else a for k, a in args.items()}


def _through_dispatcher(name, args):
    spec = tb.BRIDGES[name]
    schema = spec.encode(args)
    names = list(embnum.get_op(name).signature.parameters)
    return getattr(torch.ops.embnum, name).default(*[schema[n] for n in names])


def _copy(args):
    return {k: a.clone() if isinstance(a, torch.Tensor) else a for k, a in args.items()}


class _Dispatched(Exception):
    pass


@pytest.fixture
def no_dispatcher(monkeypatch):
    """Make the user functions' dispatcher fallback raise: a call that returns took the host path."""

    def patch(name):
        fn = getattr(tb, name)

        def refuse(*a, **k):
            raise _Dispatched(name)

        monkeypatch.setattr(fn, "torch_op", refuse)
        return fn

    return patch


@pytest.mark.parametrize("name", TBE_OPS)
def test_direct_path_is_taken_and_equals_the_dispatcher(name, no_dispatcher):
    args = _args(name)
    a, b = _copy(args), _copy(args)
    mutates = embnum.get_op(name).mutates
    before = {k: a[k]._version for k in mutates if a.get(k) is not None}
    got = no_dispatcher(name)(**a)  # would raise _Dispatched through the dispatcher
    want = _through_dispatcher(name, b)
    if mutates:
        assert got is None and want is None
        for k in before:
            assert torch.equal(a[k], b[k]), k
            assert a[k]._version > before[k], k  # bumped like the custom op's ADInplaceOrView kernel
    else:
        got = list(got) if isinstance(got, tuple) else [got]
        want = list(want) if isinstance(want, tuple) else [want]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("name", TBE_OPS)
def test_same_error_both_ways_and_nothing_written(name, no_dispatcher):
    args = _args(name)
    args["indices"] = args["indices"].clone()
    args["indices"][0] = 10**6  # out of every table
    a, b = _copy(args), _copy(args)
    with pytest.raises((ValueError, IndexError)) as direct:
        no_dispatcher(name)(**a)
    with pytest.raises((ValueError, IndexError)) as dispatched:
        _through_dispatcher(name, b)
    assert type(direct.value) is type(dispatched.value) and str(direct.value) == str(dispatched.value)
    for k in embnum.get_op(name).mutates:
        if args.get(k) is not None:
            assert torch.equal(a[k], args[k])


def test_update_takes_the_dispatcher_for_what_the_direct_path_cannot_take(no_dispatcher):
    fn = no_dispatcher("tbe_backward_update")
    args = _args("tbe_backward_update")
    with torch.inference_mode():
        inference_weights = args["weights"].clone()
    cases = [
        {"weights": inference_weights},  # the dispatcher's rule for inference tensors
        {"weights": args["weights"].clone().requires_grad_()},  # autograd
        {"grad_output": args["grad_output"].to(torch.bfloat16)},  # the bridge's dtype rules
    ]
    for change in cases:
        with pytest.raises(_Dispatched):
            fn(**{**_copy(args), **change})
    with torch.autograd.profiler.profile(), pytest.raises(_Dispatched):  # watched
        fn(**_copy(args))


def test_update_with_an_inference_tensor_behaves_as_the_dispatcher():
    args = _args("tbe_backward_update")
    with torch.inference_mode():
        args["weights"] = args["weights"].clone()
    a, b = _copy(args), _copy(args)
    with torch.inference_mode():
        a["weights"], b["weights"] = a["weights"].clone(), b["weights"].clone()
    outcomes = []
    for call in (lambda: tb.tbe_backward_update(**a), lambda: _through_dispatcher("tbe_backward_update", b)):
        try:
            outcomes.append(call())
        except RuntimeError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
    assert torch.equal(a["weights"], b["weights"])


FLOATS = st.one_of(st.sampled_from([0.0, 1, 1.0, 0, 0.5, 1e-3]), st.floats(0, 0.5, allow_nan=False))


@given(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"]), FLOATS, FLOATS)
def test_optimizer_codec_caches_are_exact(kind, lr, eps):
    o = embnum.TBEOptimizer(kind, lr, eps=eps)
    s = tb_tbe._encode_optimizer(o)
    assert s == o.encode() and tb_tbe._encode_optimizer(o) == s
    twin = embnum.TBEOptimizer(kind, float(lr), eps=float(eps))  # equal, maybe other field types
    assert tb_tbe._encode_optimizer(twin) == twin.encode()
    assert s == repr(dataclasses.astuple(o)) and twin.encode() == repr(dataclasses.astuple(twin))  # uncached
    for text in (s, twin.encode()):
        got, want = embnum.TBEOptimizer.decode(text), embnum.TBEOptimizer(*ast.literal_eval(text))  # uncached
        assert got == want and [type(x) for x in dataclasses.astuple(got)] == [
            type(x) for x in dataclasses.astuple(want)
        ]
    with pytest.raises(ValueError, match="encoded"):
        embnum.TBEOptimizer.decode("not an optimizer")
    with pytest.raises(TypeError, match="TBEOptimizer"):
        tb_tbe._encode_optimizer(3)
