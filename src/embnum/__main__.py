"""``python -m embnum tour``: every op on every available backend against the oracle.

For each registered op it builds the op's realistic example input, runs the
NumPy oracle and each fast backend on it, and prints the largest absolute
difference and the time: the median and the quartiles of the timed runs.
The example and the oracle's answer are made once per input size and shared by
every backend's row (the small answer first: the op's one-time costs fall on it); the
simulator's one timed run is its first call, and an oracle whose answer took more than a
quarter of a second is timed by that call alone (once more where Numba compiled the op's
checks during it).
On the cpu backend the op's small example is run and checked first as well: small
calls take one-thread kernels of their own, which a later small call (the README's
snippet) would otherwise compile.
The backends' timed runs are interleaved (one run of each backend per round),
so a neighbour's load on a shared machine falls on all of them alike.
Without a GPU the cuda backend runs under Numba's CUDA simulator on the op's
small example (the simulator runs every GPU thread as a Python thread).
On a machine with several cores, worker processes compile the cpu kernels of the ops still
ahead while the tour runs (``embnum._warmup.Ahead``; ``--jobs 0``: every kernel compiled in the
tour's own process, on its first call).
Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time

DESCRIPTION = "embnum's command line: the tour runs every op on every available backend against the oracle."


def _decide_simulator(no_sim: bool) -> None:
    """Switch the CUDA simulator on before numba is imported, when there is no GPU."""
    from ._backend import gpu_present

    if no_sim or gpu_present() or "NUMBA_ENABLE_CUDASIM" in os.environ:
        return
    if importlib.util.find_spec("numba_cuda") is not None:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _why_missing(backend: str) -> str:
    """The backend's name, with the install that brings it where that is the reason."""
    if backend == "cuda" and importlib.util.find_spec("numba_cuda") is None:
        return "cuda (needs numba-cuda: requirements/sim.txt or the [sim] extra runs it in the simulator)"
    return backend


def interleaved_times(runs: dict, repeats: dict, clock=time.perf_counter) -> dict:
    """Time ``runs[name]()`` (each a call followed by its backend's synchronize) for
    ``repeats[name]`` rounds, one run of every backend per round, in turn. Returns
    ``{name: [seconds, ...]}``."""
    times = {name: [] for name in runs}
    for r in range(max(repeats.values(), default=0)):
        for name, fn in runs.items():
            if r < repeats[name]:
                t0 = clock()
                fn()
                times[name].append(clock() - t0)
    return times


def summary(times: list) -> tuple[float, float, float]:
    """``(median, first quartile, third quartile)`` of ``times`` (all three equal for one time)."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    q1, med, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return med, q1, q3


def _unit(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if seconds >= 1 else (1e3, "ms") if seconds >= 1e-3 else (1e6, "us")


def _num(x: float) -> str:
    """Three or four significant digits, never an exponent."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _fmt_spread(times: list) -> tuple[str, str]:
    """The median, and the quartiles as ``q1-q3`` in the median's unit (``-`` for a single run)."""
    if not times:
        return "-", "-"
    med, q1, q3 = summary(times)
    scale, unit = _unit(med)
    spread = "-" if len(times) == 1 else f"{_num(q1 * scale)}-{_num(q3 * scale)} {unit}"
    return f"{_num(med * scale)} {unit}", spread


def tour(args) -> int:
    import numpy as np

    import embnum
    from embnum import _prebuilt
    from embnum._backend import BACKENDS, available_backends

    backends = [b for b in available_backends() if not args.backend or b in args.backend]
    print(
        f"embnum {embnum.__version__} tour - Python {platform.python_version()}, "
        f"NumPy {np.__version__}, {platform.machine()}"
    )
    for name in backends:
        print(f"  backend {name:5s} {BACKENDS[name].device}")
    prebuilt = _prebuilt.describe() if "cpu" in backends else ""
    if prebuilt:
        print(f"  {prebuilt} (loaded where the cache lacks a kernel; docs/using.md)")
    missing = sorted(set(BACKENDS) - set(available_backends()))
    if missing:
        print(f"  not available here: {', '.join(_why_missing(name) for name in missing)}")
    header = f"{'op':30s} {'backend':11s} {'input':34s} {'max |err|':>10s} {'median':>11s} {'quartiles':>18s}  status"
    print("\n" + header + "\n" + "-" * len(header))
    ops = [op for op in embnum.ops() if not args.op or op.name in args.op]
    ahead = _compile_ahead(ops, backends, args.jobs, prebuilt_cpu=bool(prebuilt))
    try:
        failures, slower = _tour_ops(ops, backends, args, ahead)
    finally:
        if ahead is not None:
            ahead.close()
    print(f"\n{'all ops match the oracle' if not failures else f'{failures} mismatches'}")
    if slower:
        print(f"{slower} fast paths slower than the oracle (SLOWER above; on a busy machine, see docs/using.md)")
    return 1 if failures else 0


