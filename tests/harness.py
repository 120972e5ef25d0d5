"""What every family's tests share: backend flavors, oracle comparison, bad-input checks.

A family test module gives, per op, a Hypothesis strategy that draws the
op's keyword arguments on the host (NumPy); :func:`matches_ref` runs the op
on the oracle and on one fast backend and compares them with the op's own
check (``embnum.get_op(name).check_fn``), also through ``out=``, and checks
that no input changed and that the fast backend warns as the oracle warns (the TBE bounds
check's repair warning, by design in its ``warning`` mode).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import embnum
from embnum._backend import BACKENDS, cuda_simulated, gpu_present, is_array


def _map_arrays(fn, value):
    if is_array(value):
        return fn(value)
    if isinstance(value, list):
        return [_map_arrays(fn, v) for v in value]
    if isinstance(value, tuple):
        return tuple(_map_arrays(fn, v) for v in value)
    return value


def to_host(value):
    return _map_arrays(lambda a: a if isinstance(a, np.ndarray) else a.get(), value)


@dataclasses.dataclass(frozen=True)
class Flavor:
    """One way of running a fast backend: its name, the arrays it takes."""

    name: str
    backend: str
    device_arrays: bool  # CuPy arrays instead of NumPy
    examples: float  # share of the profile's max_examples (the simulator is slow)
    marks: tuple = ()

    def unavailable(self) -> str | None:
        if self.device_arrays:
            if not gpu_present():
                return "no GPU on this machine"
            try:
                import cupy  # noqa: F401
            except ImportError:
                return "CuPy is not installed"
        if self.backend == "cuda" and not self.device_arrays and not cuda_simulated():
            return "the CUDA simulator is off (a GPU is present: see the gpu flavor)"
        if not BACKENDS[self.backend].available():
            return f"backend {self.backend!r} is not available"
        return None

    def to_device(self, value):
        if not self.device_arrays:
            return value
        import cupy

        return _map_arrays(cupy.asarray, value)

    def settings(self):
        n = max(3, int(settings.default.max_examples * self.examples))
        return settings(
            max_examples=n,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )


FLAVORS = (
    Flavor("cpu", "cpu", False, 1.0),
    Flavor("cuda-sim", "cuda", False, float(os.environ.get("EMBNUM_SIM_SHARE", "0.3"))),
    Flavor("gpu", "cuda", True, 1.0, (pytest.mark.gpu,)),
)


COMPILE_TIER = "pip install -r requirements/compile.txt (or the [compile] extra)"


def compile_tier_missing(what: str) -> None:
    """A compile-only test's NVIDIA wheel is absent: skip the calling module with ``what`` and how
    to install it, or fail it where ``EMBNUM_REQUIRE_COMPILE=1`` (CI installs the tier and sets it,
    so a broken install cannot pass as a skip)."""
    reason = f"{what}; {COMPILE_TIER}"
    if os.environ.get("EMBNUM_REQUIRE_COMPILE", "0") not in ("", "0"):
        pytest.fail(f"EMBNUM_REQUIRE_COMPILE is set but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def nvcc_missing() -> str | None:
    """Why NVVM/ptxas are not here (``None`` when the nvidia-cuda-nvcc-cu12 wheel is installed)."""
    try:
        import nvidia.cuda_nvcc  # noqa: F401
    except ImportError:
        return "nvidia-cuda-nvcc-cu12 (NVVM, libdevice and ptxas) is not installed"
    return None


def snapshot(args: dict) -> dict:
    return copy.deepcopy(to_host(args))


def assert_unchanged(before: dict, after: dict):
    for k, v in before.items():
        now = to_host(after[k])
        for i, (a, b) in enumerate(zip(_leaves(v), _leaves(now))):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"input {k}[{i}] changed"


def _leaves(value):
    if is_array(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return []


def _garbage_like(result, flavor):
    """Arrays shaped like ``result`` full of 0xFF bytes (NaN for floats) on the flavor's device."""

    def one(a):
        if a is None:
            return None
        g = np.frombuffer(b"\xff" * a.nbytes, dtype=a.dtype).reshape(a.shape).copy()
        return flavor.to_device(g)

    if isinstance(result, (list, tuple)):
        return type(result)(one(a) for a in result)
    return one(result)


def run_op(name: str, args: dict, flavor: Flavor, **extra):
    op = embnum.get_op(name)
    return to_host(op.public(**flavor.to_device(args), backend=flavor.backend, **extra))


REPAIRED = "TBE bounds check repaired"  # the start of the bounds check's warning (mode "warning")


