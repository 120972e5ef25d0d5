"""Timing and reporting shared by the benchmark programs (not a test)."""

from __future__ import annotations

import os

# Set before torch or Numba load an OpenMP runtime: with two pools in one
# process, spinning idle threads of one steal the cores of the other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import platform
import statistics
import subprocess
import time

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


def interleaved(contenders: dict, *, rounds: int = 15, block_s: float = 0.002, timer=time.perf_counter, threads=None):
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
    torch's thread count during the timing (the Timer's default is 1)."""
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


PEER_COLUMNS = ["fbgemm cpu", "torch", "copy floor", "fbgemm / embnum", "embnum / floor"]


def default_backends(asked, host=("cpu",)) -> list[str]:
    """The embnum backends to time: those ``asked`` for, else ``host`` plus cuda where a GPU is usable."""
    import embnum

    gpu = embnum._backend.gpu_present() and embnum._backend.BACKENDS["cuda"].available()
    return asked or list(host) + (["cuda"] if gpu else [])


def embnum_runner(fn, backend: str, host_args: dict):
    """A callable running ``fn`` on ``backend`` (and waiting for it) with ``host_args``'
    arrays, and lists of arrays, moved to that backend once, here."""
    import embnum

    be = embnum._backend.BACKENDS[backend]
    move = lambda v: (
        be.from_host(v) if isinstance(v, np.ndarray) else [be.from_host(x) for x in v] if isinstance(v, list) else v
    )  # noqa: E731
    dev_args = {k: move(v) for k, v in host_args.items()}

    def run():
        fn(**dev_args, backend=backend)
        be.synchronize()

    return run


def add_ratios(row: dict, backends: list[str]) -> None:
    """The ``fbgemm / embnum`` and ``embnum / floor`` columns of ``row``, from the cpu backend
    (or the last one timed)."""
    main_backend = row[f"embnum {'cpu' if 'cpu' in backends else backends[-1]}"]
    row["fbgemm / embnum"] = f"{row['fbgemm cpu'] / main_backend:.1f}x" if row["fbgemm cpu"] else "-"
    row["embnum / floor"] = f"{main_backend / row['copy floor']:.2f}"


def print_ms_table(rows: list[dict], backends: list[str]) -> None:
    """Print ``rows`` as a markdown table of milliseconds (``-`` where a contender is missing)."""
    columns = ["op", "input"] + [f"embnum {b}" for b in backends] + PEER_COLUMNS
    for r in rows:
        for c in columns:
            if isinstance(r.get(c), float) or r.get(c) is None and c not in ("op", "input"):
                r[c] = fmt_ms(r.get(c))
    print("\ntimes in ms\n")
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


def copier(nbytes: int):
    """A callable copying ``nbytes`` between two preallocated buffers (a memory floor
    timed beside the contenders: reads ``nbytes`` and writes ``nbytes``)."""
    src = np.ones(max(nbytes, 1), dtype=np.uint8)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def set_threads(n: int) -> None:
    """Numba's and torch's thread counts to ``n`` (torch's only where it is installed)."""
    import numba

    numba.set_num_threads(n)
    torch = optional_torch()
    if torch is not None:
        torch.set_num_threads(n)


def fmt_ms_iqr(m) -> str:
    """``median [IQR]`` of a Measurement in milliseconds."""
    return f"{m.median * 1e3:.2f} [{m.iqr * 1e3:.2f}]"
