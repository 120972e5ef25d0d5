"""What argument validation costs per call, at the benchmark sizes.

For every op, on its "large" tour/benchmark input (``op.example_fn(rng, "large")``):

* ``validation``: the op's declaration alone (every argument check, overflow-safe
  sums, bounds and alias checks, the output plan), which is what a call pays
  before any kernel runs;
* ``call``: the whole public call on the cpu backend (validation + allocation +
  kernel).

Both are timed interleaved (one validation, one call, repeated) so machine load
hits them alike; the table gives the median and the interquartile range in
microseconds and the validation's share of the median call.

    python benchmarks/bench_validation.py [--repeats 30] [--ops name ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

import embnum  # noqa: E402
from _bench import machine, table  # noqa: E402


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def measure(op, args, repeats):
    public = op.public
    bound = op.bind((), args)
    mutated = set(op.mutates)

    def fresh():  # an in-place op gets its own copies of what it writes (not timed)
        return {k: (v.copy() if k in mutated and isinstance(v, np.ndarray) else v) for k, v in bound.items()}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # warm-up: compile and fill the caches
            op.declaration(**fresh())
            public(**fresh(), backend="cpu")
        val, call = [], []
        for _ in range(repeats):
            a = fresh()
            t0 = time.perf_counter()
            op.declaration(**a)
            t1 = time.perf_counter()
            a = fresh()
            t2 = time.perf_counter()
            public(**a, backend="cpu")
            t3 = time.perf_counter()
            val.append((t1 - t0) * 1e6)
            call.append((t3 - t2) * 1e6)
    return _quartiles(val), _quartiles(call)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--size", default="large", choices=("small", "large"))
    p.add_argument("--ops", nargs="*", default=None)
    a = p.parse_args()
    print(machine())
    print(f"- load average before: {os.getloadavg()}")
    rows = []
    for op in embnum.ops():
        if a.ops and op.name not in a.ops:
            continue
        ex = op.example_fn(np.random.default_rng(0), a.size)
        (v0, v, v1), (c0, c, c1) = measure(op, ex.args, a.repeats)
        rows.append(
            {
                "op": op.name,
                "input": ex.label,
                "validation us (median [q1, q3])": f"{v:.1f} [{v0:.1f}, {v1:.1f}]",
                "call us (median [q1, q3])": f"{c:.0f} [{c0:.0f}, {c1:.0f}]",
                "validation / call": f"{v / c:.1%}",
            }
        )
        print(f"  {op.name}: {v:.1f} us of {c:.0f} us", flush=True)
    print(f"- load average after: {os.getloadavg()}")
    print(f"\nvalidation cost per call, {a.size} inputs, {a.repeats} interleaved repeats, cpu backend\n")
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
