"""CUDA kernels of the keyed_tensor family.

Same contract as ``embnum.cpu.keyed_tensor``. Each permute is planned on the
host (:mod:`embnum._permute_plan`) and runs as **one launch for all outputs**:

* with CuPy on a GPU, the CUDA C kernels of ``kernels/keyed_tensor.cu`` take
  the segment table with raw device pointers (16-byte vector copies when a
  row segment is aligned, a scalar tail, grid-stride loops, 64-bit offsets);
* otherwise (Numba's CUDA simulator, or no CuPy) the Numba-CUDA kernels below
  take the arrays as tuples and the table with array numbers.

Backward sums are done slot by slot in permutes row order by one thread per
element, never with atomics, so the result is the same on every run.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import _permute_plan as plan
from ._common import SIMULATED, TPB, blocks, launch, xp

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


# -- Numba-CUDA kernels --------------------------------------------------------------
@cuda.jit(cache=True)
def _copy_kernel(srcs, dsts, segs, B):
    """One block per (segment, batch row) in a grid-stride loop, threads across columns.
    segs ``[S, 5]``: (src array or -1 for zeros, src col, dst array, dst col, n)."""
    S = segs.shape[0]
    for item in range(cuda.blockIdx.x, S * B, cuda.gridDim.x):
        s = item // B
        b = item - s * B
        i, a, j, c, n = segs[s, 0], segs[s, 1], segs[s, 2], segs[s, 3], segs[s, 4]
        dst = dsts[j]
        if i < 0:
            for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
                dst[b, c + k] = 0
        else:
            src = srcs[i]
            for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
                dst[b, c + k] = src[b, a + k]


@cuda.jit(cache=True)
def _accumulate_kernel(grads, dsts, slots, srcs, B, zero):
    """One block per (slot, batch row); each thread owns columns of the slot and adds its
    sources in row order: ``0 + g_1 + ... + g_m`` in the value dtype."""
    E = slots.shape[0]
    z = zero[0]
    for item in range(cuda.blockIdx.x, E * B, cuda.gridDim.x):
        e = item // B
        b = item - e * B
        i, x0, n, k0, k1 = slots[e, 0], slots[e, 1], slots[e, 2], slots[e, 3], slots[e, 4]
        dst = dsts[i]
        for k in range(cuda.threadIdx.x, n, cuda.blockDim.x):
            acc = z
            for q in range(k0, k1):
                acc = acc + grads[srcs[q, 0]][b, srcs[q, 1] + k]
            dst[b, x0 + k] = acc


def _as_tuple(arrays, bits: bool):
    """Arrays as one tuple of C-contiguous arrays of one type (copies only strided ones)."""
    m = xp()
    out = []
    for a in arrays:
        a = m.ascontiguousarray(a)
        out.append(a.view(_UINT[a.itemsize]) if bits else a)
    return tuple(out)


def _device(table):
    return xp().array(table)  # a writable copy (cached plans are read-only)


def _use_rawkernel() -> bool:
    return not SIMULATED and _cupy_present()


def _cupy_present() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def _copy(segs: np.ndarray, srcs, dsts, B):
    if B == 0 or segs.shape[0] == 0:
        return
    if _use_rawkernel():
        from . import _keyed_tensor_raw

        _keyed_tensor_raw.copy(segs, srcs, dsts, B)
        return
    n = segs.shape[0] * B
    launch(_copy_kernel, blocks(n), TPB, _as_tuple(srcs, True), _as_tuple(dsts, True), _device(segs), B)


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list, out):
    segs = plan.pooled_indexed(offset_dim_list, permute_list, inv_offset_dim_list, out.shape[1])
    _copy(segs, [pooled_embs], [out], pooled_embs.shape[0])


def _forward(inputs, rows, out):
    _copy(plan.forward_indexed(rows, [o.shape[1] for o in out]), inputs, out, inputs[0].shape[0])


def permute_multi_embedding(pooled_embs, permutes, in_shapes, out_shapes, out_lengths, out):
    _forward(pooled_embs, plan.host_rows(permutes), out)


def regroup_keyed_tensor(pooled_embs, keys, lengths, groups, out):
    _forward(pooled_embs, plan.regroup_rows(keys, lengths, groups), out)


def kt_regroup_arguments(embs, keys, lengths, groups):
    permutes, in_shapes, out_shapes, out_lengths = plan.regroup_arguments(keys, lengths, groups)
    if embs is None or isinstance(embs, np.ndarray):
        return permutes, in_shapes, out_shapes, out_lengths
    import cupy

    with cupy.cuda.Device(embs.device.id):
        return cupy.asarray(permutes), cupy.asarray(in_shapes), cupy.asarray(out_shapes), out_lengths


def permute_multi_embedding_backward(grad_outputs, permutes, in_shapes, out_shapes, in_lengths, out):
    B = grad_outputs[0].shape[0]
    slots, srcs = plan.backward_indexed(plan.host_rows(permutes), in_lengths)
    if B == 0 or slots.shape[0] == 0:
        return
    if _use_rawkernel():
        from . import _keyed_tensor_raw

        _keyed_tensor_raw.accumulate(slots, srcs, grad_outputs, out, B)
        return
    zero = xp().zeros(1, dtype=out[0].dtype)
    n = slots.shape[0] * B
    launch(
        _accumulate_kernel,
        blocks(n),
        TPB,
        _as_tuple(grad_outputs, False),
        tuple(out),
        _device(slots),
        _device(srcs),
        B,
        zero,
    )
