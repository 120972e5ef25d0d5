"""Local process groups: spawn ``world_size`` processes on this machine, and failure agreement.

:func:`spawn` runs ``fn(rank, world_size, *args)`` in fresh processes, each
with an initialised process group (gloo by default) whose collectives time
out after ``timeout_s``, small thread counts (``OMP_WAIT_POLICY=PASSIVE``,
one torch/Numba thread unless told otherwise) and returns every rank's
result. When a rank raises, the others are given until the deadline to fail
too; whatever is still running then is terminated and killed, so no process
is left behind; :class:`SpawnError` carries every rank's error.

Failure agreement: :func:`publish_failure` writes "rank r failed: ..." into
the process group's store and aborts the group, so peers blocked in a
collective fail at once instead of at the timeout. A rank whose collective
failed calls :func:`name_failure` (through :func:`failure_of`): it reads a
published failure back, or finds which rank did not answer in the store (dead,
or stuck outside the collectives), or that the store's host died, so each
survivor's :class:`RankFailedError` names the rank to blame.

Timeouts: :data:`TIMEOUT_S` (60 s) is the collective timeout of :func:`spawn`
and :func:`init_process_group`; :data:`ANSWER_S` (5 s) how long survivors wait
for each other after a failed collective.
"""

from __future__ import annotations

import datetime
import queue as _queue
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .._environ import environ

_KEY = "embnum/failed"
_ACK = "embnum/failure_acks"
_ALIVE = "embnum/alive/"  # + rank: written by every rank that survived a failed collective
_DONE = "embnum/verdicts_read"
ANSWER_S = 5.0  # how long survivors wait for each other's "alive" after a failed collective
TIMEOUT_S = 60.0  # spawn's collective timeout: a training step on CPUs or GPUs is far shorter


class SpawnError(RuntimeError):
    """One or more spawned ranks failed; ``errors`` maps rank -> error text, ``results`` rank ->
    the result of each rank that finished."""

    def __init__(self, errors: dict[int, str], message: str, results: dict | None = None):
        super().__init__(message)
        self.errors = errors
        self.results = results or {}