def _compile_ahead(ops, backends, jobs: int, prebuilt_cpu: bool):
    """Workers warming the compiled backends' kernels of ``ops`` ahead of the tour, when there
    are ``jobs`` and the ops span at least two families (else None: nothing to overlap). Not the
    cpu kernels where this process loads prebuilt ones (``prebuilt_cpu``: the workers would only
    load them too)."""
    from . import _warmup

    compiled = tuple(b for b in _warmup.compiled_backends() if b in backends and not (b == "cpu" and prebuilt_cpu))
    if jobs < 1 or not compiled or len({op.family for op in ops}) < 2:
        return None
    return _warmup.Ahead([op.name for op in ops], compiled, jobs)


SLOW_ORACLE = 0.25  # seconds


def _tour_ops(ops, backends, args, ahead) -> tuple[int, int]:
    """Run and print each of ``ops``; return ``(failures, rows slower than the oracle)``."""
    from embnum._backend import BACKENDS

    failures = slower = 0
    for op in ops:
        rows, runs, repeats, firsts = {}, {}, {}, {}
        answers = _Answers(op)
        for name in backends:
            backend = BACKENDS[name]
            simulated = name == "cuda" and getattr(backend, "simulated", False)
            size = "small" if simulated or args.small else "large"
            label = name + (" (sim)" if simulated else "")
            if ahead is not None and name != "ref" and not simulated:
                ahead.wait(op.name)
            example = None
            try:
                if name == "ref" and size == "large":  # the op's one-time costs (imports, cache loads) fall here
                    answers.want("small")
                example = answers.example(size)
                run, err, ok, first = _prepare(op, backend, name, example, answers.want(size))
                status = "ok" if ok else "MISMATCH"
                if name == "cpu" and size == "large":  # the one-thread kernels of small calls: compiled and checked too
                    small = answers.example("small")
                    if not _prepare(op, backend, name, small, answers.want("small"))[2]:
                        ok, status = False, f"MISMATCH on the small example ({small.label})"
                runs[name] = run
                if simulated:  # (the simulator compiles nothing: its first call is its one sample)
                    firsts[name], repeats[name] = [first], 0
                elif name == "ref" and answers.seconds(size) > SLOW_ORACLE:  # (a slow oracle: one timed run)
                    if answers.compiled(size):  # (its answer's time held the compile of the op's checks)
                        repeats[name] = 1
                    else:  # (its answer's call is that run)
                        firsts[name], repeats[name] = [answers.seconds(size)], 0
                elif name == "ref":
                    repeats[name] = 3
                else:
                    repeats[name] = args.repeats
            except Exception as exc:  # noqa: BLE001 - the tour reports every failure and goes on
                err, ok, status = float("nan"), False, f"ERROR {type(exc).__name__}: {exc}"
            failures += not ok
            rows[name] = (label, example.label if example is not None else "-", err, status)
        try:
            times = interleaved_times(runs, repeats)
        except Exception as exc:  # noqa: BLE001
            times = {}
            failures += 1
            rows = {n: (*r[:3], f"ERROR while timing {type(exc).__name__}: {exc}") for n, r in rows.items()}
        for name, first in firsts.items():
            if name in times:
                times[name][:0] = first
        for name, (label, input_label, err, status) in rows.items():
            median, spread = _fmt_spread(times.get(name, []))
            ratio = slower_than_oracle(name, times, rows)
            if ratio and status == "ok":
                status = f"ok, SLOWER than ref ({ratio:.1f}x)"
                slower += 1
            print(
                f"{op.name:30s} {label:11s} {input_label:34s} {err:10.3g} {median:>11s} {spread:>18s}  {status}",
                flush=True,
            )
    return failures, slower


class _Answers:
    """One op's examples and the oracle's answers to them, made once per size and shared by every
    backend's row: ``want(size)`` is the oracle's result (for an in-place op, the arrays it wrote,
    computed on copies: the example's arrays stay as made), ``seconds(size)`` how long that call
    took, and ``compiled(size)`` whether Numba compiled anything during it (the declaration's
    checks, when the cache did not hold them)."""

    def __init__(self, op):
        self.op = op
        self._examples: dict = {}
        self._answers: dict = {}

    def example(self, size: str):
        if size not in self._examples:
            import numpy as np

            self._examples[size] = self.op.example_fn(np.random.default_rng(0), size)
        return self._examples[size]

    def want(self, size: str):
        if size not in self._answers:
            from . import _warmup

            op, args = self.op, self.example(size).args
            with _warmup.compiled_kernels() as compiled:
                t0 = time.perf_counter()
                if op.mutates:
                    host_args = _copy_arrays(args)
                    op.public(**host_args, backend="ref")
                    want = [host_args[k] for k in op.mutates if host_args.get(k) is not None]
                else:
                    want = op.public(**args, backend="ref")
                seconds = time.perf_counter() - t0
            self._answers[size] = (want, seconds, bool(compiled))
        return self._answers[size][0]

    def seconds(self, size: str) -> float:
        self.want(size)
        return self._answers[size][1]

    def compiled(self, size: str) -> bool:
        self.want(size)
        return self._answers[size][2]


