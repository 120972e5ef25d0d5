"""Test configuration shared by every family.

* Without a GPU, the CUDA kernels run under Numba's simulator: it must be
  switched on before anything imports ``numba.cuda``, so it is done here.
* Hypothesis profiles: ``ci`` (default), ``thorough`` (more examples), ``dev``
  (a quick local run), chosen
  with ``HYPOTHESIS_PROFILE``.
* Under the simulator, every kernel launch is recorded (kernel, argument
  types). ``tests/test_cuda_compile.py`` compiles the signatures of
  ``tests/cuda_signatures.txt`` for the GPU; any other signature this
  session launched is compiled at its end (a failure fails the session).
  ``EMBNUM_RECORD_SIGNATURES=1`` adds the new ones to the file instead.
* ``--hostile-examples=N`` (or ``EMBNUM_HOSTILE_EXAMPLES``): hostile cases drawn per
  op by the adversarial tier (``test_hostile.py``); its counts are printed at the end.
* Under pytest-xdist (the README's ``-n 2 --dist loadfile``) each worker sends its hostile
  counts and launch signatures to the controller, which reports and compiles them once.
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
# The tests run the kernels compiled from the sources under test and count cache hits; kernels a
# `warmup --prebuilt` left in the tree would be loaded instead (tests/test_prebuilt.py tests that).
os.environ.setdefault("EMBNUM_PREBUILT_DIR", "")

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


# The slow tiers: run by default (CI runs everything); `-m "not slow"` runs the fast tier alone
# (README). Keyed by file, or file::test function; notebooks (--nbmake) are slow too.
SLOW = {
    "test_gpu_report.py": "every op through the GPU report, in the simulator",
    "test_distributed.py": "process groups of several processes",
    "test_cuda_compile.py": "every kernel compiled for two GPUs (minutes on a cold cache)",
    "test_hostile.py::test_hostile": "drawn hostile cases for every op, each in a worker subprocess",
}


# Notebooks that need TorchRec on embnum's fbgemm_gpu stand-in: the tier without fbgemm_gpu runs
# them (.ci/run); where a real fbgemm_gpu is importable, install() refuses, so they are skipped
# with this reason.
NEEDS_STAND_IN = {"torchrec_dlrm.ipynb"}


def _stand_in_refused():
    """Why the stand-in cannot be installed here (a real fbgemm_gpu), or None."""
    try:
        from embnum import fbgemm_compat  # imports torch
    except ImportError as e:
        return f"needs torch and TorchRec on embnum's fbgemm_gpu stand-in: {e}"
    real = fbgemm_compat.status()["real_fbgemm_gpu"]
    return None if real is None else f"runs in the tier without fbgemm_gpu: a real fbgemm_gpu ({real}) is importable"


# The README's ``-n 2 --dist loadfile`` runs each file whole in one worker, and the run ends when
# the busier worker does. pytest-xdist hands out files with the most tests first, which leaves the
# long files of few tests (the simulated GPU tier, the process groups) for the end; instead files
# go out longest first (seconds of one file in a fresh-cache run of 28 November at load 7-12, after
# the simulator's switch interval: only their order matters), the rest after them in collection
# order, so the two workers finish together.
LONGEST_FIRST = {
    "test_ops.py": 740,
    "test_tbe.py": 510,
    "test_distributed.py": 330,
    "test_cuda_compile.py": 240,
    "test_fbgemm_compat.py": 160,
    "test_cuda_blocks.py": 70,
    "test_gpu_check.py": 60,
    "test_jit_cache.py": 50,
    "test_gpu_report.py": 45,
    "test_containers.py": 45,
    "test_fbgemm_aliases.py": 40,
    "test_check_agreement.py": 30,
    "test_embedding_bag_collection.py": 25,
    "test_tbe_update_plan.py": 20,
}


def _loadfile(config) -> bool:
    return getattr(config.option, "dist", "no") == "loadfile"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller tells each xdist worker (whose own ``dist`` option reads "no") to sort."""
    node.workerinput["longest_first"] = _loadfile(node.config)


def _longest_first(config, items):
    """Under xdist's ``--dist loadfile``: hand out files by :data:`LONGEST_FIRST`, not by count.
    Every worker collects and sorts alike (a stable sort: each file's tests keep their order); the
    controller keeps that order (:func:`pytest_configure`)."""
    if not getattr(config, "workerinput", {}).get("longest_first"):
        return
    items.sort(key=lambda item: -LONGEST_FIRST.get(item.path.name, 0))


def pytest_collection_modifyitems(config, items):
    _longest_first(config, items)
    refused = "unchecked"
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        if item.path.suffix == ".ipynb" or item.path.name in SLOW or f"{item.path.name}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)
        if item.path.name in NEEDS_STAND_IN:
            refused = _stand_in_refused() if refused == "unchecked" else refused
            if refused:
                item.add_marker(pytest.mark.skip(reason=refused))


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
    if _loadfile(config):
        config.option.loadscopereorder = False  # hand files out in the order of _longest_first
    import progress  # one line per finished file, the skips by reason (tests/progress.py)

    progress.pytest_configure(config)


