"""``python -m embnum tour``: every op on every available backend against the oracle.

For each registered op it builds the op's realistic example input, runs the
NumPy oracle and each fast backend on it, and prints the largest absolute
difference and the median time. Without a GPU the cuda backend runs under
Numba's CUDA simulator on the op's small example (the simulator runs every
GPU thread as a Python thread). Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time


def _decide_simulator(no_sim: bool) -> None:
    """Switch the CUDA simulator on before numba is imported, when there is no GPU."""
    from ._backend import gpu_present

    if no_sim or gpu_present() or "NUMBA_ENABLE_CUDASIM" in os.environ:
        return
    if importlib.util.find_spec("numba_cuda") is not None:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _median_seconds(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:9.3f} ms" if s >= 1e-3 else f"{s * 1e6:9.1f} us"


def tour(args) -> int:
    import numpy as np

    import embnum
    from embnum._backend import BACKENDS, available_backends

    backends = [b for b in available_backends() if not args.backend or b in args.backend]
    print(
        f"embnum {embnum.__version__} tour - Python {platform.python_version()}, "
        f"NumPy {np.__version__}, {platform.machine()}"
    )
    for name in backends:
        print(f"  backend {name:5s} {BACKENDS[name].device}")
    missing = sorted(set(BACKENDS) - set(available_backends()))
    if missing:
        print(f"  not available here: {', '.join(missing)}")
    header = f"{'op':28s} {'backend':15s} {'input':34s} {'max |err|':>10s} {'median':>12s}  status"
    print("\n" + header + "\n" + "-" * len(header))
    failures = 0
    for op in embnum.ops():
        if args.op and op.name not in args.op:
            continue
        for name in backends:
            backend = BACKENDS[name]
            simulated = name == "cuda" and getattr(backend, "simulated", False)
            size = "small" if simulated or args.small else "large"
            example = op.example_fn(np.random.default_rng(0), size)
            if op.mutates:  # in-place op: run on copies, compare what it wrote
                host_args = _copy_arrays(example.args)
                op.public(**host_args, backend="ref")
                want = [host_args[k] for k in op.mutates if host_args.get(k) is not None]
            else:
                want = op.public(**example.args, backend="ref")
            dev_args = {k: _to_backend(backend, v) for k, v in example.args.items()}
            run = lambda: op.public(**dev_args, backend=name)  # noqa: E731
            if op.mutates:

                def run(run_once=run):
                    dev_args.update({k: _to_backend(backend, v) for k, v in example.args.items() if k in op.mutates})
                    run_once()
                    return [dev_args[k] for k in op.mutates if dev_args.get(k) is not None]

            try:
                got = _to_host(backend, run())  # first call: compiles
                err, ok = op.check_fn(got, want, example.args)
                repeats = 1 if simulated else (3 if name == "ref" else args.repeats)
                seconds = _median_seconds(run, repeats, backend.synchronize)
                status = "ok" if ok else "MISMATCH"
            except Exception as exc:  # noqa: BLE001 - the tour reports every failure and goes on
                err, seconds, ok, status = float("nan"), float("nan"), False, f"ERROR {type(exc).__name__}: {exc}"
            failures += not ok
            label = name + (" (sim)" if simulated else "")
            print(
                f"{op.name:28s} {label:15s} {example.label:34s} {err:10.3g} {_fmt_time(seconds):>12s}  {status}",
                flush=True,
            )
    print(f"\n{'all ops match the oracle' if not failures else f'{failures} mismatches'}")
    return 1 if failures else 0


def _to_backend(backend, value):
    import numpy as np

    if isinstance(value, np.ndarray):
        return backend.from_host(value)
    if isinstance(value, list):
        return [_to_backend(backend, v) for v in value]
    return value


def _to_host(backend, value):
    if value is None or isinstance(value, int):  # None, or an int of a returned Python list
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple of arrays
        return type(value)(*(_to_host(backend, v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(backend, v) for v in value)
    return backend.to_host(value)


def _copy_arrays(args: dict) -> dict:
    import numpy as np

    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embnum", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    t = sub.add_parser("tour", help="every op on every available backend against the oracle, with timings")
    t.add_argument("--op", action="append", help="only this op (repeatable)")
    t.add_argument("--backend", action="append", help="only this backend (repeatable)")
    t.add_argument("--small", action="store_true", help="small inputs everywhere (quick check)")
    t.add_argument("--repeats", type=int, default=7, help="timed runs per fast backend (median)")
    t.add_argument("--no-sim", action="store_true", help="do not run the cuda backend in the simulator")
    sub.add_parser("list", help="list the registered ops")
    args = parser.parse_args(argv)
    if args.command == "list":
        import embnum

        for op in embnum.ops():
            print(f"{op.family:12s} {op.name}")
        return 0
    if args.command != "tour":
        parser.print_help()
        return 2
    _decide_simulator(args.no_sim)
    return tour(args)


if __name__ == "__main__":
    sys.exit(main())
