"""Where an op's kernels' compile time goes: each top-level compile of ``python -m embnum warmup``'s
work for the op (its small and large tour examples on the cpu backend), with its CPU seconds, the
share spent in LLVM, and the slowest of Numba's passes.

    NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/investigations/compile_profile.py OP [OP ...]

Run it on an empty cache directory: a kernel loaded from the cache compiles nothing. Ops named
together run in one process, in order, so a kernel they share is compiled once (as in a warmup
worker). Process CPU seconds.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for _bench


def _compiles(names):
    """``[(op, CPU seconds of its warmup, [(qualname, CPU seconds), ...])]``, top-level compiles only."""
    from numba.core import event

    from _bench import top_level_compiles
    from embnum import _warmup

    listener, top = top_level_compiles()
    done = []
    for name in names:
        top.clear()
        with event.install_listener("numba:compile", listener):
            t = time.process_time()
            error = _warmup.warm_op(name, ("cpu",))[2]
            cpu = time.process_time() - t
        done.append((name, cpu, error, [tuple(k) for k in top]))
    return done


def _passes(limit=4):
    """``{qualname: (seconds, llvm seconds, [(pass, seconds), ...])}`` of every compiled overload."""
    import gc

    from numba.core.registry import CPUDispatcher

    out = {}
    for d in gc.get_objects():
        if not isinstance(d, CPUDispatcher):
            continue
        for cres in d.overloads.values():
            md = cres.metadata or {}
            timers = md.get("timers", {})
            passes = []
            for per_pass in md.get("pipeline_times", {}).values():
                passes += [(p.split("_", 1)[-1], t.init + t.run + t.finalize) for p, t in per_pass.items()]
            passes.sort(key=lambda x: -x[1])
            total = timers.get("compiler_lock", 0.0)
            if total > out.get(d.py_func.__qualname__, (0.0,))[0]:
                out[d.py_func.__qualname__] = (total, timers.get("llvm_lock", 0.0), passes[:limit])
    return out


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or ["tbe_backward"]
    for name, cpu, error, kernels in _compiles(names):
        print(f"{name}: {cpu:.2f} s CPU, {len(kernels)} top-level compiles{f', ERROR {error}' if error else ''}")
        for qualname, seconds in sorted(kernels, key=lambda k: -k[1]):
            print(f"  {seconds:6.2f} s  {qualname}")
    print("\nslowest overloads (wall seconds in Numba's compiler lock, of which LLVM; the slowest passes):")
    for qualname, (total, llvm, passes) in sorted(_passes().items(), key=lambda kv: -kv[1][0])[:8]:
        steps = ", ".join(f"{p} {s:.2f}" for p, s in passes)
        print(f"  {total:6.2f} s (LLVM {llvm:.2f})  {qualname}: {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
