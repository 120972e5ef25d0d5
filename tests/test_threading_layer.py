"""Numba's threads run on TBB where embnum's dependencies install it (x86-64): docs/using.md,
"A busy machine"."""

import os
import platform
import subprocess
import sys

import pytest

_PROBE = "import numpy, numba, embnum; embnum.complete_cumsum(numpy.arange(3)); print(numba.threading_layer())"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the tbb wheel is a dependency on x86-64 only")
def test_the_cpu_backend_runs_on_tbb_without_any_setting():
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "LD_LIBRARY_PATH")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "tbb", out.stdout


def test_an_explicit_layer_still_wins():
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "workqueue", out.stdout