@pytest.fixture(scope="session")
def hostile_examples(request):
    n = request.config.getoption("--hostile-examples")
    return n if n is not None else int(os.environ.get("EMBNUM_HOSTILE_EXAMPLES", HOSTILE_CI_EXAMPLES))


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under pytest-xdist (``-n 2``): a worker's hostile counts and launch signatures (sent in
    ``workeroutput`` by :func:`pytest_sessionfinish`) join the controller's, which reports the
    counts and compiles (or records) the signatures once for the whole run."""
    out = getattr(node, "workeroutput", None) or {}
    node.config.hostile_counts.update(out.get("hostile_counts", {}))
    _seen.update((k, s) for k, s in out.get("launch_signatures", ()))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = getattr(config, "hostile_counts", None)
    if not counts:
        return
    prefix = "surfaces: "
    ops = {k: v for k, v in counts.items() if not k.startswith(prefix)}
    surfaces = {k[len(prefix) :]: v for k, v in counts.items() if k.startswith(prefix)}
    if ops:
        terminalreporter.section("hostile input (tests/test_hostile.py)")
        for line in hostile_summary(ops):
            terminalreporter.write_line(line)
    if surfaces:
        terminalreporter.section("hostile input beyond the ops (tests/test_hostile_surfaces.py)")
        for line in surfaces_summary(surfaces):
            terminalreporter.write_line(line)
    path = os.environ.get("EMBNUM_HOSTILE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(dict(counts), f, indent=1, sort_keys=True)


def hostile_summary(counts) -> list[str]:
    """The adversarial tier's counts as sentences: the verdict first, then what the calls did.
    An error is the expected answer to hostile input, so it is counted beside the results, not
    beside the crashes."""
    c = collections.Counter(counts)
    bad = c["crashes"] + c["hangs"] + c["failed"]
    named, oom = c["errors naming the mutated argument"], c["of them out of memory (AllocationError)"]
    return [
        f"{'FAILED' if bad else 'passed'}: {c['cases']} cases, {c['crashes']} crashes, {c['hangs']} hangs, "
        f"{c['failed']} cases failing their check ({c['not applicable']} mutations did not apply)",
        f"{c['calls']} backend calls: {c['errors']} answered with a clean error (the expected answer to "
        f"bad input), {c['results']} with a result, {c['not expressible']} not expressible as torch tensors",
        f"cases where every backend raised a clean error: {c['clean errors']} ({named} naming the mutated "
        f"argument, {oom} out of memory); where every result equalled ref's: {c['equal results']}",
    ]


def surfaces_summary(counts) -> list[str]:
    """The surface tier's counts (``tests/test_hostile_surfaces.py``) as sentences."""
    c = collections.Counter(counts)
    bad = c["crashes"] + c["hangs"] + c["failed"] + c["wrong results"]
    named = c["errors naming the mutated argument"]
    return [
        f"{'FAILED' if bad else 'passed'}: {c['cases']} cases, {c['crashes']} crashes, {c['hangs']} hangs, "
        f"{c['wrong results']} wrong results, {c['failed']} cases failing their check "
        f"({c['not applicable']} mutations did not apply)",
        f"{c['clean errors']} cases answered with a clean error on every kind ({named} naming the mutated argument),"
        f" {c['equal results']} with equal results; {c['judged by the model']} judged "
        f"by the plain-Python model, {c['beyond float32 (not compared)']} beyond float32 (not compared)",
        f"{c['calls']} calls, {c['not expressible']} not expressible on their kind (e.g. object arrays as tensors)",
    ]


# -- launch signatures (see embnum.cuda._ptx) -------------------------------------------------
SIGNATURES = os.path.join(os.path.dirname(__file__), "cuda_signatures.txt")
_seen: set = set()


def _record_launches():
    from numba.cuda.simulator import kernel as sim

    from embnum.cuda import _ptx

    names: dict = {}
    call = sim.FakeCUDAKernel.__call__

    def recording_call(self, *args):
        if not self._device and not sim._kernel_context:
            if not names:
                names.update({id(k): n for n, k in _ptx.kernels().items()})
            name = names.get(id(self))
            if name is not None:
                _seen.add((name, _ptx.signature_of(args)))
        return call(self, *args)

    sim.FakeCUDAKernel.__call__ = recording_call


if numba.core.config.ENABLE_CUDASIM:
    _record_launches()


def pytest_sessionfinish(session, exitstatus):
    """Launch signatures missing from tests/cuda_signatures.txt (a drawn input can reach a new
    dtype combination) are compiled here for sm_90 and sm_80, so every signature this run
    launched was compiled; a failure fails the session. With EMBNUM_RECORD_SIGNATURES=1 they are
    added to the file instead. An xdist worker hands its signatures (and hostile counts) to the
    controller instead (see :func:`pytest_testnodedown`)."""
    if _is_xdist_worker(session.config):
        session.config.workeroutput["hostile_counts"] = dict(session.config.hostile_counts)
        session.config.workeroutput["launch_signatures"] = sorted(_seen)
        return
    if not _seen:
        return
    from embnum.cuda import _ptx

    declared = set(_ptx.read_signatures(SIGNATURES)) if os.path.exists(SIGNATURES) else set()
    new = sorted(_seen - declared)
    if not new:
        return
    if os.environ.get("EMBNUM_RECORD_SIGNATURES"):
        with open(SIGNATURES, "w") as f:
            f.write(_ptx.format_signatures(declared | _seen))
        return
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = "\n".join(f"  {k}({s})" for k, s in new)
    try:
        import nvidia.cuda_nvcc  # noqa: F401
    except ImportError:
        report.write_line(f"launch signatures not compiled for the GPU (no nvidia-cuda-nvcc-cu12):\n{lines}")
        return
    failed = [r for r in _ptx.compile_all(new) if r["error"]]
    report.write_line(
        f"compiled {len(new)} launch signature(s) missing from tests/cuda_signatures.txt for sm_90/sm_80 "
        f"({len(failed)} failed):\n{lines}\n(EMBNUM_RECORD_SIGNATURES=1 adds them to the file)",
        red=bool(failed),
    )
    for r in failed:
        report.write_line(f"FAILED {r['kernel']}({r['signature']}) sm_{r['cc'][0]}{r['cc'][1]}: {r['error']}", red=True)
    if failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
