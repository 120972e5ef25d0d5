"""Tail latency of small calls, and where one thread stops being as fast as all of them.

    python benchmarks/bench_tail.py [--calls 2000] [--sweep]

Tail: every op's small tour example through ``embnum.<op>(...)`` (NumPy), called
``--calls`` times one by one (wall clock per call), in blocks of 50 that alternate
between the registry's rule (one thread below ``embnum.cpu._common.SERIAL_BYTES``)
and all Numba threads always (``SERIAL_BYTES = 0``); prints median, p90, p99 and
p99 / median of each. The issue's target: p99 at most 3x the median on a loaded
machine.

``--sweep``: for a few kernels and growing inputs, the median wall time of the call
on one thread and on all threads (interleaved, ``_bench.interleaved``), to place the
threshold: the bytes (inputs + output) below which one thread is as fast.
Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402
from embnum.cpu import _common  # noqa: E402


def _percentiles(ts):
    a = np.sort(np.asarray(ts)) * 1e6
    med, p90, p99 = (float(np.percentile(a, q)) for q in (50, 90, 99))
    return med, p90, p99


def tail(calls):
    rows = []
    threshold = _common.SERIAL_BYTES
    for op in embnum.ops():
        if op.mutates or op.example_fn is None:
            continue
        args = op.example_fn(np.random.default_rng(0), "small").args
        fn = op.public
        try:
            fn(**args)
        except Exception as e:  # noqa: BLE001
            rows.append(dict(op=op.name, note=f"not timed: {type(e).__name__}"))
            continue
        times = {"rule": [], "all threads": []}
        for block in range(calls // 50):
            mode = "rule" if block % 2 == 0 else "all threads"
            _common.SERIAL_BYTES = threshold if mode == "rule" else 0
            for _ in range(50):
                t0 = time.perf_counter()
                fn(**args)
                times[mode].append(time.perf_counter() - t0)
        _common.SERIAL_BYTES = threshold
        row = dict(op=op.name)
        for mode, ts in times.items():
            med, p90, p99 = _percentiles(ts)
            row[mode] = f"{med:.1f} / {p90:.1f} / {p99:.1f} ({p99 / med:.1f}x)"
        rows.append(row)
    print("\nmicroseconds per call: median / p90 / p99 (p99 / median)\n")
    print(_bench.table(rows, ["op", "rule", "all threads", "note"]))


def sweep():
    import numba

    rng = np.random.default_rng(0)
    cases = []
    for n in (256, 2048, 8192, 32768, 131072):
        lengths = rng.integers(0, 64, n).astype(np.int64)
        cases.append(("complete_cumsum", n * 16, lambda x=lengths: embnum.complete_cumsum(x)))
    for B in (2, 16, 64, 256, 1024):
        lay = embnum.tbe_layout([1000, 1000], [64, 64])
        w = rng.standard_normal(lay.num_weights).astype(np.float32)
        offs = np.arange(0, 2 * B * 8 + 1, 8, dtype=np.int64)
        idx = rng.integers(0, 1000, offs[-1]).astype(np.int64)
        nbytes = idx.nbytes + offs.nbytes + 2 * B * 64 * 4
        cases.append(
            (
                "tbe_forward",
                nbytes,
                lambda w=w, idx=idx, offs=offs, lay=lay: embnum.tbe_forward(w, *lay.arrays(), idx, offs),
            )
        )
    rows = []
    n_all = numba.get_num_threads()
    for name, nbytes, fn in cases:

        def one(fn=fn):
            numba.set_num_threads(1)
            try:
                fn()
            finally:
                numba.set_num_threads(n_all)

        saved = _common.SERIAL_BYTES
        _common.SERIAL_BYTES = 0  # time the kernels as they are, the rule off
        ms = _bench.interleaved({"1 thread": one, f"{n_all} threads": fn}, rounds=11)
        _common.SERIAL_BYTES = saved
        rows.append(
            {
                "op": name,
                "bytes": nbytes,
                **{k: _bench.fmt_us(m) for k, m in ms.items()},
                "1 / all": f"{ms['1 thread'].median / ms[f'{n_all} threads'].median:.2f}",
            }
        )
    print("\nmicroseconds per call: median [IQR], one thread vs all\n")
    print(_bench.table(rows, ["op", "bytes", "1 thread", f"{n_all} threads", "1 / all"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--sweep", action="store_true")
    a = p.parse_args()
    print(_bench.machine())
    print(f"- SERIAL_BYTES = {_common.SERIAL_BYTES}")
    print(f"- before: {_bench.load()}")
    if a.sweep:
        sweep()
    else:
        tail(a.calls)
    print(f"\n- after: {_bench.load()}")


if __name__ == "__main__":
    main()