class RankFailedError(RuntimeError):
    """A collective failed because another rank raised; ``rank`` is the one that failed first."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank, world_size, port, backend="gloo", timeout_s=TIMEOUT_S, host="127.0.0.1"):
    """``dist.init_process_group`` over TCP at ``host:port`` with a collective timeout."""
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


_STORE = {}  # "store" (kept alive after the group is aborted: rank 0 hosts it), "rank", "world"


def remember_store():
    """Keep the default store, rank and world size (call once after init; failure agreement needs them)."""
    if dist.is_initialized() and "store" not in _STORE:
        _STORE.update(
            store=dist.distributed_c10d._get_default_store(), rank=dist.get_rank(), world=dist.get_world_size()
        )


def _abort_group():
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()  # closes the connections now: peers blocked in a collective fail at once
    else:
        dist.destroy_process_group()


def _linger(store, world, wait_s):
    """Rank 0 hosts the store: keep it up until every peer has read the failure (or ``wait_s``)."""
    if _STORE.get("rank") != 0:
        return
    deadline = time.monotonic() + wait_s
    while int(store.add(_ACK, 0)) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def publish_failure(exc: BaseException, where: str = "forward", wait_s: float = 10.0) -> None:
    """Tell every peer that this rank failed (``exc``) through the store, abort the process group so
    their collectives fail now, and (rank 0, the store's host) wait up to ``wait_s`` for them to read it."""
    remember_store()
    if "store" not in _STORE:
        return
    store, rank, world = _STORE["store"], _STORE["rank"], _STORE["world"]
    message = f"rank {rank} failed in {where}: {type(exc).__name__}: {exc}"
    try:
        store.compare_set(_KEY, "", message)  # the first failure wins
        if dist.is_initialized():
            _abort_group()
        _linger(store, world, wait_s)
    except Exception:  # noqa: BLE001 - the store may be gone already; the original error still propagates
        pass


def peer_failure(wait_s: float = 5.0) -> RankFailedError | None:
    """The failure a peer published (waiting up to ``wait_s`` for it), or ``None``."""
    remember_store()
    if "store" not in _STORE:
        return None
    store = _STORE["store"]
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            found = _published(store)
            if found is not None:
                _linger(store, _STORE["world"], wait_s)
                return found
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store died with its host
        return None
    return None


def _published(store) -> RankFailedError | None:
    """The failure a peer wrote into the store (acknowledged), or ``None``."""
    if store.check([_KEY]):
        message = store.get(_KEY).decode()
        if message:
            store.add(_ACK, 1)
            rank = int(message.split()[1]) if message.startswith("rank ") else -1
            return RankFailedError(rank, message)
    return None


def name_failure(exc: BaseException, where: str, wait_s: float = ANSWER_S) -> RankFailedError:
    """After a collective failed on this rank (``exc``: a peer's connection closed, or the timeout):
    the rank to blame, as a :class:`RankFailedError`.

    This rank aborts its process group (so peers blocked with it fail now rather than at their
    timeout) and writes "alive" into the store; then, for up to ``wait_s`` seconds, it reads the
    store for a failure a peer published (:func:`publish_failure`) or every rank's "alive". A
    rank that does not answer died or is stuck outside the collectives; when the store itself is
    unreachable its host (rank 0 under :func:`spawn` and ``tcp://`` / ``env://`` initialisation)
    died. Rank 0 keeps its store up until the ranks that answered have read their verdict (at most
    ``wait_s`` more), so nobody is left waiting on it.
    """
    remember_store()
    rank, world = _STORE.get("rank", -1), _STORE.get("world", 0)
    detail = (str(exc).splitlines() or [""])[0].split(" This is typically")[0]  # gloo appends advice
    what = f"rank {rank}: {where} failed ({type(exc).__name__}: {detail})"
    if dist.is_initialized():
        try:
            _abort_group()
        except Exception:  # noqa: BLE001 - already broken; the verdict below is what matters
            pass
    if "store" not in _STORE:
        return RankFailedError(-1, f"{what}; no store to ask which rank failed")
    store = _STORE["store"]
    try:
        store.set(f"{_ALIVE}{rank}", "1")
    except Exception:  # noqa: BLE001 - the store's host is gone
        return RankFailedError(0, f"{what}: rank 0 died (the store it hosts is unreachable)")
    try:
        deadline = time.monotonic() + wait_s
        answered: list[int] = []
        while True:
            found = _published(store)
            if found is not None:
                store.add(_DONE, 1)
                _linger(store, world, wait_s)
                return RankFailedError(found.rank, f"{what}: {found}")
            answered = [r for r in range(world) if store.check([f"{_ALIVE}{r}"])]
            if len(answered) == world or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        store.add(_DONE, 1)
        if rank == 0:
            end = time.monotonic() + wait_s
            while int(store.add(_DONE, 0)) < len(answered) and time.monotonic() < end:
                time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store died while we waited: its host died
        return RankFailedError(0, f"{what}: rank 0 died (the store it hosts became unreachable)")
    silent = [r for r in range(world) if r not in answered]
    if not silent:
        return RankFailedError(
            -1, f"{what}; every rank answered afterwards (a collective took longer than the timeout?)"
        )
    return RankFailedError(
        silent[0],
        f"{what}: rank {silent[0]} did not answer within {wait_s:g}s (it died or is stuck)"
        + (f"; nor did ranks {silent[1:]}" if len(silent) > 1 else ""),
    )


def failure_of(exc: BaseException, where: str) -> BaseException:
    """What a rank raises when ``exc`` ended its step: a :class:`RankFailedError` naming the rank
    to blame when a collective failed (:func:`name_failure`); else ``exc`` itself, published first
    so that the peers name this rank (:func:`publish_failure`)."""
    if isinstance(exc, RankFailedError):
        return exc
    if collective_error(exc):
        return name_failure(exc, where)
    publish_failure(exc, where)
    return exc


def collective_error(e: BaseException) -> bool:
    """A failed collective (a peer closed its connection, or the timeout) rather than a local error."""
    names = {"DistBackendError", "DistNetworkError", "DistError", "DistStoreError"}
    if type(e).__name__ in names:
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        w in text for w in ("Connection closed", "Connection reset", "Timed out", "timed out", "gloo", "NCCL")
    )


def _entry(fn, rank, world_size, port, backend, timeout_s, threads, args, results):
    torch.set_num_threads(threads)
    try:
        init_process_group(rank, world_size, port, backend, timeout_s)
        remember_store()
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, world_size: int, args=(), *, backend="gloo", timeout_s=TIMEOUT_S, deadline_s=None, threads=1) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes; return the results
    in rank order. ``fn`` must be importable (a module-level function) and its result picklable.

    ``timeout_s``: the collective timeout; ``deadline_s``: the whole run (default ``3 * timeout_s
    + 120``). Raises :class:`SpawnError` when a rank fails or the deadline passes.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else 3 * timeout_s + 120)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    env = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads), "NUMBA_NUM_THREADS": str(threads)}
    with environ(env):
        procs = [
            ctx.Process(target=_entry, args=(fn, r, world_size, port, backend, timeout_s, threads, args, results))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
    values, errors = {}, {}
    try:
        while len(values) + len(errors) < world_size and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                (values if status == "ok" else errors)[rank] = value
            except _queue.Empty:
                for r, p in enumerate(procs):  # died without reporting (killed, segfault)
                    if p.exitcode is not None and r not in values and r not in errors and results.empty():
                        errors[r] = f"exited with code {p.exitcode} without a result"
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(3)
            if p.is_alive():
                p.kill()
                p.join(3)
        results.close()
    missing = [r for r in range(world_size) if r not in values and r not in errors]
    for r in missing:
        errors[r] = "did not finish before the deadline (terminated)"
    if errors:
        text = "\n".join(f"rank {r}: {errors[r]}" for r in sorted(errors))
        raise SpawnError(errors, f"{len(errors)} of {world_size} ranks failed:\n{text}", values)
    return [values[r] for r in range(world_size)]
