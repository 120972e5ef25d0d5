"""Launch the CUDA C kernels of ``kernels/keyed_tensor.cu`` (CuPy on a GPU).

The segment tables depend only on the permute (and the widths), so their
device copies are cached by content: a training loop that regroups with the
same permutes copies them to the device once. The pointer and stride arrays
of the inputs and outputs are the only per-call transfers (a few bytes per
array, as fbgemm_gpu's kernel does).
"""

from __future__ import annotations

import numpy as np

from .. import _permute_plan as plan
from .._cache import BoundedCache
from ._rawkernel import raw_kernel

THREADS = 256
MAX_BLOCKS = 65535
_TABLES = BoundedCache(256)  # shared by every thread that calls the op


def _device_table(table: np.ndarray):
    import cupy

    key = (cupy.cuda.Device().id, table.shape, table.tobytes())
    found = _TABLES.get(key)
    if found is None:
        found = _TABLES.put(key, cupy.asarray(table))
    return found


def _pointers(arrays):
    import cupy

    ptrs = np.array([a.data.ptr for a in arrays], dtype=np.uint64)
    strides = np.array([a.strides[0] for a in arrays], dtype=np.int64)
    return cupy.asarray(ptrs), cupy.asarray(strides)


def copy(segs: np.ndarray, srcs, dsts, B: int) -> None:
    """Run an indexed copy plan (see ``_permute_plan.copy_indexed``) in one launch."""
    keep: list = []
    srcs = [plan.rowwise(a, keep) for a in srcs]
    src_ptrs, src_strides = _pointers(srcs)
    dst_ptrs, dst_strides = _pointers(dsts)
    S = segs.shape[0]
    warps_per_block = THREADS // 32
    grid = max(1, min(MAX_BLOCKS, -(-(S * B) // warps_per_block)))
    raw_kernel("keyed_tensor.cu", "kt_copy")(
        (grid,),
        (THREADS,),
        (
            _device_table(segs),
            np.int64(S),
            np.int64(B),
            src_ptrs,
            src_strides,
            dst_ptrs,
            dst_strides,
            np.int32(dsts[0].itemsize),
        ),
    )


_ACCUMULATE = {2: "kt_accumulate_f16", 4: "kt_accumulate_f32", 8: "kt_accumulate_f64"}


def accumulate(slots: np.ndarray, srcs: np.ndarray, grads, outs, B: int) -> None:
    """Run a backward plan (see ``_permute_plan.backward_indexed``) in one launch."""
    keep: list = []
    grads = [plan.rowwise(g, keep) for g in grads]
    g_ptrs, g_strides = _pointers(grads)
    o_ptrs, o_strides = _pointers(outs)
    E = slots.shape[0]
    grid = max(1, min(MAX_BLOCKS, E * B))
    raw_kernel("keyed_tensor.cu", _ACCUMULATE[outs[0].itemsize])(
        (grid,),
        (128,),
        (_device_table(slots), np.int64(E), _device_table(srcs), np.int64(B), g_ptrs, g_strides, o_ptrs, o_strides),
    )