def slower_than_oracle(name: str, times: dict, rows: dict) -> float | None:
    """How many times slower than the oracle backend ``name``'s median was, when it was slower
    on the same input (``None`` otherwise, for the oracle itself and for a simulated backend)."""
    if name == "ref" or not times.get(name) or not times.get("ref") or rows[name][1] != rows["ref"][1]:
        return None
    if "(sim)" in rows[name][0]:
        return None
    ratio = summary(times[name])[0] / summary(times["ref"])[0]
    return ratio if ratio > 1 else None


def _prepare(op, backend, name, example, want):
    """Run ``op`` once on ``backend`` (compiling it) and compare with the oracle's answer ``want``
    (the ref row is the answer itself: nothing to run or compare); return the timed call (the op,
    then the backend's synchronize), the error, whether it matched and the first call's seconds.
    An in-place op runs on this row's own copies of the arrays it writes."""
    own = _copy_arrays(example.args) if op.mutates else example.args
    dev_args = {k: _to_backend(backend, v) for k, v in own.items()}

    def run():
        if op.mutates:
            dev_args.update({k: _to_backend(backend, v) for k, v in own.items() if k in op.mutates})
            op.public(**dev_args, backend=name)
            return [dev_args[k] for k in op.mutates if dev_args.get(k) is not None]
        return op.public(**dev_args, backend=name)

    def timed():
        run()
        backend.synchronize()

    if name == "ref":
        return timed, 0.0, True, None
    t0 = time.perf_counter()
    got = _to_host(backend, run())  # first call: compiles
    first = time.perf_counter() - t0
    err, ok = op.check_fn(got, want, example.args)
    return timed, err, ok, first


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


def op_table() -> str:
    """One line per op, family then name, the name column aligned to the longest family."""
    import embnum

    ops = embnum.ops()
    width = max(len(op.family) for op in ops)
    return "\n".join(f"{op.family:{width}s}  {op.name}" for op in ops)


def _gpu_check(args) -> int:
    from pathlib import Path

    from ._backend import gpu_present

    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported
    elif not gpu_present():
        print("gpu-check: no GPU here (the CUDA driver reports none); --sim runs the stages in the simulator")
        return 2
    from .gpucheck import run

    return run(Path(args.out), args.sim, args.stage)


def warmup(args) -> int:
    """Fill the disk cache (``embnum._warmup``); exit status 1 if an op failed or none matched."""
    from . import _warmup

    _decide_simulator(False)
    names = _warmup.plan(args.family, args.op)
    if not names:
        print("no op matches the given --family/--op")
        return 1
    if args.prebuilt:
        return 1 if _warmup.prebuild(names, args.jobs, args.prebuilt) else 0
    return 1 if _warmup.warmup(names, _warmup.compiled_backends(), args.jobs) else 0


def main(argv=None) -> int:
    from . import __version__, _prebuilt

    parser = argparse.ArgumentParser(prog="python -m embnum", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"embnum {__version__}")
    sub = parser.add_subparsers(dest="command")
    t = sub.add_parser("tour", help="every op on every available backend against the oracle, with timings")
    t.add_argument("--op", action="append", help="only this op (repeatable)")
    t.add_argument("--backend", action="append", help="only this backend (repeatable)")
    t.add_argument("--small", action="store_true", help="small inputs everywhere (quick check)")
    t.add_argument("--repeats", type=int, default=7, help="timed runs per fast backend (median and quartiles)")
    t.add_argument("--no-sim", action="store_true", help="do not run the cuda backend in the simulator")
    t.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes compiling the kernels of the ops ahead while the tour runs (default: the CPU count; 0: none)",
    )
    sub.add_parser("list", help="list the registered ops")
    g = sub.add_parser("gpu-check", help="versions, compile, smoke, pytest -m gpu and the GPU report on a GPU")
    g.add_argument("--out", required=True, help="folder for the results (at most 8 files, 0-summary.md first)")
    g.add_argument("--sim", action="store_true", help="the same stages in Numba's CUDA simulator at tiny sizes")
    g.add_argument("--stage", action="append", help="only this stage (repeatable)")
    w = sub.add_parser("warmup", help="compile every op's kernels into the disk cache ahead (parallel processes)")
    w.add_argument("--family", action="append", help="only this family (repeatable)")
    w.add_argument("--op", action="append", help="only this op (repeatable)")
    w.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: the CPU count)")
    w.add_argument(
        "--prebuilt",
        nargs="?",
        const=_prebuilt.DEFAULT_ROOT,
        metavar="DIR",
        help="compile the cpu kernels for the x86-64-v3 baseline into DIR (default: the package's _prebuilt, "
        "which a wheel built afterwards ships) instead of this machine's cache",
    )
    args = parser.parse_args(argv)
    if args.command == "list":
        print(op_table())
        return 0
    if args.command == "gpu-check":
        return _gpu_check(args)
    if args.command == "warmup":
        return warmup(args)
    if args.command != "tour":
        parser.print_help()
        return 2
    _decide_simulator(args.no_sim)
    return tour(args)


if __name__ == "__main__":
    sys.exit(main())
