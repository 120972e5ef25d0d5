"""Helpers shared by the Numba-CUDA kernels: launch shapes, array module, offset walks.

On a GPU the kernels take CuPy arrays; under the simulator
(``NUMBA_ENABLE_CUDASIM=1``) they take NumPy arrays, and blocks are kept
small because every simulated thread is a Python thread.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _offsets_walk
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
