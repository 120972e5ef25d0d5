"""Kernels compiled ahead for the baseline CPU (``embnum._prebuilt``): a fresh process with an
empty cache loads them instead of compiling, and they compute what the oracle computes.

One build (``python -m embnum warmup --prebuilt DIR`` for two ops: a scan and a parallel copy
with its serial twin) serves every test; each check runs in a fresh process with its own empty
``NUMBA_CACHE_DIR``, so only the prebuilt directory can supply a kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import embnum

OPS = ("inclusive_cumsum", "jagged_to_padded_dense")

CHECK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import embnum
    from embnum import _prebuilt
    from embnum.cpu import jagged

    if sys.argv[1] == "no-baseline":
        _prebuilt.usable = lambda: False  # a host without the baseline's features
    mismatches = 0
    for name in sys.argv[2:]:
        op = next(o for o in embnum.ops() if o.name == name)
        for seed in range(6):  # values and shapes of both sizes, the tour's argument types
            example = op.example_fn(np.random.default_rng(seed), ("small", "large")[seed % 2])
            got = op.public(**example.args, backend="cpu")
            want = op.public(**example.args, backend="ref")
            mismatches += not np.array_equal(got, want)
    other = embnum.inclusive_cumsum(np.arange(5, dtype=np.int32), backend="cpu")  # a signature not built
    mismatches += not np.array_equal(other, np.cumsum(np.arange(5)))
    kernels = (jagged._inclusive, jagged._to_dense, jagged._to_dense_serial)
    print(json.dumps({
        "mismatches": mismatches,
        "hits": [sum(k.stats.cache_hits.values()) for k in kernels],
        "misses": [sum(k.stats.cache_misses.values()) for k in kernels],
    }))
    """
)


def _env(tmp_path, prebuilt: str | None) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    src = os.path.dirname(os.path.dirname(embnum.__file__))
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    if prebuilt is not None:
        env["EMBNUM_PREBUILT_DIR"] = prebuilt
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from embnum import _prebuilt

    if not _prebuilt.usable():
        pytest.skip("this host lacks the x86-64-v3 baseline: prebuilt kernels neither build nor load here")
    tmp = tmp_path_factory.mktemp("prebuilt")
    into = str(tmp / "kernels")
    cmd = [sys.executable, "-m", "embnum", "warmup", "--jobs", "1", "--prebuilt", into]
    for name in OPS:
        cmd += ["--op", name]
    done = subprocess.run(cmd, env=_env(tmp, None), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"prebuilt for {_prebuilt.BASELINE_CPU}" in done.stdout
    return into


def _check(tmp_path, prebuilt: str, mode: str = "") -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, mode, *OPS],
        env=_env(tmp_path, prebuilt),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fresh_process_loads_prebuilt_kernels_and_they_match_the_oracle(built, tmp_path):
    found = _check(tmp_path, built)
    assert found["mismatches"] == 0
    # the scan's int64 signature, the parallel copy and its twin: loaded, none compiled;
    # the int32 scan was not built: compiled (one miss)
    assert found["misses"] == [1, 0, 0], found
    assert all(h >= 1 for h in found["hits"]), found
    written = [name for d in (tmp_path / "cache").iterdir() for name in os.listdir(d)]
    assert not [name for name in written if name.startswith("jagged._to_dense")], written  # loaded, not saved


@pytest.mark.parametrize("mode", ["off", "no-baseline"])
def test_without_prebuilt_kernels_every_kernel_compiles(built, tmp_path, mode):
    """``EMBNUM_PREBUILT_DIR`` set empty, or a host without the baseline: the same kernels compile."""
    found = _check(tmp_path, "" if mode == "off" else built, mode)
    assert found["mismatches"] == 0
    assert found["hits"] == [0, 0, 0] and all(m >= 1 for m in found["misses"]), found


def test_build_keeps_only_cache_files_per_package(built):
    packages = sorted(os.listdir(built))
    assert packages and all(p == "embnum" or p.startswith("embnum.") for p in packages), packages
    files = [f for p in packages for f in os.listdir(os.path.join(built, p))]
    assert files and all(f.endswith((".nbi", ".nbc")) for f in files), files
    assert any(f.startswith("jagged._to_dense-") for f in os.listdir(os.path.join(built, "embnum.cpu")))


def test_the_tour_starts_no_cpu_workers_where_kernels_are_prebuilt(monkeypatch):
    """Workers warming the cpu kernels would only load the prebuilt ones again."""
    from embnum import __main__ as cli
    from embnum import _prebuilt, _warmup

    ops = embnum.ops()
    started = []
    monkeypatch.setattr(_warmup, "compiled_backends", lambda: ("cpu",))
    monkeypatch.setattr(_warmup, "Ahead", lambda names, backends, jobs: started.append(backends))
    assert cli._compile_ahead(ops, ["ref", "cpu"], 2, prebuilt_cpu=False) is None and started == [("cpu",)]
    assert cli._compile_ahead(ops, ["ref", "cpu"], 2, prebuilt_cpu=True) is None and started == [("cpu",)]
    # the tour passes what its header read: workers without prebuilt kernels, none with them
    argv = ["tour", "--op", "complete_cumsum", "--op", "float_to_fp16", "--small", "--no-sim", "--jobs", "2"]
    argv += ["--backend", "ref", "--backend", "cpu"]
    monkeypatch.setattr(_prebuilt, "describe", lambda: "")
    assert cli.main(argv) == 0 and started == [("cpu",), ("cpu",)]
    monkeypatch.setattr(_prebuilt, "describe", lambda: f"kernels prebuilt for {_prebuilt.BASELINE_CPU}")
    assert cli.main(argv) == 0 and started == [("cpu",), ("cpu",)]


def test_a_second_build_into_the_same_directory_compiles_everything_again(built, tmp_path):
    """The build's workers load nothing from the directory they rebuild (else the kernels they
    loaded would be missing from the new build)."""
    before = sorted(f for p in os.listdir(built) for f in os.listdir(os.path.join(built, p)))
    env = dict(_env(tmp_path, None), EMBNUM_PREBUILT_DIR=built)  # what the build must not read
    cmd = [sys.executable, "-m", "embnum", "warmup", "--jobs", "1", "--prebuilt", built]
    for name in OPS:
        cmd += ["--op", name]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert sorted(f for p in os.listdir(built) for f in os.listdir(os.path.join(built, p))) == before
