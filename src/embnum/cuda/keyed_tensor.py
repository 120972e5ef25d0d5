"""CUDA kernels of the keyed_tensor family.

Same contract as ``embnum.cpu.keyed_tensor``. Each permute is planned on the
host (:mod:`embnum._permute_plan`, cached by content) and runs as **one launch
for all outputs** of the CUDA C kernels in ``kernels/keyed_tensor.cu`` (NVRTC
through CuPy): the segment table reaches the kernel as a device copy uploaded
once per device and content, the arrays as raw pointers (16-byte vector copies
where a row segment is aligned, a scalar tail, grid-stride loops, 64-bit
offsets). Backward sums go slot by slot in permutes row order, one thread per
element, never with atomics, so the result is the same on every run.

Under Numba's CUDA simulator there is no NVRTC: the same plan tables are walked
by NumPy (:func:`_copy_plan`, :func:`_accumulate_plan`: one slice per segment,
sums in the value dtype in row order, the kernels' rule). The CUDA C kernels
themselves are checked by NVRTC + ptxas and run on the host through g++ against
the oracle (``tests/test_keyed_tensor.py``, ``tests/test_cuda_sources.py``).
"""

from __future__ import annotations

import numpy as np

from .. import _permute_plan as plan
from ._common import SIMULATED


def _copy_plan(segs: np.ndarray, srcs, dsts) -> None:
    """Simulator: ``dsts[j][:, c:c+n] = srcs[i][:, a:a+n]`` (0 where ``i < 0``) for each segment
    ``(i, a, j, c, n)``, bit for bit (the CUDA C kernel copies unsigned words)."""
    for i, a, j, c, n in segs.tolist():
        dst = dsts[j].view(f"u{dsts[j].itemsize}")
        dst[:, c : c + n] = 0 if i < 0 else srcs[i].view(f"u{srcs[i].itemsize}")[:, a : a + n]


def _accumulate_plan(slots: np.ndarray, srcs: np.ndarray, grads, outs) -> None:
    """Simulator: slot ``(i, x0, n, k0, k1)`` of ``outs[i]`` is ``0 + g_k0 + ... + g_(k1-1)`` in the
    value dtype, rounded after every addition, in row order (the CUDA C kernel's sum)."""
    for i, x0, n, k0, k1 in slots.tolist():
        acc = np.zeros((outs[i].shape[0], n), outs[i].dtype)
        with np.errstate(invalid="ignore", over="ignore"):  # IEEE sums, as the GPU's: inf + -inf is NaN
            for g, col in srcs[k0:k1].tolist():
                acc = acc + grads[g][:, col : col + n]
        outs[i][:, x0 : x0 + n] = acc


def _copy(segs: np.ndarray, srcs, dsts, B):
    if B == 0 or segs.shape[0] == 0:
        return
    if SIMULATED:
        _copy_plan(segs, srcs, dsts)
        return
    from . import _keyed_tensor_raw

    _keyed_tensor_raw.copy(segs, srcs, dsts, B)


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
    if SIMULATED:
        _accumulate_plan(slots, srcs, grad_outputs, out)
        return
    from . import _keyed_tensor_raw

    _keyed_tensor_raw.accumulate(slots, srcs, grad_outputs, out, B)
