"""Test configuration shared by every family.

* Without a GPU, the CUDA kernels run under Numba's simulator: it must be
  switched on before anything imports ``numba.cuda``, so it is done here.
* Hypothesis profiles: ``ci`` (default), ``thorough`` (more examples), ``dev``
  (a quick local run), chosen
  with ``HYPOTHESIS_PROFILE``.
* ``--hostile-examples=N`` (or ``EMBNUM_HOSTILE_EXAMPLES``): hostile cases drawn per
  op by the adversarial tier (``test_hostile.py``); its counts are printed at the end.
* ``fast_backend``: every backend the oracle is compared with, as a
  :class:`harness.Flavor` (``cpu``, ``cuda`` simulated on NumPy arrays, and
  ``gpu``: the cuda backend on CuPy arrays, marked ``gpu``).
"""

import collections
import json
import os

# torch and Numba each start an OpenMP pool; spinning waiters of one starve the
# other on a 2-core machine, so idle threads sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from embnum._backend import gpu_present  # noqa: E402

if not gpu_present():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numba.core.config  # noqa: E402

if numba.core.config.ENABLE_CUDASIM != (os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")):
    raise RuntimeError(
        "numba was imported before tests/conftest.py could switch the CUDA simulator on; "
        "set NUMBA_ENABLE_CUDASIM=1 in the environment (and keep numba out of pytest's ini options)"
    )

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from harness import FLAVORS  # noqa: E402

_common = dict(
    deadline=None,  # the first example of each dtype compiles kernels
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=30, **_common)
settings.register_profile("thorough", max_examples=300, **_common)
settings.register_profile("dev", max_examples=8, **_common)  # quick local runs while developing
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=[pytest.param(f, id=f.name, marks=f.marks) for f in FLAVORS])
def fast_backend(request):
    flavor = request.param
    reason = flavor.unavailable()
    if reason:
        pytest.skip(reason)
    return flavor


HOSTILE_CI_EXAMPLES = 12  # per op: the short profile CI runs (about a minute on an idle 2-core machine)


def pytest_addoption(parser):
    parser.addoption(
        "--hostile-examples",
        type=int,
        default=None,
        help="hostile cases drawn per op by tests/test_hostile.py (default: EMBNUM_HOSTILE_EXAMPLES or "
        f"{HOSTILE_CI_EXAMPLES})",
    )


def pytest_configure(config):
    config.hostile_counts = collections.Counter()


@pytest.fixture(scope="session")
def hostile_examples(request):
    n = request.config.getoption("--hostile-examples")
    return n if n is not None else int(os.environ.get("EMBNUM_HOSTILE_EXAMPLES", HOSTILE_CI_EXAMPLES))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = getattr(config, "hostile_counts", None)
    if not counts:
        return
    terminalreporter.section("hostile input (tests/test_hostile.py)")
    for k in sorted(counts):
        terminalreporter.write_line(f"{k}: {counts[k]}")
    path = os.environ.get("EMBNUM_HOSTILE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(counts), f, indent=1, sort_keys=True)