def _warned(call):
    """``(call(), the messages of the TBE bounds-repair warnings it emitted)``; any other warning is
    passed on to the test's filters (a green run has none)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    repaired = []
    for w in caught:
        if issubclass(w.category, RuntimeWarning) and str(w.message).startswith(REPAIRED):
            repaired.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result, repaired


def _same_warnings(name, flavor, got, want):
    """The fast backend repairs (and says so) where the oracle does; on device arrays the repair
    is counted on the device instead, without a host warning."""
    assert got == ([] if flavor.device_arrays else want), f"{name} on {flavor.name} warned {got}, ref {want}"


def check_matches_ref(name: str, args: dict, flavor: Flavor):
    """One drawn input: oracle vs fast backend (plain and ``out=``), inputs unchanged, the same
    repair warnings."""
    op = embnum.get_op(name)
    if op.returns == "none":  # in place: compare what it wrote
        return _check_in_place_matches_ref(op, args, flavor)
    before = snapshot(args)
    want, ref_warned = _warned(lambda: op.public(**args, backend="ref"))
    assert_unchanged(before, args)
    dev_args = flavor.to_device(args)
    got, warned = _warned(lambda: to_host(op.public(**dev_args, backend=flavor.backend)))
    err, ok = op.check_fn(got, want, args)
    assert ok, f"{name} on {flavor.name} differs from ref (max abs error {err})\ngot  {got}\nwant {want}"
    _same_warnings(name, flavor, warned, ref_warned)
    assert_unchanged(before, dev_args)
    if op.takes_out:
        out = _garbage_like(want, flavor)
        returned, warned = _warned(lambda: op.public(**dev_args, backend=flavor.backend, out=out))
        assert returned is out
        err, ok = op.check_fn(to_host(out), want, args)
        assert ok, f"{name} on {flavor.name} with out= differs from ref (max abs error {err})"
        _same_warnings(name, flavor, warned, ref_warned)
    return want


def _check_in_place_matches_ref(op, args: dict, flavor: Flavor):
    """An in-place op (``op.mutates``): ref and the fast backend each run on their own
    copy of the arrays; compare what they wrote (and the repair warnings); every other input is
    unchanged."""
    before = snapshot(args)
    ref_args = snapshot(args)
    result, ref_warned = _warned(lambda: op.public(**ref_args, backend="ref"))
    assert result is None
    dev_args = flavor.to_device(snapshot(args))
    result, warned = _warned(lambda: op.public(**dev_args, backend=flavor.backend))
    assert result is None
    _same_warnings(op.name, flavor, warned, ref_warned)
    written = [k for k in op.mutates if args.get(k) is not None]
    want = [ref_args[k] for k in written]
    got = [to_host(dev_args[k]) for k in written]
    err, ok = op.check_fn(got, want, args)
    assert ok, f"{op.name} on {flavor.name} wrote other values than ref (max abs error {err})\ngot  {got}\nwant {want}"
    kept = {k: v for k, v in before.items() if k not in op.mutates}
    assert_unchanged(kept, ref_args)
    assert_unchanged(kept, dev_args)
    assert_unchanged(before, args)
    return want


def matches_ref(name: str, strategy, flavor: Flavor):
    """Run :func:`check_matches_ref` on inputs drawn from ``strategy``."""

    @flavor.settings()
    @given(args=strategy)
    def run(args):
        check_matches_ref(name, args, flavor)

    run()


def check_worked(got, want, tol: dict | None = None, label: str = ""):
    """A worked example's result: ``got`` (host) equals ``want``. For a list/tuple result ``want``
    lists one entry per result (None for a None slot); a NumPy ``want`` fixes the dtype too, nested
    lists are read in ``got``'s dtype; float results are compared with ``tol`` (``rtol``/``atol``
    for the spec's printed digits) where given, else exactly."""
    if isinstance(got, (list, tuple)) and not isinstance(want, np.ndarray):
        assert len(got) == len(want), f"{label}: {len(got)} results, the example gives {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            check_worked(g, w, tol, f"{label}[{i}]")
        return
    if want is None or not is_array(got):
        assert got == want, f"{label}: {got!r} != {want!r}"
        return
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{label}: dtype {got.dtype}, the example's {want.dtype}"
    if tol and got.dtype.kind == "f":
        np.testing.assert_allclose(got, np.array(want, dtype=np.float64), err_msg=label, **tol)
    else:
        np.testing.assert_array_equal(got, np.array(want, dtype=got.dtype), err_msg=label)


def backends_of(flavor: Flavor | None = None):
    """Backend names a bad-input test runs on: ref plus the flavor's."""
    return ["ref"] + ([flavor.backend] if flavor else [])


