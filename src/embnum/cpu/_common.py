"""Helpers shared by the Numba host kernels.

Numba has no float16 on the CPU, and data-movement kernels do not care what
their elements mean: they see every array as unsigned integers of the same
width (:func:`bits`), which also keeps the number of compiled specialisations
small. Arithmetic on float16 goes through :func:`half_to_float`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import _offsets_walk

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous unsigned-integer array of the same item size (no copy
    when ``a`` is already contiguous)."""
    return np.ascontiguousarray(a).view(_UINT[a.dtype.itemsize])


def scalar_bits(x, dtype) -> int:
    """The bit pattern of ``x`` in ``dtype``, as the matching unsigned integer."""
    return np.array(x, dtype=dtype).view(_UINT[np.dtype(dtype).itemsize])[()]


def int64s(a: np.ndarray) -> np.ndarray:
    """A contiguous int64 copy or view of an index array."""
    return np.ascontiguousarray(a, dtype=np.int64)


def pack_offsets(offsets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """J offsets arrays as one flat int64 array plus the start of each: ``(flat, starts[J+1])``."""
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(o) for o in offsets])
    flat = np.concatenate([int64s(o) for o in offsets]) if offsets else np.zeros(0, np.int64)
    return flat, starts


@njit(cache=True, inline="always")
def half_to_float(h):
    """IEEE binary16 bit pattern (uint16) -> its exact float64 value."""
    h = np.int64(h)
    sign = -1.0 if h & 0x8000 else 1.0
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        return sign * m * 2.0**-24
    if e == 31:
        return sign * math.inf if m == 0 else math.nan
    return sign * (1024 + m) * 2.0 ** (e - 25)


leaf_segment = njit(cache=True)(_offsets_walk.leaf_segment)
slab_of_segment = njit(cache=True)(_offsets_walk.slab_of_segment)
