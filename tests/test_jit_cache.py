"""The kernels' on-disk cache (``embnum._jit``) with several processes at once, and its staleness rule.

The race: processes that compile different signatures of one kernel on a cold cache each
read the kernel's index, pick a data file and write the index back. Left to chance the
window is a millisecond wide, so the child processes here force it: each waits at a gate
until every child has compiled the same kernel and reached its save, then every index read
is followed by a pause (longer for a higher rank) before the index is written, and every
data write by a pause (longer for a lower rank). On Numba's own index that order makes
every child read the empty index, pick the same data file, the highest rank write the index
last and the lowest rank write the data last: the index then names the lowest rank's
machine code for the highest rank's signature. A fresh process then loads every signature
from the cache and compares it with the oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import embnum

N_PROCS = 4
# per child: the dtypes it compiles (a child's set differs from its neighbours')
CUMSUM_DTYPES = ["int32", "int64", "int32", "int64"]
SEGMENT_DTYPES = ["float32", "float64", "int32", "int64"]
GATED = ("_inclusive", "_segment_sum_serial")  # the kernels those two ops compile on small inputs

FORCE_RACE = textwrap.dedent(
    """
    import os, sys, time
    import {module} as caching

    rank, n, gate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    gated = set(sys.argv[4].split(","))

    _load_index, _save_data = caching.IndexDataCacheFile._load_index, caching.IndexDataCacheFile._save_data

    def load_index(self):
        found = _load_index(self)
        time.sleep(0.1 + 0.05 * rank)  # index writes in rank order
        return found

    def save_data(self, name, data):
        time.sleep(0.1 * (n - 1 - rank))  # data writes in reverse rank order
        return _save_data(self, name, data)

    def wait_for_all(name):
        here = os.path.join(gate, name)
        os.makedirs(here, exist_ok=True)
        open(os.path.join(here, str(rank)), "w").close()
        deadline = time.monotonic() + 120
        while len(os.listdir(here)) < n:
            if time.monotonic() > deadline:
                sys.exit("gate %s: only %d of %d children arrived" % (name, len(os.listdir(here)), n))
            time.sleep(0.002)

    caching.IndexDataCacheFile._load_index = load_index
    caching.IndexDataCacheFile._save_data = save_data
    """
)

CPU_CHILD = FORCE_RACE.format(module="numba.core.caching") + textwrap.dedent(
    """
    _save_overload = caching.Cache.save_overload

    def save_overload(self, sig, data):
        twin = type(self).__name__ == "SerialCache"  # a serial twin: the kernel's function, its own cache
        name = self._py_func.__name__ + ("_serial" if twin else "")
        if name in gated:
            wait_for_all(name)
        return _save_overload(self, sig, data)

    caching.Cache.save_overload = save_overload

    import numpy as np
    import embnum

    cumsum, segment = sys.argv[5], sys.argv[6]
    embnum.inclusive_cumsum(np.arange(5, dtype=cumsum), backend="cpu")
    embnum.segment_sum_csr(1, np.array([0, 2, 5]), np.arange(5, dtype=segment), backend="cpu")
    """
)

CPU_CHECK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import embnum
    from embnum.cpu import jagged

    bad = []
    for dtype in sorted(set(sys.argv[1].split(","))):
        x = np.arange(1, 8, dtype=dtype) * 3
        got, want = embnum.inclusive_cumsum(x, backend="cpu"), embnum.inclusive_cumsum(x, backend="ref")
        if got.dtype != want.dtype or not np.array_equal(got, want):
            bad.append(("inclusive_cumsum", dtype, got.tolist(), want.tolist()))
    for dtype in sorted(set(sys.argv[2].split(","))):
        v, seg = np.arange(1, 8, dtype=dtype) * 3, np.array([0, 3, 7])
        got, want = (embnum.segment_sum_csr(2, seg[:2], v[:6], backend=b) for b in ("cpu", "ref"))
        if got.dtype != want.dtype or not np.array_equal(got, want):
            bad.append(("segment_sum_csr", dtype, got.tolist(), want.tolist()))
    hits = {k: sum(getattr(jagged, k).stats.cache_hits.values()) for k in sys.argv[3].split(",")}
    misses = {k: sum(getattr(jagged, k).stats.cache_misses.values()) for k in sys.argv[3].split(",")}
    print(json.dumps({"bad": bad, "hits": hits, "misses": misses}))
    """
)


def _env(cache_dir) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    src = os.path.dirname(os.path.dirname(embnum.__file__))
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return env


