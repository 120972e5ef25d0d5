"""Timing and reporting shared by the benchmark programs (not a test)."""

from __future__ import annotations

import os

# Set before torch or Numba load an OpenMP runtime: with two pools in one
# process, spinning idle threads of one steal the cores of the other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dataclasses
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np


def median_time(fn, *, min_runs: int = 7, min_seconds: float = 0.3, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load() -> str:
    """The 1/5/15-minute load averages (printed before and after every benchmark: this
    machine is shared, and a figure means little without the load it was taken under)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def top_level_compiles():
    """``(listener, compiles)``: a Numba ``numba:compile`` listener (install it with
    ``numba.core.event.install_listener("numba:compile", listener)``) that appends
    ``[qualname, CPU seconds]`` to ``compiles`` for each top-level compile (a kernel's callees
    compiled on its behalf count in its time)."""
    from numba.core import event

    depth, compiles = [0], []

    class Compiles(event.Listener):
        def on_start(self, ev):
            depth[0] += 1
            if depth[0] == 1:
                compiles.append([ev.data["dispatcher"].py_func.__qualname__, time.process_time()])

        def on_end(self, ev):
            depth[0] -= 1
            if depth[0] == 0:
                compiles[-1][1] = time.process_time() - compiles[-1][1]

    return Compiles(), compiles


def interleaved(
    contenders: dict, *, rounds: int = 15, block_s: float = 0.002, timer=time.perf_counter, threads=None, warm=False
):
    """Time every contender in turn, round after round, so that a burst of load from the
    neighbours hits all of them alike; returns ``{name: torch.utils.benchmark.Measurement}``
    (``.median``, ``.iqr`` over the ``rounds`` blocks, per call).

    The harness is ``torch.utils.benchmark`` (maintained with torch, already pinned for the
    tests): its ``Timer`` runs in this process, so the peers (fbgemm, torch) and embnum
    share one process and can be interleaved block by block, which pyperf's worker
    processes and pytest-benchmark's one-benchmark-at-a-time runs do not give. Each block
    calls the contender enough times to last about ``block_s``. ``timer``:
    ``time.perf_counter`` (wall) or ``time.thread_time`` (this thread's CPU time: on a
    loaded machine it leaves out the time the thread waited for a core). ``threads``:
    torch's thread count during the timing (the Timer's default is 1). ``warm``: call each contender
    once, untimed, before each of its blocks, so that its first timed call does not pay for what the
    previous contender left behind (e.g. ~27 MB of dirty output lines written back during the next
    call's misses: a kernel timed after a read-only one looked several ms faster than after a writer)."""
    from torch.utils import benchmark

    n_threads = threads or optional_torch().get_num_threads()
    timers = {
        k: benchmark.Timer(stmt="fn()", globals={"fn": fn}, label=k, timer=timer, num_threads=n_threads)
        for k, fn in contenders.items()
    }
    numbers = {}
    for k, t in timers.items():  # calibrate (and warm up) each contender
        n = 1
        while True:
            m = t.timeit(n)
            if m.raw_times[0] >= block_s or n >= 1 << 20:
                break
            n *= 4
        numbers[k] = n
    blocks = {k: [] for k in contenders}
    for _ in range(rounds):
        for k, t in timers.items():
            if warm:
                contenders[k]()
            blocks[k].append(t.timeit(numbers[k]))
    return {k: benchmark.Measurement.merge(ms)[0] for k, ms in blocks.items()}


def fmt_us(m) -> str:
    """``median [IQR]`` of a Measurement in microseconds."""
    return f"{m.median * 1e6:.2f} [{m.iqr * 1e6:.2f}]"


def optional_torch():
    """torch, or None where it is not installed (the benchmarks then skip its column)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def optional_fbgemm(torch):
    """``torch.ops.fbgemm`` once fbgemm_gpu is imported, or None where it is not installed."""
    if torch is None:
        return None
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception:  # noqa: BLE001  (fbgemm_gpu raises more than ImportError on a torch mismatch)
        return None
    return torch.ops.fbgemm


def bridge_tensors(torch, spec, args: dict) -> dict:
    """``args`` with every array (lists of arrays too) as a CPU tensor sharing its memory,
    encoded as the bridge's schema takes them (``spec``: ``embnum.torch_bridge.BRIDGES[name]``)."""

    def conv(a):
        if isinstance(a, np.ndarray):
            return torch.from_numpy(a)
        if isinstance(a, list):
            return [conv(x) for x in a]
        return a

    return spec.encode({k: conv(a) for k, a in args.items()})


def copy_floor(nbytes_read: int, nbytes_written: int) -> float:
    """Time a plain NumPy copy of the same traffic takes (the memory floor of a data-movement op)."""
    n = max(nbytes_read, nbytes_written)
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty(n, dtype=np.uint8)
    t = median_time(lambda: np.copyto(dst, src))
    return t * (nbytes_read + nbytes_written) / (2 * n)


def machine() -> str:
    import numba

    cpu = platform.processor() or platform.machine()
    try:
        model = subprocess.run(
            ["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True
        ).stdout
        cpu = model.split(":", 1)[1].strip() or cpu
    except (OSError, IndexError):
        pass
    lines = [
        f"- machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"- numpy {np.__version__}, numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads)",
    ]
    try:
        import torch

        lines.append(f"- torch {torch.__version__} ({torch.get_num_threads()} threads)")
        import fbgemm_gpu

        lines.append(f"- fbgemm_gpu {getattr(fbgemm_gpu, '__version__', '?')}")
    except ImportError:
        lines.append("- fbgemm_gpu not importable: no peer column")
    return "\n".join(lines)


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table of ``rows`` (dicts) with ``columns``."""
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(out)


def default_backends(asked, host=("cpu",)) -> list[str]:
    """The embnum backends to time: those ``asked`` for, else ``host`` plus cuda where a GPU is usable."""
    import embnum

    gpu = embnum._backend.gpu_present() and embnum._backend.BACKENDS["cuda"].available()
    return asked or list(host) + (["cuda"] if gpu else [])


def embnum_runner(fn, backend: str, host_args: dict, out=None):
    """A callable running ``fn`` on ``backend`` (and waiting for it) with ``host_args``'
    arrays, and lists of arrays, moved to that backend once, here; ``out``: an output to
    reuse (``"reuse"``: one the op allocates here, once)."""
    import embnum

    be = embnum._backend.BACKENDS[backend]
    move = lambda v: (  # noqa: E731
        be.from_host(v) if isinstance(v, np.ndarray) else [be.from_host(x) for x in v] if isinstance(v, list) else v
    )
    dev_args = {k: move(v) for k, v in host_args.items()}
    if out is not None:
        dev_args["out"] = fn(**dev_args, backend=backend) if isinstance(out, str) else out

    def run():
        fn(**dev_args, backend=backend)
        be.synchronize()

    return run


@dataclasses.dataclass
class Case:
    """One row of a comparison: ``embnum.<op>(**args)`` beside its peers.

    ``nread`` / ``nwritten``: the bytes the op must read and write (the copy floor copies as
    many); ``fbgemm`` / ``torch``: the peers' calls (None: no such peer); ``reuse``: also time
    embnum into a reused output (``embnum out=``: the kernel without the first touch of
    fresh pages, which every allocating call on either side pays)."""

    op: str
    input: str
    args: dict
    nread: int
    nwritten: int
    fbgemm: Callable | None = None
    torch: Callable | None = None
    reuse: bool = False


def copy_contenders(nread: int, nwritten: int, fresh: bool = False) -> dict:
    """``copy floor``: a NumPy copy moving ``nread + nwritten`` bytes into a reused buffer;
    with ``fresh``, ``fresh copy``: the same copy into a new array of the op's output size
    (``nwritten`` bytes or more) each call, the floor of an op that returns new arrays: from
    32 MiB on (glibc's largest mmap threshold) every such array is a fresh mapping whose pages
    the kernel zeroes at first touch; smaller ones are reused from the heap."""
    n = max(1, (nread + nwritten) // 2)
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty(n, dtype=np.uint8)
    out = {"copy floor": lambda: np.copyto(dst, src)}
    if fresh:
        size = max(n, nwritten)
        out["fresh copy"] = lambda: np.copyto(np.empty(size, dtype=np.uint8)[:n], src)
    return out


def timed_row(row: dict, contenders: dict, *, rounds: int = 15, block_s: float = 0.002) -> dict:
    """Time ``contenders`` interleaved (:func:`interleaved`) and put each one's
    ``median [IQR]`` in ms into ``row``; returns the Measurements."""
    ms = interleaved(contenders, rounds=rounds, block_s=block_s)
    for k, m in ms.items():
        row[k] = fmt_ms_iqr(m)
    return ms


def fmt_ms_iqr(m) -> str:
    """``median [IQR]`` of a Measurement in milliseconds."""
    return f"{m.median * 1e3:.3f} [{m.iqr * 1e3:.3f}]"


def ratio_cells(row: dict, ms: dict, main: str, peers=("fbgemm cpu", "torch"), floors=("copy floor", "fresh copy")):
    """``<peer> / embnum`` (medians; min over the rounds in parentheses) and ``embnum / <floor>``
    columns of ``row``, for the contender ``main``."""
    best = lambda m: min(m.times)  # noqa: E731
    for p in peers:
        if p in ms:
            row[f"{p.split()[0]} / embnum"] = (
                f"{ms[p].median / ms[main].median:.2f}x ({best(ms[p]) / best(ms[main]):.2f}x)"
            )
    for f in floors:
        if f in ms:
            row[f"embnum / {f.split()[0]}"] = f"{ms[main].median / ms[f].median:.2f}"


def run_cases(cases, backends: list[str], *, fresh: bool = False, rounds: int = 15) -> tuple[list[dict], list[str]]:
    """Every :class:`Case` timed with its peers and copy floors, interleaved in this process;
    returns the rows and their columns (ready for :func:`table`)."""
    import embnum

    main = f"embnum {'cpu' if 'cpu' in backends else backends[-1]}"
    rows, columns = [], ["op", "input"] + [f"embnum {b}" for b in backends]
    for c in cases:
        fn = getattr(embnum, c.op)
        contenders = {f"embnum {b}": embnum_runner(fn, b, c.args) for b in backends}
        if c.reuse:
            contenders["embnum out="] = embnum_runner(fn, main.split()[1], c.args, out="reuse")
        contenders.update({k: v for k, v in (("fbgemm cpu", c.fbgemm), ("torch", c.torch)) if v is not None})
        contenders.update(copy_contenders(c.nread, c.nwritten, fresh))
        row = {"op": c.op, "input": c.input}
        ratio_cells(row, timed_row(row, contenders, rounds=rounds), main)
        if c.reuse and "fbgemm cpu" in contenders:
            row["fbgemm / out="] = f"{_median_ratio(row, 'fbgemm cpu', 'embnum out='):.2f}x"
        rows.append(row)
        print(f"  {c.op}: done", file=sys.stderr, flush=True)
    return rows, ordered_columns(rows, columns)


_ORDER = ("embnum", "bridge", "fbgemm cpu", "torch", "copy floor", "fresh copy")


def ordered_columns(rows: list[dict], first: list[str]) -> list[str]:
    """``first``, then every other key of ``rows``: times (embnum's, the peers', the floors'),
    then the ratios, each group in order of first appearance."""
    keys = [k for r in rows for k in r if k not in first]
    keys = list(dict.fromkeys(keys))
    rank = lambda k: next((i for i, p in enumerate(_ORDER) if k.startswith(p) and " / " not in k), len(_ORDER))  # noqa: E731
    return first + sorted(keys, key=rank)


def _median_ratio(row, a, b) -> float:
    return float(row[a].split()[0]) / float(row[b].split()[0])


def report(program: str, body) -> None:
    """Print the machine, the command and the load, run ``body()`` (which returns the rows
    and columns of one table), print the load again, then the markdown table."""
    print(machine())
    print(f"- command: python benchmarks/{program} {' '.join(sys.argv[1:])}".rstrip())
    print(f"- before: {load()}", flush=True)
    rows, columns = body()
    print(f"- after: {load()}")
    print("\nms per call: median [IQR] over interleaved rounds; ratios of medians (of minima)\n")
    print(table(rows, columns))


def fbgemm_tbe(T: int, rows: int, D: int, *, optimizer: str = "EXACT_ROWWISE_ADAGRAD", lr: float = 0.01, fp16=False):
    """fbgemm_gpu's CPU training TBE module (``SplitTableBatchedEmbeddingBagsCodegen``): ``T``
    tables of ``rows x D`` on the host, SUM pooling, ``optimizer`` (an ``EmbOptimType`` name),
    float16 weights when ``fp16``; None where fbgemm_gpu is not usable."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as exc:  # noqa: BLE001  (fbgemm_gpu raises more than ImportError on a torch mismatch)
        print(f"fbgemm_gpu not usable: {exc}")
        return None
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T,
        optimizer=getattr(EmbOptimType, optimizer),
        learning_rate=lr,
        eps=1e-8,
        pooling_mode=PoolingMode.SUM,
        weights_precision=SparseType.FP16 if fp16 else SparseType.FP32,
        device="cpu",
    )


def set_threads(n: int) -> None:
    """Numba's and torch's thread counts to ``n`` (torch's only where it is installed)."""
    import numba

    numba.set_num_threads(n)
    torch = optional_torch()
    if torch is not None:
        torch.set_num_threads(n)


def tbe_arguments(doc: str, *, T: int, rows: int, B: int, D: int = 128, L: int = 20):
    """An argument parser with the TBE batch's shape (``--T --rows --D --B --L``, these
    defaults) and ``--threads`` (default 1 and 2), described by ``doc``'s first paragraph."""
    import argparse

    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in (("T", T), ("rows", rows), ("D", D), ("B", B), ("L", L)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    return p
