"""Phase profile of the CPU row-wise Adagrad training step: not a peer comparison.

    python benchmarks/investigations/profile_tbe_step.py [--threads 1 2] [--rounds 7] [--T 26] [--rows 100000]
                                                         [--B 2048] [--L 20]

Times, interleaved round by round in one process, each phase of ``tbe_backward_update`` on
the bench_tbe.py case: ``prepare`` (host preparation), ``sort`` (per-table counting sort and
touched rows), ``sort+reduce`` (plus every touched row's summed gradient), ``update`` (the whole
``tbe_backward_update`` entry point), the forward, and a copy of the bytes the update must move.
Prints min and median per phase (wall ms) and the load before and after.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/: _bench, bench_tbe
from numba import njit, prange  # noqa: E402

import _bench  # noqa: E402
import bench_tbe  # noqa: E402
import embnum  # noqa: E402
from embnum.cpu import tbe as ct  # noqa: E402


@njit(parallel=True)
def _sort_only(lk, sink):
    for j in prange(lk.tables.shape[0]):
        order, touched, run_end, n = ct._table_runs(lk, j)
        sink[j] = n + order[0] + touched[0] + run_end[0]


@njit(parallel=True)
def _sort_reduce(lk, sink):
    for j in prange(lk.tables.shape[0]):
        D = lk.tables[j, ct.DIM]
        order, touched, run_end, n = ct._table_runs(lk, j)
        acc = np.empty(D, dtype=np.float32)
        s = np.float32(0)
        nl = order.shape[0]
        tg = ct._table_grad(lk, j, D, nl)
        for i in range(n):
            ct._row_grad(acc, D, order, run_end[i - 1] if i > 0 else 0, run_end[i], nl, lk, tg)
            s += acc[0]
        sink[j] = s


def main():
    p = _bench.tbe_arguments(__doc__, T=26, rows=100_000, B=2048)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    b = bench_tbe.batch(a, np.dtype(np.float32))
    lay = (b["weights_offsets"], b["D_offsets"], b["hash_size_cumsum"])
    w, idx, offs, grad = b["weights"], b["indices"], b["offsets"], b["grad"]
    opt = embnum.TBEOptimizer("rowwise_adagrad", 0.01)
    m1 = np.zeros(int(lay[2][-1]), np.float32)
    out = np.empty((a.B, a.T * a.D), np.float32)
    rows = np.full(a.T, a.rows, np.int64)
    lookup = dict(
        weights_offsets=lay[0],
        D_offsets=lay[1],
        hash_size_cumsum=lay[2],
        rows=rows,
        indices=idx,
        offsets=offs,
        B=a.B,
        pooling=0,
        per_sample_weights=None,
    )
    from embnum._tbe import SUM

    lookup["pooling"] = SUM
    sink = np.zeros(a.T, np.float64)
    lk = ct._prepare(grad, lookup)
    nbytes = bench_tbe.step_bytes(a, b)
    del nbytes
    tables = np.repeat(np.arange(a.T), np.diff(offs[:: a.B]))
    touched = np.unique(tables.astype(np.int64) * a.rows + idx[offs[0] : offs[-1]]).shape[0]
    src = np.ones(touched * (a.D * 4 + 4), np.uint8)  # the touched rows and accumulators: read, and written
    dst = np.empty_like(src)
    phases = {
        "prepare": lambda: ct._prepare(grad, lookup),
        "sort": lambda: _sort_only(lk, sink),
        "sort+reduce": lambda: _sort_reduce(lk, sink),
        "update (entry point)": lambda: embnum.tbe_backward_update(
            grad, w, *lay, idx, offs, "sum", optimizer=opt, momentum1=m1
        ),
        "forward": lambda: embnum.tbe_forward(w, *lay, idx, offs, "sum", out=out),
        f"copy {src.nbytes >> 20} MiB": lambda: np.copyto(dst, src),
    }
    print(f"# {_bench.machine()}; {_bench.load()}")
    for n in a.threads:
        _bench.set_threads(n)
        for f in phases.values():
            f()
        t = {k: [] for k in phases}
        c = {k: [] for k in phases}
        for _ in range(a.rounds):
            for k, f in phases.items():
                t0, c0 = time.perf_counter(), time.process_time()
                f()
                t[k].append(time.perf_counter() - t0)
                c[k].append(time.process_time() - c0)
        print(f"threads={n}: phase: min / median wall ms (median process CPU ms)")
        for k in phases:
            lo, mid, cpu = min(t[k]) * 1e3, statistics.median(t[k]) * 1e3, statistics.median(c[k]) * 1e3
            print(f"  {k:24s} {lo:8.1f} {mid:8.1f} ({cpu:.1f})")
    print(f"# {_bench.load()}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
