"""Helpers shared by the Numba-CUDA kernels: launch shapes, array module, offset walks,
half precision (``embnum._half`` compiled as device functions, one float16 table per
device, float32 accumulation rounded once: :func:`float32_result`, :func:`round_once`).

On a GPU the kernels take CuPy arrays; under the simulator
(``NUMBA_ENABLE_CUDASIM=1``) they take NumPy arrays, and blocks are kept
small because every simulated thread is a Python thread.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import numpy as np
from numba import cuda, types
from numba.np import numpy_support

from .. import _half, _offsets_walk
from .._backend import cuda_simulated, to_host  # noqa: F401 - to_host: the one device-to-host copy
from .._jit import cuda_kernel

SIMULATED = cuda_simulated()
# Threads per block (a power of two). Under the simulator every thread is a Python thread, so
# blocks are small unless EMBNUM_SIM_TPB asks for the production size (tests/test_cuda_blocks.py).
TPB = int(os.environ.get("EMBNUM_SIM_TPB", "8")) if SIMULATED else 256
MAX_BLOCKS = 8 if SIMULATED else 8192  # grid-stride loops cover the rest
LANES = min(32, TPB)  # threads that share one row: a warp on a GPU

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def xp():
    if SIMULATED:
        return np
    import cupy

    return cupy


def blocks(n_items: int, per_block: int = 1) -> int:
    """Blocks for ``n_items`` work items of which one block takes ``per_block`` per pass."""
    return max(1, min(MAX_BLOCKS, -(-n_items // per_block)))


def contiguous(a):
    """``a`` itself when it already is a C-contiguous array of the backend's own type (at least 1-d),
    else ``ascontiguousarray(a)`` (which also drops an array subclass)."""
    m = xp()
    return a if type(a) is m.ndarray and a.ndim and a.flags.c_contiguous else m.ascontiguousarray(a)


def bits(a):
    """``a`` as a contiguous unsigned-integer array of the same item size."""
    return contiguous(a).view(_UINT[a.dtype.itemsize])


def scalar_bits(x, dtype) -> int:
    return int(np.array(x, dtype=dtype).view(_UINT[np.dtype(dtype).itemsize])[()])


def int64s(a):
    return xp().ascontiguousarray(a, dtype=np.int64)


def pack_offsets(offsets):
    """J offsets arrays as one flat int64 device array plus the start of each ``[J+1]``."""
    m = xp()
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([int(o.shape[0]) for o in offsets])
    flat = m.concatenate([m.asarray(o, dtype=np.int64) for o in offsets])
    return flat, constant(starts)  # uploaded once per device and layout


leaf_segment = cuda.jit(device=True)(_offsets_walk.leaf_segment)
slab_of_segment = cuda.jit(device=True)(_offsets_walk.slab_of_segment)
segment_of = cuda.jit(device=True)(_offsets_walk.segment_of)


# -- lane-group exchange ------------------------------------------------------------------
FULL_MASK = 0xFFFFFFFF

if SIMULATED:

    @cuda.jit(device=True)
    def shfl_xor(v, off):
        """The value ``v`` of lane ``lane ^ off`` of this lane group. The simulator has no warp
        shuffles, so there the exchange goes through shared memory (float64: exact for float32
        values and for integers below 2**53); every thread of the block must call it, as on a
        GPU every lane of the warp must call ``shfl_xor_sync``."""
        buf = cuda.shared.array(TPB, np.float64)
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        buf[tid] = v
        cuda.syncthreads()
        return buf[tid ^ off]

    @cuda.jit(device=True)
    def peers(key):
        """The bit mask of the lanes of this lane group whose int64 ``key`` equals this lane's
        (``match.any.sync`` on a GPU; the simulator has none, so the keys go through shared
        memory); every thread of the block must call it."""
        buf = cuda.shared.array(TPB, np.int64)
        tid = cuda.threadIdx.x
        first = tid - tid % LANES
        cuda.syncthreads()
        buf[tid] = key
        cuda.syncthreads()
        mask = np.int64(0)
        for j in range(LANES):
            if buf[first + j] == key:
                mask |= np.int64(1) << j
        return mask

    @cuda.jit(device=True)
    def sync_lanes():
        """Wait for every lane of this lane group (the simulator has no warp barrier: a block
        barrier, so every thread of the block must call it, as every lane of the warp must on a GPU)."""
        cuda.syncthreads()

    @cuda.jit(device=True)
    def shfl_idx(v, src):
        """The integer ``v`` (int64) of lane ``src`` of this lane group (``shfl.sync.idx`` on a GPU;
        through shared memory here); every thread of the block must call it."""
        buf = cuda.shared.array(TPB, np.int64)
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        buf[tid] = v
        cuda.syncthreads()
        return buf[tid - tid % LANES + src]

    @cuda.jit(device=True)
    def loop_bound(x):
        """The largest int64 ``x`` over the threads that must run a loop of shuffles the same number
        of times: here the block (the simulator's shuffles are block barriers), on a GPU the warp.
        Every thread of the block calls it."""
        buf = cuda.shared.array(TPB, np.int64)
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        buf[tid] = x
        cuda.syncthreads()
        m = buf[0]
        for j in range(1, cuda.blockDim.x):
            m = max(m, buf[j])
        return m

else:

    @cuda.jit(device=True)
    def shfl_xor(v, off):
        """The value ``v`` of lane ``lane ^ off`` of this warp (``shfl.sync.bfly``); every lane of
        the warp must call it."""
        return cuda.shfl_xor_sync(FULL_MASK, v, off)

    @cuda.jit(device=True)
    def peers(key):
        """The bit mask of the lanes of this warp whose int64 ``key`` equals this lane's
        (``match.any.sync``); every lane of the warp must call it."""
        return np.int64(cuda.match_any_sync(FULL_MASK, key))

    @cuda.jit(device=True)
    def sync_lanes():
        """Wait for every lane of this warp (``bar.warp.sync``); every lane of the warp must call it."""
        cuda.syncwarp(FULL_MASK)

    @cuda.jit(device=True)
    def shfl_idx(v, src):
        """The integer ``v`` of lane ``src`` of this warp (``shfl.sync.idx``); every lane of the warp
        must call it."""
        return cuda.shfl_sync(FULL_MASK, v, src)

    @cuda.jit(device=True)
    def loop_bound(x):
        """The largest int64 ``x`` over this warp (xor butterfly), the trip count that every lane of
        the warp runs a loop of shuffles for. Every lane of the warp calls it."""
        off = LANES // 2
        while off > 0:
            x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, off))
            off //= 2
        return x


# -- half precision (embnum._half, compiled as device functions) ----------------------
_dev = cuda.jit(device=True)
half_bits_to_float = _dev(_half.half_bits_to_float)
float_to_half_bits = _dev(_half.float_to_half_bits)
float32_bits_to_half_bits = _dev(_half.float32_bits_to_half_bits)
float32_to_bits = _dev(_half.float32_to_bits)
bits_to_float32 = _dev(_half.bits_to_float32)
rne = _dev(_half.rne)
round_once = _half.round_once

_HALF_TABLES: dict = {}


def half_table():
    """The float32 value of every float16 bit pattern, on the current device (copied once
    per device and kept; under the simulator one writable host copy, because the simulator
    copies kernel arguments back into the arrays they came from)."""
    if SIMULATED:
        dev, to_device = "simulator", np.array
    else:
        import cupy

        dev, to_device = cupy.cuda.Device().id, cupy.asarray
    table = _HALF_TABLES.get(dev)
    if table is None:
        table = _HALF_TABLES[dev] = to_device(_half.float32_table())
    return table


def float32_result(out):
    """Where a kernel accumulates a result for ``out``: ``out`` itself when it is float32,
    else a float32 scratch of its shape (then :func:`round_once` writes ``out``)."""
    return out if out.dtype == np.float32 else xp().empty(out.shape, np.float32)


# -- scans ------------------------------------------------------------------------------
def inclusive_scan(a):
    """int64 inclusive scan of a 1-D device array: one library scan (CUB through CuPy on a GPU),
    wrapping on overflow as the int64 kernels do."""
    return xp().cumsum(a, dtype=np.int64)


@cuda_kernel
def _running_max(a, out):
    """out[i] = max(a[:i + 1]) (int64) in one block: each thread takes a contiguous chunk, chunk
    maxima are scanned in shared memory by thread 0 (fixed order), then each chunk is written."""
    part = cuda.shared.array(TPB, np.int64)
    tid = cuda.threadIdx.x
    n = a.shape[0]
    chunk = (n + cuda.blockDim.x - 1) // cuda.blockDim.x
    lo = min(n, tid * chunk)
    hi = min(n, lo + chunk)
    m = a[lo] if lo < hi else a[0]
    for i in range(lo, hi):
        if a[i] > m:
            m = a[i]
    part[tid] = m
    cuda.syncthreads()
    if tid == 0:
        for j in range(1, cuda.blockDim.x):
            if part[j - 1] > part[j]:
                part[j] = part[j - 1]
    cuda.syncthreads()
    m = part[tid - 1] if tid > 0 else a[0]
    for i in range(lo, hi):
        if a[i] > m:
            m = a[i]
        out[i] = m


def running_max(a):
    """Inclusive running maximum of a non-empty 1-D int64 device array, on the device (one launch of one
    block; CuPy has no ``maximum.accumulate``). No host read."""
    out = xp().empty(a.shape[0], np.int64)
    launch(_running_max, 1, TPB, int64s(a), out)
    return out


def stable_argsort(a):
    """int64 positions that sort the 1-D device array ``a``, equal entries in input order
    (one library sort: CuPy's is always stable)."""
    m = xp()
    order = m.argsort(a, kind="stable") if m is np else m.argsort(a)
    return order.astype(np.int64, copy=False)


# -- launches and constant tables ------------------------------------------------------------
def _current_stream():
    """Numba's handle of CuPy's current stream (cached per stream pointer)."""
    import cupy

    ptr = cupy.cuda.get_current_stream().ptr
    s = _STREAMS.get(ptr)
    if s is None:
        s = _STREAMS[ptr] = cuda.external_stream(ptr)
    return s


_STREAMS: dict = {}


def launch(kernel, n_blocks: int, tpb: int, *args) -> None:
    """``kernel[n_blocks, tpb](*args)`` on the caller's current CuPy stream (the torch bridge
    makes torch's current stream CuPy's for the call), so a launch never waits for, or races
    with, work on another stream. Under the simulator there are no streams. The configured
    launcher (``kernel[n_blocks, tpb, stream]``, a Numba object made per subscript) is kept per
    kernel, grid, block and stream, so a repeated launch does not make it again."""
    if SIMULATED:
        _switch_often()
        with warnings.catch_warnings():
            _quiet_simulated_arithmetic()
            kernel[n_blocks, tpb](*args)
        return
    stream = _current_stream()
    key = (kernel, n_blocks, tpb, stream)
    run = _CONFIGURED.get(key)
    if run is None:
        if len(_CONFIGURED) >= _MAX_CONFIGURED:
            _CONFIGURED.clear()
        run = _CONFIGURED[key] = kernel[n_blocks, tpb, stream]
    run(*args)


_CONFIGURED: dict = {}  # (kernel, grid, block, stream) -> kernel[grid, block, stream]
_MAX_CONFIGURED = 4096


# The simulator runs every GPU thread as a Python thread, and the launching thread polls them in a
# loop that never blocks: a thread released from a barrier waits for the GIL until the poller's
# switch interval runs out (5 ms by default). Blocks of 8 threads ran about 3 times faster at
# 0.1 ms (simulated rows of test_ops 106 -> 35 s CPU); blocks of 256 spend at 0.1 ms in switching
# what they save in waiting (53 s CPU against 23 at 1 ms).
SIM_SWITCH_INTERVAL = 1e-4 if TPB <= 32 else 1e-3


def _switch_often() -> None:
    """The interpreter's switch interval set to :data:`SIM_SWITCH_INTERVAL` at the first simulated
    launch of the process (once: a value the caller sets later stands)."""
    global _switched
    if not _switched:
        _switched = True
        sys.setswitchinterval(SIM_SWITCH_INTERVAL)


_switched = False


def _one_shared_array_per_line() -> None:
    """The simulator keeps a block's shared arrays by source line, made on a line's first call
    by a check then a store with no lock: two of the block's threads arriving together could each
    make and use an array of their own (seen as a shuffle through shared memory that read another
    bag's id, a few times in a hundred launches once threads switch every 0.1 ms). The check and
    the store now hold a lock, so every thread of the block gets the one array."""
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    made = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer), or the simulator's error
            return made(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            found = self._allocations.get(key)
            if found is None:
                kind = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
                found = self._allocations[key] = np.empty(shape, kind)
        return found

    FakeCUDAShared.array = array


if SIMULATED:
    _one_shared_array_per_line()


def _quiet_simulated_arithmetic() -> None:
    """The simulator runs each GPU thread's float arithmetic as NumPy scalar operations, which
    warn where the hardware quietly gives IEEE's answer (``inf - inf`` is NaN, ``x / 0`` is inf,
    overflow is inf): the kernels compute what a GPU computes, and the warnings are the
    simulator's. ``np.errstate`` cannot reach the simulator's threads (it is per context), so the
    launch ignores NumPy's floating-point warnings raised in this package's kernel modules, in
    the shared rules they compile as device functions (``embnum._tbe_rows``, ``embnum._half``, ...)
    and in the simulator's array store (a float32 beyond float16's range cast on ``out[i] = x``,
    where the hardware stores inf)."""
    warnings.filterwarnings(
        "ignore", r".*encountered in", RuntimeWarning, r"embnum\.(cuda\.|_)|numba\.cuda\.simulator\."
    )


_CONSTANTS: dict = {}
_MAX_CONSTANTS = 512


def constant(a):
    """A device copy of the small host array ``a`` (layout tables, plans), uploaded once per
    device and content, and kept (at most 512 of them, the oldest dropped first). Device
    arrays pass through unchanged. Kernels only read it."""
    if not isinstance(a, np.ndarray):
        return a
    if SIMULATED:
        return a
    import cupy

    a = np.ascontiguousarray(a)
    key = (cupy.cuda.Device().id, a.dtype.str, a.shape, a.tobytes())
    found = _CONSTANTS.get(key)
    if found is None:
        if len(_CONSTANTS) >= _MAX_CONSTANTS:
            _CONSTANTS.pop(next(iter(_CONSTANTS)))
        found = _CONSTANTS[key] = cupy.asarray(a)
    return found