def _run_together(code: str, argv_of, env, timeout=300):
    """Start ``N_PROCS`` children at once (``argv_of(rank)``: their arguments after the rank,
    the count and the gate); return their ``(returncode, stderr)``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank), str(N_PROCS), *argv_of(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(N_PROCS)
    ]
    return [(p.wait(timeout=timeout), p.stderr.read()) for p in procs]


def test_cpu_kernels_compiled_by_racing_processes_load_right(tmp_path):
    cache, gate = tmp_path / "cache", tmp_path / "gate"
    env = _env(cache)
    done = _run_together(CPU_CHILD, lambda r: [str(gate), ",".join(GATED), CUMSUM_DTYPES[r], SEGMENT_DTYPES[r]], env)
    for rc, err in done:
        assert rc == 0, err[-3000:]
    for name in GATED:  # the race was forced: every child reached each kernel's save together
        assert len(os.listdir(gate / name)) == N_PROCS, name
    check = subprocess.run(
        [sys.executable, "-c", CPU_CHECK, ",".join(CUMSUM_DTYPES), ",".join(SEGMENT_DTYPES), ",".join(GATED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert report["bad"] == []
    # every signature some child compiled came from the cache: none was lost by a racing writer
    assert report["hits"] == {"_inclusive": 2, "_segment_sum_serial": 4}, report
    assert report["misses"] == {"_inclusive": 0, "_segment_sum_serial": 0}, report


CUDA_CHILD = FORCE_RACE.format(module="numba.cuda.core.caching") + textwrap.dedent(
    """
    from embnum import _half, _jit

    index = _jit._cuda_cache()(_half.rne)._cache_file  # the index a CUDA kernel's dispatcher uses
    wait_for_all("rne")
    index.save(("signature", rank), {"rank": rank, "code": bytes([rank]) * 4096})
    """
)

CUDA_CHECK = textwrap.dedent(
    """
    import sys
    from importlib.metadata import version
    from embnum import _half, _jit

    index = _jit._cuda_cache()(_half.rne)._cache_file
    assert index._source_stamp[2] == ("numba-cuda", version("numba-cuda"))  # an upgrade recompiles
    for rank in range(int(sys.argv[1])):
        got = index.load(("signature", rank))
        want = {"rank": rank, "code": bytes([rank]) * 4096}
        assert got == want, (rank, got if got is None else got["rank"])
    """
)


def test_cuda_cache_index_with_racing_processes(tmp_path):
    """The index of CUDA kernels' cache (numba-cuda's own copy of Numba's), driven as a CUDA
    dispatcher drives it; no GPU is needed to write and read it."""
    pytest.importorskip("numba_cuda")
    cache, gate = tmp_path / "cache", tmp_path / "gate"
    env = dict(_env(cache), NUMBA_ENABLE_CUDASIM="0")
    for rc, err in _run_together(CUDA_CHILD, lambda r: [str(gate), "rne"], env):
        assert rc == 0, err[-3000:]
    assert len(os.listdir(gate / "rne")) == N_PROCS
    check = subprocess.run(
        [sys.executable, "-c", CUDA_CHECK, str(N_PROCS)], env=env, capture_output=True, text=True, timeout=300
    )
    assert check.returncode == 0, check.stderr[-3000:]


PROBE_HELPER = "SCALE = {scale}\n\n\ndef helper(x):\n    return x * SCALE + 1\n"
PROBE_COMMON = (
    "from .. import _probe\nfrom .._jit import njit\n\n"
    'helper = njit(cache=True, inline="always")(_probe.helper)\nOFFSET = {offset}\n'
)
PROBE_KERNEL = (
    "from .._jit import njit\nfrom ._probe_common import OFFSET, helper\n\n\n"
    "@njit(cache=True)\ndef kernel(x):\n    return helper(x) + OFFSET\n"
)
PROBE_RUN = textwrap.dedent(
    """
    import json
    import numpy as np
    import embnum
    from embnum.cpu import jagged, probe

    value = int(probe.kernel(2))
    embnum.inclusive_cumsum(np.arange(4), backend="cpu")
    print(json.dumps({
        "value": value,
        "probe_hits": sum(probe.kernel.stats.cache_hits.values()),
        "inclusive_hits": sum(jagged._inclusive.stats.cache_hits.values()),
    }))
    """
)


def test_kernel_recompiles_when_a_module_it_imports_changes(tmp_path):
    """A kernel's cache entry is keyed on every embnum module its module imports, transitively:
    a kernel (``cpu/probe.py``) calls a helper compiled in a backend-common module
    (``cpu/_probe_common.py``) from a shared module (``_probe.py``) and reads a constant of the
    common module; a change to either compiles it anew, no change loads it. A real kernel
    (``jagged._inclusive``, whose module imports ``cpu/_common.py``, which imports ``_half.py``)
    is recompiled after ``_half.py`` changes; the probe, which does not import it, is not."""
    import shutil

    src = tmp_path / "src"
    pkg = src / "embnum"
    shutil.copytree(os.path.dirname(embnum.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "cpu" / "_probe_common.py").write_text(PROBE_COMMON.format(offset=10))
    (pkg / "cpu" / "probe.py").write_text(PROBE_KERNEL)

    def run(scale, offset):
        (pkg / "_probe.py").write_text(PROBE_HELPER.format(scale=scale))
        (pkg / "cpu" / "_probe_common.py").write_text(PROBE_COMMON.format(offset=offset))
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(src))
        done = subprocess.run([sys.executable, "-c", PROBE_RUN], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run(3, 10) == {"value": 2 * 3 + 1 + 10, "probe_hits": 0, "inclusive_hits": 0}
    assert run(3, 10) == {"value": 17, "probe_hits": 1, "inclusive_hits": 1}  # nothing changed: loaded
    assert run(5, 10)["value"] == 2 * 5 + 1 + 10  # the shared helper changed
    assert run(5, 20)["value"] == 2 * 5 + 1 + 20  # the common module's constant changed
    with open(pkg / "_half.py", "a") as f:
        f.write("\n# changed\n")
    # _inclusive recompiles; the probe, whose modules do not import _half.py, loads
    assert run(5, 20) == {"value": 31, "probe_hits": 1, "inclusive_hits": 0}
    assert run(5, 20) == {"value": 31, "probe_hits": 1, "inclusive_hits": 1}
    # the data files compiled from older sources went when the index was rewritten
    data = [p for p in os.listdir(next((tmp_path / "cache").glob("cpu_*"))) if p.endswith(".nbc")]
    assert len([p for p in data if p.startswith("probe.kernel-")]) == 1, data
    assert len([p for p in data if p.startswith("jagged._inclusive-")]) == 1, data


WARM_CHECK = textwrap.dedent(
    """
    import json
    import numpy as np
    import embnum
    from embnum.cpu import jagged

    for size in ("small", "large"):
        example = embnum.inclusive_cumsum.op.example_fn(np.random.default_rng(0), size)
        embnum.inclusive_cumsum(**example.args, backend="cpu")
    k = jagged._inclusive
    print(json.dumps([sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values())]))
    """
)


def test_warmup_fills_the_cache_a_fresh_process_loads(tmp_path):
    env = _env(tmp_path / "cache")
    cmd = [sys.executable, "-m", "embnum", "warmup", "--op", "inclusive_cumsum", "--jobs", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "warmed 1 of 1 ops on cpu" in done.stdout
    check = subprocess.run([sys.executable, "-c", WARM_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    hits, misses = json.loads(check.stdout.strip().splitlines()[-1])
    assert hits >= 1 and misses == 0
    bad = subprocess.run(cmd[:4] + ["--family", "no_such_family"], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "no op matches" in bad.stdout


TOUR_CHECK = textwrap.dedent(
    """
    import json
    import numpy as np
    import embnum
    from embnum.cpu import jagged

    example = embnum.segment_sum_csr_backward.op.example_fn(np.random.default_rng(1), "small")
    embnum.segment_sum_csr_backward(**example.args)  # a small call: the one-thread kernel
    k = jagged._broadcast_runs_serial
    print(json.dumps([sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values())]))
    """
)


def test_small_calls_after_the_tour_compile_nothing(tmp_path):
    """The tour (large examples) also compiles the one-thread kernels that small calls take."""
    env = _env(tmp_path / "cache")
    cmd = [sys.executable, "-m", "embnum", "tour", "--op", "segment_sum_csr_backward", "--backend", "cpu"]
    done = subprocess.run(cmd + ["--repeats", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", TOUR_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    assert json.loads(check.stdout.strip().splitlines()[-1]) == [1, 0]


def test_every_cached_kernel_goes_through_embnum_jit():
    """A kernel compiled with Numba's own cache (``numba.njit(cache=True)``, ``cuda.jit(cache=True)``)
    would be unsafe with concurrent processes and blind to its helpers' changes."""
    import re

    root = os.path.dirname(embnum.__file__)
    direct = re.compile(r"^from numba import .*\bnjit\b|numba\.njit\(|cuda\.jit\(cache=True|cuda\.jit\(.*cache=", re.M)
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and name != "_jit.py":
                path = os.path.join(folder, name)
                with open(path) as f:
                    found += [f"{os.path.relpath(path, root)}: {m.group(0)}" for m in direct.finditer(f.read())]
    assert found == []