def check_rejects(name: str, args: dict, exc: type, words: tuple[str, ...], flavor: Flavor):
    """The op raises ``exc`` naming ``words`` on ref and on ``flavor`` without changing an
    input. (That a rejected call writes nothing into ``out=`` is checked once for every op
    in ``test_registry.test_rejected_out_is_not_written``, with buffers the op could fill.)"""
    op = embnum.get_op(name)
    for backend in ("ref", flavor.backend):
        f = flavor if backend != "ref" else Flavor("ref", "ref", False, 1.0)
        dev_args = f.to_device(args)
        before = snapshot(dev_args)
        with pytest.raises(exc) as info:
            op.public(**dev_args, backend=backend)
        for w in words:
            assert w in str(info.value), f"{exc.__name__} message {str(info.value)!r} does not name {w!r}"
        assert_unchanged(before, dev_args)


# -- the optional differential tier: fbgemm_gpu (``pytest -m fbgemm``) ----------------------
def fbgemm():
    """``torch.ops.fbgemm``; skips the calling test where torch or fbgemm_gpu is not importable."""
    torch = pytest.importorskip("torch")
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception:  # noqa: BLE001
        pytest.skip("fbgemm_gpu is not importable")
    return torch.ops.fbgemm


def tensor(a):
    """A torch tensor copy of a host array with ordinary strides (NumPy may give empty arrays 0
    strides); None stays None."""
    import torch

    return None if a is None else torch.tensor(np.ascontiguousarray(a))


@dataclasses.dataclass(frozen=True)
class Peer:
    """One row of a family's ``FBGEMM`` table: embnum's op ``op`` against its fbgemm_gpu 1.8.0 peer.

    ``call(fb, args)`` runs the peer (``fb`` is ``torch.ops.fbgemm``) on the op's keyword
    arguments ``args`` (host NumPy, converted by ``call`` to what fbgemm takes) and returns
    what the op returns (tensors, lists or tuples of them, None slots). ``adapt(args)`` maps a
    drawn case into fbgemm's domain for both sides, or returns None where fbgemm cannot take
    it (the case is rejected with ``assume``; the adapter says why). ``same``: ``"bits"``
    (dtype, shape and bytes equal), ``"values"`` (``assert_array_equal``: -0.0 == 0.0, NaN ==
    NaN), ``"tolerance"`` (the op's own ``check_fn``) or a function ``(got, want, args) -> bool``.
    ``strategy`` defaults to the family's ``STRATEGIES`` entry for ``op``.
    """

    op: str
    call: object
    adapt: object = None
    same: object = "bits"
    strategy: object = None
    examples: int = 40
    case: str = ""  # id suffix where an op has several peers


def _torch_to_numpy(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    if isinstance(value, (list, tuple)):
        return [_torch_to_numpy(v) for v in value]
    return value


def _same_leaf(got, want, same: str, label: str):
    if same == "bits":
        got, want = np.asarray(got), np.asarray(want)
        assert (got.dtype, got.shape) == (want.dtype, want.shape), (
            f"{label}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
        )
        assert got.tobytes() == want.tobytes(), f"{label}: other bits\ngot  {got}\nwant {want}"
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


def check_fbgemm(peer: Peer, args: dict, backends=("ref", "cpu")):
    """fbgemm's peer and embnum's op (on each of ``backends``) agree on ``args`` as ``peer.same`` says."""
    op = embnum.get_op(peer.op)
    want = _torch_to_numpy(peer.call(fbgemm(), args))
    for backend in backends:
        got = op.public(**args, backend=backend)
        label = f"{peer.op} on {backend} vs fbgemm"
        if peer.same == "tolerance":
            err, ok = op.check_fn(got, want, args)
            assert ok, f"{label}: max abs error {err}"
        elif callable(peer.same):
            assert peer.same(got, want, args), f"{label}\ngot  {got}\nwant {want}"
        elif isinstance(got, (list, tuple)):
            assert len(got) == len(want), f"{label}: {len(got)} results, fbgemm {len(want)}"
            for i, (g, w) in enumerate(zip(got, want)):
                assert (g is None) == (w is None), f"{label}: result {i} is None on one side only"
                if g is not None:
                    _same_leaf(g, w, peer.same, f"{label}, result {i}")
        else:
            _same_leaf(got, want, peer.same, label)


# -- small builders the family tables share -------------------------------------------------
def pme_args(tensors, permutes, in_shapes, out_shapes, lengths, *, backward=False) -> dict:
    """``permute_multi_embedding``'s keyword arguments (``tensors`` the pooled embeddings,
    ``lengths`` the output widths), or with ``backward`` its backward's (``tensors`` the output
    gradients, ``lengths`` the input widths)."""
    first, last = ("grad_outputs", "in_lengths") if backward else ("pooled_embs", "out_lengths")
    return {first: tensors, "permutes": permutes, "in_shapes": in_shapes, "out_shapes": out_shapes, last: lengths}
