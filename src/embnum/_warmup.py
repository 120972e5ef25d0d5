"""``python -m embnum warmup``: fill the kernels' disk cache ahead of the first call.

Each op runs its tour examples (the small one, which takes the one-thread kernels, and the
large one, which takes the parallel ones) on the chosen backends, so that every kernel those
calls reach is compiled and saved (``embnum._jit``: safe with several processes writing
one cache). The families are shared out among ``jobs`` worker processes (started fresh, not
forked), heaviest first; a family's ops run in one process, in turn. The TBE ops run their
examples with int32 lookups too (:data:`INT32_LOOKUPS`). Other argument types (another index
dtype, another optimizer) compile on their own first call.

For a container image or a CI cache: run it once with ``NUMBA_CACHE_DIR`` pointing at the
directory to keep (or with the sources writable: ``__pycache__`` next to them). For a wheel:
``--prebuilt`` (:func:`prebuild`) compiles for a baseline CPU into the package instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import shutil
import tempfile
import time

from . import _prebuilt
from ._environ import environ

# families whose kernels take longest to compile go first, so the pool ends together
_ORDER = ("tbe", "tbe_quantized", "kjt", "quant", "keyed_tensor", "jagged")
SIZES = ("small", "large")


def _copies(args: dict) -> dict:
    import numpy as np

    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}


Warmed = tuple[str, float, str | None]  # (op name, seconds, error or None)


@contextlib.contextmanager
def compiled_kernels():
    """A block in which every kernel Numba compiles is listed (the yielded list gets each one's
    qualified name; a kernel loaded from a cache, or from the prebuilt kernels, is no compile)."""
    from numba.core import event

    names: list[str] = []

    class Compiles(event.Listener):
        def on_start(self, ev):
            names.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Compiles()):
        yield names


# TorchRec hands fbgemm's TBE ops int32 lookups (its KeyedJaggedTensors') as often as int64 ones:
# a warmup also runs these families' examples with int32 indices and offsets (the tour's workers
# do not: the tour runs the examples as they are).
INT32_LOOKUPS = ("tbe", "tbe_quantized")


def _argument_sets(op, args: dict, int32_lookups: bool) -> list[dict]:
    if not (int32_lookups and op.family in INT32_LOOKUPS):
        return [args]
    return [args, dict(args, indices=args["indices"].astype("int32"), offsets=args["offsets"].astype("int32"))]


def warm_op(name: str, backends: tuple[str, ...], sizes: tuple[str, ...] = SIZES, int32_lookups=False) -> Warmed:
    """Run op ``name``'s examples of ``sizes`` on ``backends`` in this process (with
    ``int32_lookups``, the TBE families' once more with int32 indices and offsets); return
    ``(name, seconds, error or None)``."""
    import numpy as np

    from . import _registry
    from ._backend import BACKENDS

    t0 = time.perf_counter()
    try:
        op = _registry.get(name)
        for size in sizes:
            example = op.example_fn(np.random.default_rng(0), size)
            for host_args in _argument_sets(op, example.args, int32_lookups):
                for backend in backends:
                    to = BACKENDS[backend].from_host
                    args = {k: to(v) if isinstance(v, np.ndarray) else v for k, v in host_args.items()}
                    op.public(**(_copies(args) if op.mutates else args), backend=backend)
                    BACKENDS[backend].synchronize()
    except Exception as exc:  # noqa: BLE001 - reported per op; the others go on
        return name, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
    return name, time.perf_counter() - t0, None


def warm_ops(
    names: list[str], backends: tuple[str, ...], done_dir: str | None = None, int32_lookups=False
) -> list[tuple[str, float, str | None]]:
    """:func:`warm_op` for each of ``names``, in order, in this process; with ``done_dir``, an
    empty file named after each op there once it is warm (what :meth:`Ahead.wait` looks for)."""
    results = []
    for name in names:
        results.append(warm_op(name, backends, int32_lookups=int32_lookups))
        if done_dir is not None:
            open(os.path.join(done_dir, name), "wb").close()
    return results


def plan(families=None, ops=None) -> list[str]:
    """The ops to warm, heaviest family first."""
    from . import _registry

    chosen = [op for op in _registry.ops() if (not families or op.family in families) and (not ops or op.name in ops)]
    rank = {f: i for i, f in enumerate(_ORDER)}
    return [op.name for op in sorted(chosen, key=lambda op: rank.get(op.family, len(rank)))]


def compiled_backends() -> tuple[str, ...]:
    """The backends whose kernels a disk cache keeps here: ``cpu``, and ``cuda`` on a GPU
    (the simulator compiles nothing)."""
    from ._backend import BACKENDS, available_backends

    return tuple(
        b for b in available_backends() if b == "cpu" or (b == "cuda" and not getattr(BACKENDS[b], "simulated", True))
    )


def _by_family(names: list[str]) -> list[list[str]]:
    """``names`` grouped by family, in order: one worker's task. A family's ops share kernels
    (the cumsums one scan, the TBE ops their row loops), which one process then compiles once."""
    from . import _registry

    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_registry.get(name).family, []).append(name)
    return list(groups.values())


def _front_and_back(groups: list) -> list:
    """``groups`` taken from the front and the back in turn: the first a caller reaches is
    ready soonest, and the last (the TBE families, the heaviest) start early too."""
    order = []
    while groups:
        order.append(groups.pop(0))
        if groups:
            order.append(groups.pop())
    return order


class Ahead:
    """Worker processes that warm the families of ``names`` (in the order a caller will run
    them) while the caller goes on; :meth:`wait` before the caller's first call of an op.

    An op whose family a worker has started is waited for until that op is warm (its kernels
    are then loaded from the cache, not compiled a second time; the rest of its family goes on
    in the worker); a family no worker has started yet is dropped from the queue and the caller
    compiles it on its own first call. A worker's failure only costs its head start: the
    caller's own call reports the op's error."""

    POLL_SECONDS = 0.01

    def __init__(self, names: list[str], backends: tuple[str, ...], jobs: int):
        ctx = multiprocessing.get_context("spawn")  # a fork would copy Numba's started thread pool
        self._done = tempfile.mkdtemp(prefix="embnum-ahead-")
        self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
        self._futures: dict[str, concurrent.futures.Future] = {}
        for group in _front_and_back(_by_family(names)):
            future = self._pool.submit(warm_ops, group, backends, self._done)
            self._futures.update(dict.fromkeys(group, future))

    def wait(self, name: str) -> None:
        """Return once op ``name`` is warm (or its worker ended), or at once when no worker has
        started its family."""
        future = self._futures.get(name)
        if future is None or future.cancel():
            return
        marker = os.path.join(self._done, name)
        while not future.done() and not os.path.exists(marker):
            time.sleep(self.POLL_SECONDS)

    def close(self) -> None:
        """Stop the workers (a family still queued is not started)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self._done, ignore_errors=True)