def test_index_loads_only_whole_data_of_its_own_key(tmp_path):
    """A data file that does not unpickle, or that holds another signature's code (say, renamed by
    hand), is a cache miss: the kernel compiles anew instead of running it."""
    from embnum import _half, _jit

    index = _jit._cpu_cache().index_class(str(tmp_path), "kernel-1.py311", None)
    index._stamp_of = _half.__file__
    index.save(("int32",), {"code": 32})
    index.save(("int64",), {"code": 64})
    assert index.load(("int32",)) == {"code": 32} and index.load(("int64",)) == {"code": 64}
    assert index.load(("float32",)) is None
    a, b = (tmp_path / index._entry_name(k) for k in (("int32",), ("int64",)))
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())  # int64's code under int32's name
    assert index.load(("int32",)) is None
    a.write_bytes(a_bytes[: len(a_bytes) // 2])  # cut short
    assert index.load(("int32",)) is None
    a.unlink()
    assert index.load(("int32",)) is None and index.load(("int64",)) == {"code": 64}


CLOSURE_KEYS = textwrap.dedent(
    """
    import importlib, json, pkgutil
    import embnum, embnum.cpu
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    keys = {}
    for info in pkgutil.iter_modules(embnum.cpu.__path__, "embnum.cpu."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            found = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else [value]
            for i, disp in enumerate(found):
                cache = getattr(disp, "_cache", None)
                if not hasattr(cache, "_index_key") or disp.py_func.__closure__ is None:
                    continue
                keys[f"{info.name}.{name}[{i}]"] = repr(cache._index_key((), codegen))
    print(json.dumps(keys))
    """
)


def test_closure_kernels_keep_their_cache_key_across_processes(tmp_path):
    """A kernel made by a factory (closing over the optimizer rule it picked, a constant) has the
    same cache key in every process, and kernels from one factory have keys of their own: a key
    that changed per process (Numba pickles a dispatcher with an id drawn per process) made every
    new process compile the fused update again (12 s on the AMD VM)."""
    env = _env(tmp_path / "cache")
    runs = [subprocess.run([sys.executable, "-c", CLOSURE_KEYS], env=env, capture_output=True, text=True) for _ in "ab"]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads(done.stdout.strip().splitlines()[-1]) for done in runs)
    assert any("_FUSED_UPDATE" in k for k in first) and any("_UPDATE_SMALL" in k for k in first)
    assert first == second
    assert len(set(first.values())) == len(first)  # (a twin's key adds "serial" to its kernel's)


INT32_WARM = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import embnum
    from embnum import _warmup
    from embnum.cpu import tbe

    if sys.argv[1] == "warm":
        print(json.dumps(_warmup.warm_op("tbe_forward", ("cpu",), ("small",), int32_lookups=True)))
    else:
        example = embnum.tbe_forward.op.example_fn(np.random.default_rng(0), "small")
        args = dict(example.args, indices=example.args["indices"].astype(np.int32),
                    offsets=example.args["offsets"].astype(np.int32))
        got = embnum.tbe_forward(**args, backend="cpu")
        want = embnum.tbe_forward(**example.args, backend="ref")
        k = tbe._forward_small
        print(json.dumps([bool(np.allclose(got, want, rtol=1e-5, atol=1e-5)),
                          sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values())]))
    """
)


def test_warmup_compiles_the_tbe_ops_for_int32_lookups_too(tmp_path):
    """TorchRec's KeyedJaggedTensors hand the TBE ops int32 indices and offsets: a warmed cache
    holds that signature, so a fresh process's int32 call loads it (and agrees with the oracle)."""
    env = _env(tmp_path / "cache")
    for mode in ("warm", "check"):
        done = subprocess.run(
            [sys.executable, "-c", INT32_WARM, mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if mode == "warm":
            assert found[2] is None, found
    assert found == [True, 1, 0]


def test_compiled_kernels_lists_compiles_not_loads():
    """What the tour and tools/check_prebuilt.py count: a kernel compiled in the block, once; a
    call of an already compiled signature adds nothing."""
    import numba

    from embnum import _warmup

    @numba.njit
    def plus_one(x):
        return x + 1

    with _warmup.compiled_kernels() as compiled:
        plus_one(1)
        plus_one(2)
    assert compiled == ["test_compiled_kernels_lists_compiles_not_loads.<locals>.plus_one"]
    with _warmup.compiled_kernels() as again:
        plus_one(3)
    assert again == []
