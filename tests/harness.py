"""What every family's tests share: backend flavors, oracle comparison, bad-input checks.

A family test module gives, per op, a Hypothesis strategy that draws the
op's keyword arguments on the host (NumPy); :func:`matches_ref` runs the op
on the oracle and on one fast backend and compares them with the op's own
check (``embnum.get_op(name).check_fn``), also through ``out=``, and checks
that no input changed.
"""

from __future__ import annotations

import copy
import dataclasses
import os

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


def check_matches_ref(name: str, args: dict, flavor: Flavor):
    """One drawn input: oracle vs fast backend (plain and ``out=``), inputs unchanged."""
    op = embnum.get_op(name)
    if op.returns == "none":  # in place: compare what it wrote
        return _check_in_place_matches_ref(op, args, flavor)
    before = snapshot(args)
    want = op.public(**args, backend="ref")
    assert_unchanged(before, args)
    dev_args = flavor.to_device(args)
    got = to_host(op.public(**dev_args, backend=flavor.backend))
    err, ok = op.check_fn(got, want, args)
    assert ok, f"{name} on {flavor.name} differs from ref (max abs error {err})\ngot  {got}\nwant {want}"
    assert_unchanged(before, dev_args)
    if op.takes_out:
        out = _garbage_like(want, flavor)
        returned = op.public(**dev_args, backend=flavor.backend, out=out)
        assert returned is out
        err, ok = op.check_fn(to_host(out), want, args)
        assert ok, f"{name} on {flavor.name} with out= differs from ref (max abs error {err})"
    return want


def _check_in_place_matches_ref(op, args: dict, flavor: Flavor):
    """An in-place op (``op.mutates``): ref and the fast backend each run on their own
    copy of the arrays; compare what they wrote; every other input is unchanged."""
    before = snapshot(args)
    ref_args = snapshot(args)
    assert op.public(**ref_args, backend="ref") is None
    dev_args = flavor.to_device(snapshot(args))
    assert op.public(**dev_args, backend=flavor.backend) is None
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
