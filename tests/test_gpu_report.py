"""The one-command GPU report (``benchmarks/gpu_report.py``) runs end to end: here in the simulator
on tiny inputs (its times mean nothing there), on a GPU machine unchanged at the benchmark sizes."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import embnum

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_report.py"


def test_gpu_report_runs_every_op_in_the_simulator(tmp_path):
    out = tmp_path / "report.md"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run(
        [sys.executable, str(REPORT), "--tiny", "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = out.read_text()
    import embnum

    for op in embnum.ops():
        assert f"| {op.name} |" in text, op.name
    assert "headline step" in text and "ERROR" not in text


class DeviceOnly:
    """An array that, like CuPy's, refuses implicit conversion to NumPy: it offers shape, dtype,
    sizes, indexing, ``int()`` of one element and DLPack, and ``np.asarray`` raises."""

    def __init__(self, a):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)

    def __len__(self):
        return len(self._a)

    def __getitem__(self, key):
        return DeviceOnly(self._a[key])

    def __int__(self):
        return int(self._a)

    def __dlpack__(self, **kwargs):
        return np.ascontiguousarray(self._a).__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


def _unwrap(v):
    if isinstance(v, DeviceOnly):
        return v._a
    if isinstance(v, list):
        return [_unwrap(x) for x in v]
    return v


def test_the_tbe_rows_never_convert_device_arrays_to_numpy(monkeypatch, capsys):
    """On a GPU the report's arrays are CuPy's, which refuse ``np.asarray``: everything the report
    does besides calling the op (bytes moved, peers) must work on such a type. Here the arrays are
    wrapped in one, and only the op call itself (the backend's business) unwraps them."""
    import numba

    if not numba.core.config.ENABLE_CUDASIM or not embnum._backend.BACKENDS["cuda"].available():
        pytest.skip("runs the report's host code with the cuda backend in Numba's simulator")
    monkeypatch.syspath_prepend(str(REPORT.parent))
    gpu_report = importlib.import_module("gpu_report")
    monkeypatch.setattr(gpu_report, "SIMULATED", True)
    monkeypatch.setattr(
        gpu_report,
        "to_device",
        lambda v: (
            DeviceOnly(v) if isinstance(v, np.ndarray) else [DeviceOnly(x) for x in v] if isinstance(v, list) else v
        ),
    )
    real_launch = gpu_report.launch
    monkeypatch.setattr(
        gpu_report, "launch", lambda fn, args: real_launch(fn, {k: _unwrap(v) for k, v in args.items()})
    )
    with pytest.raises(TypeError):
        np.asarray(DeviceOnly(np.zeros(2)))
    argv = ["--tiny", "--repeats", "1", "--op", "tbe_forward", "--op", "tbe_backward_update"]
    report = gpu_report.run_report(gpu_report.parse(argv))
    rows = [line for line in report.splitlines() if line.startswith("| tbe_")]
    assert any("headline step" in r for r in rows) and any("| headline T=" in r for r in rows), report
    assert "ERROR" not in report, report
