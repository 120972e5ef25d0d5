"""Per-call overhead: what a call costs beyond its kernel, on each op's small example.

    python benchmarks/bench_overhead.py [--rounds 15] [--family jagged] [--ops a,b] [--cpu-time]

For every registered op (its tour example at size "small"), side by side in one
process and interleaved round by round (``_bench.interleaved``, torch.utils.benchmark):

* kernel: the cpu implementation called with the validated arguments and a
  preallocated ``out`` (what no API layer can avoid);
* numpy: ``embnum.<op>(...)`` on NumPy arrays (validation, backend choice,
  allocation, the kernel);
* bridge: ``embnum.torch_bridge.<op>(...)`` on CPU tensors sharing the arrays'
  memory (conversion both ways, the torch op or its direct path, the numpy call);

and, for the cumsum, the peers (``torch.ops.fbgemm.asynchronous_complete_cumsum``
and ``torch.cumsum``) and the floor: a bare wrapper that only allocates and calls the
kernel (``bare numpy``), and the same behind the tensor conversions (``bare bridge``).
Overhead = median(API) - median(kernel). ``--cpu-time`` times this thread's CPU time
instead of wall time (on a loaded machine it leaves out the waits for a core). Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402


def contenders(op, torch, tb):
    """``{"kernel", "numpy", "bridge"}`` callables for ``op``'s small example (None where
    the op has no cpu kernel call of the generic shape)."""
    args = op.example_fn(np.random.default_rng(0), "small").args
    bound = op.bind((), args)
    plan_args, planned = op.declaration(**bound)
    impl = op.implementation("cpu")
    if planned is None:
        kernel = lambda: impl(**plan_args)  # noqa: E731
    elif op.returns == "array":
        out = np.empty(*embnum._registry.out_spec(*planned))
        kernel = lambda: impl(**plan_args, out=out)  # noqa: E731
    else:
        outs = [None if s is None else np.empty(*embnum._registry.out_spec(*s)) for s in planned]
        outs = tuple(outs) if isinstance(planned, tuple) else outs
        kernel = lambda: impl(**plan_args, out=outs)  # noqa: E731
    public = op.public
    found = {"kernel": kernel, "numpy": lambda: public(**args)}
    if tb is not None:
        fn = getattr(tb, op.name)
        targs = _bench.bridge_tensors(torch, tb.BRIDGES[op.name], bound)
        found["bridge"] = lambda: fn(**targs)
    return found


def _floors(op, torch) -> dict:
    """The floor of item 1 for complete_cumsum: a bare wrapper that only allocates the output
    and calls the kernel (no checks, no registry), the least any Python API returning a fresh
    array pays; and the same behind ``Tensor.numpy()`` / ``torch.from_numpy`` for the bridge."""
    impl = op.implementation("cpu")
    x = op.example_fn(np.random.default_rng(0), "small").args["lengths"]

    def bare(x):
        out = np.empty(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype)
        impl(x, out)
        return out

    found = {"bare numpy": lambda: bare(x)}
    if torch is not None:
        t = torch.from_numpy(x)
        found["bare bridge"] = lambda: torch.from_numpy(bare(t.numpy()))
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--family", default=None)
    p.add_argument("--ops", default=None, help="comma-separated op names (default: every op of --family)")
    p.add_argument("--cpu-time", action="store_true")
    a = p.parse_args()
    torch = _bench.optional_torch()
    fb = _bench.optional_fbgemm(torch)
    tb = None
    if torch is not None:
        from embnum import torch_bridge as tb
    timer = time.thread_time if a.cpu_time else time.perf_counter
    print(_bench.machine())
    print(f"- command: NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '(unset)')} python {' '.join(sys.argv)}")
    print(f"- clock: {'thread CPU time' if a.cpu_time else 'wall'}; {a.rounds} interleaved rounds per op")
    print(f"- before: {_bench.load()}")
    rows, by_family = [], {}
    only = set(a.ops.split(",")) if a.ops else None
    for op in embnum.ops(a.family):
        if only is not None and op.name not in only:
            continue
        try:
            fns = contenders(op, torch, tb)
        except Exception as e:  # noqa: BLE001 - report the op, keep going
            rows.append(dict(op=op.name, family=op.family, note=f"not timed: {type(e).__name__}: {e}"[:80]))
            continue
        if op.name == "complete_cumsum" and torch is not None:
            t = torch.from_numpy(op.example_fn(np.random.default_rng(0), "small").args["lengths"]).long()
            fns["torch.cumsum"] = lambda: torch.cumsum(t, 0)
            if fb is not None:
                fns["fbgemm"] = lambda: fb.asynchronous_complete_cumsum(t)
            fns.update(_floors(op, torch))
        ms = _bench.interleaved(fns, rounds=a.rounds, timer=timer)
        k = ms["kernel"].median
        row = dict(op=op.name, family=op.family, kernel=_bench.fmt_us(ms["kernel"]), numpy=_bench.fmt_us(ms["numpy"]))
        row["numpy overhead"] = f"{(ms['numpy'].median - k) * 1e6:.2f}"
        if "bridge" in ms:
            row["bridge"] = _bench.fmt_us(ms["bridge"])
            row["bridge overhead"] = f"{(ms['bridge'].median - k) * 1e6:.2f}"
        row["peers"] = ", ".join(f"{n} {_bench.fmt_us(ms[n])}" for n in ("fbgemm", "torch.cumsum") if n in ms)
        floors = [f"{n} +{(ms[n].median - k) * 1e6:.2f}" for n in ("bare numpy", "bare bridge") if n in ms]
        if floors:
            row["note"] = "floor, overhead of a bare wrapper: " + ", ".join(floors)
        rows.append(row)
        fam = by_family.setdefault(op.family, {"numpy": [], "bridge": []})
        fam["numpy"].append(ms["numpy"].median - k)
        if "bridge" in ms:
            fam["bridge"].append(ms["bridge"].median - k)
    print(f"- after: {_bench.load()}")
    print("\nper op, microseconds: median [interquartile range] of the per-call time\n")
    cols = ["family", "op", "kernel", "numpy", "numpy overhead", "bridge", "bridge overhead", "peers", "note"]
    print(_bench.table(rows, cols))
    print("\nper family, microseconds: median (max) over its ops of the overhead beyond the kernel\n")
    fam_rows = [
        dict(
            family=f,
            ops=len(v["numpy"]),
            numpy=f"{statistics.median(v['numpy']) * 1e6:.2f} ({max(v['numpy']) * 1e6:.2f})",
            bridge=f"{statistics.median(v['bridge']) * 1e6:.2f} ({max(v['bridge']) * 1e6:.2f})" if v["bridge"] else "-",
        )
        for f, v in by_family.items()
    ]
    print(_bench.table(fam_rows, ["family", "ops", "numpy", "bridge"]))
    print("\ntargets: numpy overhead <= 2 us, bridge overhead <= 5 us on a tiny input (complete_cumsum)")


if __name__ == "__main__":
    main()
