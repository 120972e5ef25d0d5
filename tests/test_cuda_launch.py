"""``embnum.cuda._common.launch`` on a GPU keeps each configured launcher (``kernel[grid, block,
stream]``) and reuses it. Checked without a GPU on a stand-in kernel, with the launch's GPU branch
taken (the simulator's branch subscripts the kernel itself each call); and the simulator's branch
keeps the simulator's float warnings out of a run."""

import warnings

import numpy as np
import pytest

from embnum.cuda import _common


class _Kernel:
    """Records each configuration (subscript) and each launch of a configured launcher."""

    def __init__(self):
        self.configured, self.launched = [], []

    def __getitem__(self, config):
        self.configured.append(config)
        return lambda *args: self.launched.append((config, args))


def test_a_repeated_launch_reuses_its_configured_launcher(monkeypatch):
    monkeypatch.setattr(_common, "SIMULATED", False)
    streams = iter(["s1", "s1", "s1", "s2"])
    monkeypatch.setattr(_common, "_current_stream", lambda: next(streams))
    monkeypatch.setattr(_common, "_CONFIGURED", {})
    k = _Kernel()
    _common.launch(k, 4, 256, 1, "a")
    _common.launch(k, 4, 256, 2, "b")  # same grid, block and stream: configured once
    _common.launch(k, 8, 256, 3)  # another grid
    _common.launch(k, 4, 256, 4)  # another stream
    assert k.configured == [(4, 256, "s1"), (8, 256, "s1"), (4, 256, "s2")]
    assert k.launched == [
        ((4, 256, "s1"), (1, "a")),
        ((4, 256, "s1"), (2, "b")),
        ((8, 256, "s1"), (3,)),
        ((4, 256, "s2"), (4,)),
    ]


def test_the_kept_launchers_are_bounded(monkeypatch):
    monkeypatch.setattr(_common, "SIMULATED", False)
    monkeypatch.setattr(_common, "_current_stream", lambda: "s")
    monkeypatch.setattr(_common, "_CONFIGURED", {})
    monkeypatch.setattr(_common, "_MAX_CONFIGURED", 3)
    k = _Kernel()
    for n in range(5):
        _common.launch(k, n + 1, 32)
    assert len(_common._CONFIGURED) <= 3
    assert [c[0] for c in k.configured] == [1, 2, 3, 4, 5]
    assert len(k.launched) == 5


@pytest.mark.skipif(not _common.SIMULATED, reason="the simulator's own warnings (NUMBA_ENABLE_CUDASIM=1)")
def test_a_simulated_store_beyond_float16_is_inf_without_a_warning():
    from numba import cuda

    @cuda.jit
    def store(out, x):
        out[0] = x[0]

    out = np.zeros(1, np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _common.launch(store, 1, 1, out, np.array([1e6], np.float32))
    assert np.isposinf(out[0])


@pytest.mark.parametrize("tpb, interval", [("8", 1e-4), ("256", 1e-3)])
def test_the_first_simulated_launch_makes_python_threads_take_turns_sooner(tpb, interval):
    """A simulated thread released from a barrier waits for the GIL until the launcher's polling
    loop ends its switch interval: the first simulated launch of a process shortens it (once: the
    caller's own later setting stands)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; import numpy as np; import embnum; "
        "before = sys.getswitchinterval(); "
        "embnum.complete_cumsum(np.arange(5), backend='cuda'); first = sys.getswitchinterval(); "
        "sys.setswitchinterval(0.002); embnum.complete_cumsum(np.arange(5), backend='cuda'); "
        "print(before, first, sys.getswitchinterval())"
    )
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", EMBNUM_SIM_TPB=tpb)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    before, first, after = map(float, run.stdout.split())
    assert before == 0.005 and first == pytest.approx(interval) and after == pytest.approx(0.002)
