"""First-call time of every op, on a cold and on a warm kernel cache.

    python benchmarks/bench_coldstart.py [--op NAME ...] [--family F ...] [--size small|large] [--warmup]
    python benchmarks/bench_coldstart.py --compiles [--op NAME ...] [--family F ...]

For each op, in a fresh process with a fresh, empty ``NUMBA_CACHE_DIR`` ("cold"): ``import
embnum`` (timed), the op's tour example of ``--size`` built, then the first call on the cpu
backend (timed: compiling what it reaches, then running) and a second call (timed: the run
alone). Then once more in a fresh process on the cache the cold one left ("warm": the first
call loads the compiled kernels). ``--warmup``: the warm process runs on a cache filled by
``python -m embnum warmup --op NAME`` in its own fresh directory instead (what a warmed image
gives). Prints a Markdown table and the load average before and after: the machine is shared,
and compile times scale with the load.

``--compiles``: the cold first call only, in process CPU seconds (which move less with the load
than wall time), with the kernels it compiled (Numba's ``numba:compile`` events: the top-level
ones, and the largest).

Where embnum has prebuilt kernels (``python -m embnum warmup --prebuilt``) a cold cache loads them
(the header says so); ``EMBNUM_PREBUILT_DIR=`` measures compiling instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import load  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import embnum
    t_import = time.perf_counter() - t0
    op = next(o for o in embnum.ops() if o.name == sys.argv[1])
    example = op.example_fn(np.random.default_rng(0), sys.argv[2])

    def call():
        args = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in example.args.items()}
        t = time.perf_counter()
        op.public(**args, backend="cpu")
        return time.perf_counter() - t

    first = call()
    second = call()
    print(json.dumps({"import": t_import, "first": first, "second": second, "label": example.label}))
    """
)


COMPILES = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from numba.core import event
    import embnum
    sys.path.insert(0, sys.argv[3])
    from _bench import top_level_compiles

    listener, top = top_level_compiles()
    op = next(o for o in embnum.ops() if o.name == sys.argv[1])
    example = op.example_fn(np.random.default_rng(0), sys.argv[2])
    with event.install_listener("numba:compile", listener):
        t = time.process_time()
        op.public(**example.args, backend="cpu")
        cpu = time.process_time() - t
    print(json.dumps({"cpu": cpu, "kernels": top, "label": example.label}))
    """
)


def _child(name: str, size: str, cache: str, code: str = CHILD) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    here = os.path.dirname(os.path.abspath(__file__))  # (the COMPILES child imports _bench from here)
    done = subprocess.run([sys.executable, "-c", code, name, size, here], env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _warm_cache(name: str, cache: str) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    cmd = [sys.executable, "-m", "embnum", "warmup", "--op", name, "--jobs", "1"]
    subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s" if x >= 0.1 else f"{x * 1e3:.1f} ms"


def _compiles(ops, size: str) -> int:
    print("\n| op | input | cold first call (CPU) | kernels compiled | largest compile (CPU) |")
    print("| --- | --- | ---: | ---: | --- |")
    for op in ops:
        with tempfile.TemporaryDirectory() as cold_dir:
            cold = _child(op.name, size, cold_dir, COMPILES)
        if "error" in cold:
            print(f"| {op.name} | ERROR {cold['error']} | | | |", flush=True)
            continue
        name, cpu = max(cold["kernels"], key=lambda k: k[1], default=("-", 0.0))
        n = len(cold["kernels"])
        print(f"| {op.name} | {cold['label']} | {cold['cpu']:.2f} s | {n} | `{name}` {cpu:.2f} s |", flush=True)
    print(f"\n{load()}")
    return 0


def main(argv=None) -> int:
    import embnum

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", action="append")
    p.add_argument("--family", action="append")
    p.add_argument("--size", default="small", choices=("small", "large"))
    p.add_argument("--warmup", action="store_true", help="warm cache from `python -m embnum warmup`")
    p.add_argument("--compiles", action="store_true", help="cold first call in CPU seconds, with its compiles")
    args = p.parse_args(argv)
    ops = [
        op
        for op in embnum.ops()
        if (not args.op or op.name in args.op) and (not args.family or op.family in args.family)
    ]
    from embnum import _prebuilt

    kernels = _prebuilt.describe() or "no prebuilt kernels (every kernel compiles on a cold cache)"
    print(f"{load()}; {len(ops)} ops, {args.size} examples, cpu backend, Numba threads: default; {kernels}")
    if args.compiles:
        return _compiles(ops, args.size)
    print("\n| op | input | import | cold first call | warm first call | second call |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for op in ops:
        with tempfile.TemporaryDirectory() as cold_dir, tempfile.TemporaryDirectory() as warm_dir:
            cold = _child(op.name, args.size, cold_dir)
            if args.warmup:
                _warm_cache(op.name, warm_dir)
            warm = _child(op.name, args.size, warm_dir if args.warmup else cold_dir)
        if "error" in cold or "error" in warm:
            print(f"| {op.name} | ERROR {cold.get('error') or warm.get('error')} | | | | |", flush=True)
            continue
        print(
            f"| {op.name} | {cold['label']} | {_s(cold['import'])} | {_s(cold['first'])} | "
            f"{_s(warm['first'])} | {_s(warm['second'])} |",
            flush=True,
        )
    print(f"\n{load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
