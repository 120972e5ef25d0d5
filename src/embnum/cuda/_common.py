"""Helpers shared by the Numba-CUDA kernels: launch shapes, array module, offset walks,
half precision (``embnum._half`` compiled as device functions, one float16 table per
device, float32 accumulation rounded once: :func:`float32_result`, :func:`round_once`).

On a GPU the kernels take CuPy arrays; under the simulator
(``NUMBA_ENABLE_CUDASIM=1``) they take NumPy arrays, and blocks are kept
small because every simulated thread is a Python thread.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from .. import _half, _offsets_walk
from .._backend import cuda_simulated, to_host  # noqa: F401 - to_host: the one device-to-host copy

SIMULATED = cuda_simulated()
TPB = 8 if SIMULATED else 256  # threads per block; a power of two
MAX_BLOCKS = 8 if SIMULATED else 8192  # grid-stride loops cover the rest

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
    return xp().ascontiguousarray(a)


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
    return flat, m.asarray(starts)


leaf_segment = cuda.jit(device=True)(_offsets_walk.leaf_segment)
slab_of_segment = cuda.jit(device=True)(_offsets_walk.slab_of_segment)


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


# -- scans (int64, on the device) -----------------------------------------------------
@cuda.jit
def _block_scan(src, dst, block_sums, n):
    """Inclusive scan of each TPB-element chunk (Hillis-Steele in shared memory)."""
    sh = cuda.shared.array(TPB, numba.int64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TPB + t
    sh[t] = src[i] if i < n else 0
    cuda.syncthreads()
    step = 1
    while step < TPB:
        x = sh[t - step] if t >= step else 0
        cuda.syncthreads()
        sh[t] += x
        cuda.syncthreads()
        step *= 2
    if i < n:
        dst[i] = sh[t]
    if t == TPB - 1:
        block_sums[cuda.blockIdx.x] = sh[t]


@cuda.jit
def _add_block_prefix(dst, block_prefix, n):
    b = cuda.blockIdx.x
    i = b * TPB + cuda.threadIdx.x
    if b > 0 and i < n:
        dst[i] += block_prefix[b - 1]


def inclusive_scan(src):
    """int64 inclusive scan of a 1-D device array (recursive over block sums)."""
    n = int(src.shape[0])
    m = xp()
    dst = m.empty(n, dtype=np.int64)
    if n == 0:
        return dst
    nb = -(-n // TPB)
    sums = m.empty(nb, dtype=np.int64)
    _block_scan[nb, TPB](src, dst, sums, n)
    if nb > 1:
        prefix = inclusive_scan(sums)  # before configuring the launch: the simulator keeps one config per kernel
        _add_block_prefix[nb, TPB](dst, prefix, n)
    return dst