def warmup(names: list[str], backends: tuple[str, ...], jobs: int, report=print) -> int:
    """Warm ``names`` on ``backends`` with ``jobs`` worker processes (the TBE families' examples
    with int32 lookups too); ``report`` each op's line. Returns the number of ops that failed."""
    t0 = time.perf_counter()
    failed = 0
    ctx = multiprocessing.get_context("spawn")  # a fork would copy Numba's started thread pool
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        futures = [pool.submit(warm_ops, group, backends, int32_lookups=True) for group in _by_family(names)]
        for future in concurrent.futures.as_completed(futures):
            for name, seconds, error in future.result():
                failed += error is not None
                report(f"{name:34s} {seconds:7.1f} s  {error or 'ok'}")
    report(
        f"warmed {len(names) - failed} of {len(names)} ops on {', '.join(backends)} in "
        f"{time.perf_counter() - t0:.1f} s with {jobs} processes"
        f" (cache: {os.environ.get('NUMBA_CACHE_DIR') or '__pycache__ beside the sources'})"
    )
    return failed


def prebuild(names: list[str], jobs: int, into: str = _prebuilt.DEFAULT_ROOT, report=print) -> int:
    """``warmup --prebuilt``: compile the cpu kernels of ops ``names`` for the baseline CPU
    (``embnum._prebuilt``) on an empty cache, then keep that cache's files in ``into``, one
    directory per package (replacing what was there); returns the number of ops that failed
    (then ``into`` is left as it was)."""
    from numba.core.caching import _CacheLocator

    into = os.path.abspath(into)
    packages = [d for d, _, _ in os.walk(_prebuilt.PACKAGE) if "__pycache__" not in d and not d.startswith(into)]
    cache = tempfile.mkdtemp(prefix="embnum-prebuilt-")
    staged = cache + ".staged"
    try:
        env = {
            _prebuilt.ENV: "",  # compile every kernel, none loaded from an earlier build
            "NUMBA_CACHE_DIR": cache,
            "NUMBA_CPU_NAME": _prebuilt.BASELINE_CPU,
            "NUMBA_CPU_FEATURES": _prebuilt.features(),
        }
        with environ(env):  # the spawned workers' Numba reads them at its import
            failed = warmup(names, ("cpu",), jobs, report)
        if failed:
            return failed
        kept = 0
        for directory in packages:
            # where Numba's NUMBA_CACHE_DIR locator put the kernels of this package's modules
            source = os.path.join(cache, _CacheLocator.get_suitable_cache_subpath(os.path.join(directory, "x.py")))
            entries = [e for e in os.listdir(source) if e.endswith((".nbi", ".nbc"))] if os.path.isdir(source) else []
            if entries:
                target = os.path.join(staged, _prebuilt.package_key(directory))
                os.makedirs(target)
                for e in entries:
                    shutil.copy2(os.path.join(source, e), target)
                kept += len(entries)
        shutil.rmtree(into, ignore_errors=True)
        shutil.move(staged, into)
        report(f"prebuilt for {_prebuilt.BASELINE_CPU}: {kept} files in {into}")
        return 0
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(staged, ignore_errors=True)
