"""Stage ``compile``: every kernel signature into Numba's disk cache, once, in parallel processes.

The signatures are those of ``tests/cuda_signatures.txt`` (every launch the tests make). Each worker
process compiles its share with ``dispatcher.compile(signature)``, which saves the result in the
disk cache (``embnum._jit``: safe with concurrent writers); the later stages and their child
processes then load machine code instead of compiling it. The CUDA C sources are compiled by CuPy
(its own kernel cache). Under the simulator nothing compiles: the workers resolve every kernel
and parse every signature, so a renamed kernel or a bad line still fails here.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time


def _worker(pairs: list, sim: bool) -> list[dict]:
    """Compile (or, simulated, resolve) ``pairs`` in this process."""
    if sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    from ..cuda import _ptx

    table = _ptx.kernels()
    rows = []
    for name, sig in pairs:
        t0 = time.perf_counter()
        error = None
        try:
            kernel, types = table[name], _ptx.parse_signature(sig)
            if not sim:
                kernel.compile(types)
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the stage's file
            error = f"{type(exc).__name__}: {exc}"[:2000]
        rows.append(dict(kernel=name, signature=sig, seconds=round(time.perf_counter() - t0, 3), error=error))
    return rows


def _cuda_c(sim: bool) -> list[dict]:
    from ..cuda import _rawkernel

    rows = []
    for src in _rawkernel.sources():
        t0 = time.perf_counter()
        error = None
        try:
            if not sim:
                _rawkernel._module(src.name).compile()
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"[:2000]
        rows.append(dict(kernel=src.name, signature="CUDA C", seconds=round(time.perf_counter() - t0, 3), error=error))
    return rows


def stage(ctx, limit) -> tuple[str, str]:
    from ..cuda import _ptx

    if ctx.root is None:
        return "skipped", "tests/cuda_signatures.txt not found: run from a clone (PYTHONPATH=src)"
    pairs = _ptx.read_signatures(ctx.root / "tests" / "cuda_signatures.txt")
    n = max(1, min(len(pairs), (os.cpu_count() or 2) - 1, 2 if ctx.sim else 15))
    # heavier kernels spread evenly: deal the pairs out round-robin
    shares = [pairs[i::n] for i in range(n)]
    t0 = time.perf_counter()
    rows = []
    spawn = multiprocessing.get_context("spawn")  # the parent may hold a CUDA context: never fork it
    pool = concurrent.futures.ProcessPoolExecutor(n, mp_context=spawn)
    futures = [pool.submit(_worker, share, ctx.sim) for share in shares]
    done, late = concurrent.futures.wait(futures, timeout=limit)
    for f in done:
        try:
            rows += f.result()
        except Exception as exc:  # noqa: BLE001 - a worker that died
            rows.append(dict(kernel="(worker)", signature="", seconds=0, error=f"{type(exc).__name__}: {exc}"))
    if late:  # past the limit: stop the workers rather than wait for them
        for p in list((getattr(pool, "_processes", None) or {}).values()):
            p.kill()
    pool.shutdown(wait=not late, cancel_futures=True)
    rows += _cuda_c(ctx.sim)
    wall = time.perf_counter() - t0
    failed = [r for r in rows if r["error"]]
    ctx.write("compile", dict(processes=n, wall_seconds=round(wall, 1), rows=rows))
    what = "resolved (simulator: nothing compiles)" if ctx.sim else "compiled"
    line = f"{len(rows) - len(failed)} of {len(pairs) + len(_cuda_c_names())} {what} in {n} processes, {wall:.0f} s"
    if late:
        line += f"; {len(late)} of {n} workers passed the {limit} s limit"
    if failed:
        line += "; failed: " + ", ".join(f"{r['kernel']}({r['signature']})" for r in failed[:5])
    return ("FAIL" if failed or late else "ok"), line


def _cuda_c_names() -> list:
    from ..cuda import _rawkernel

    return _rawkernel.sources()
