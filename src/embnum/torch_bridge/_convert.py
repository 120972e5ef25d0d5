"""Tensors to arrays and back for the torch bridge: views, no copies; bfloat16 by one rule.

bfloat16 (NumPy and CuPy have none) crosses the bridge by one rule, the same for
every op that takes it (``bridge(..., bf16=True)``): each bfloat16 tensor argument is
widened exactly to float32 (every bfloat16 is a float32), the op runs on float32,
and each float32 result is rounded once back to bfloat16 (to nearest even, as
torch rounds; a NaN keeps its top 16 bits). Data that an op only moves comes back
bit for bit (a widened value needs no rounding; NaN payloads kept), sums are
accumulated in float32 or wider and rounded once, and a scalar such as a padding
value is rounded along with the result. A call that also passes float32 tensors
is a ``TypeError`` (its float32 results could not be told apart). The one place the
spec defines bfloat16 otherwise: quant's ``float_to_bfloat16`` / ``bfloat16_to_float``
are codecs of bfloat16 bit patterns, carried by NumPy as uint16 (docs/families/quant.md),
so there (``bf16_patterns=True``) a bfloat16 tensor is its pattern: a uint16 view in,
a bfloat16 view of the uint16 result out (no conversion; widening and rounding back
would give the same bits).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from ._spec import Bridge


def to_array(t: torch.Tensor):
    """A NumPy (CPU) or CuPy (CUDA) view of ``t``: shared memory, no copy.

    CPU tensors through ``Tensor.numpy`` (about a third of ``np.from_dlpack``'s cost,
    the same view: strides and storage offset kept)."""
    if t.is_cpu:
        return (t.detach() if t.requires_grad else t).numpy()
    t = t.detach()
    if t.device.type == "cuda":
        import cupy

        return cupy.from_dlpack(t)
    raise TypeError(f"embnum.torch_bridge takes CPU or CUDA tensors, got one on {t.device}")


_NO_STREAM = contextlib.nullcontext()


def _first_cuda(values):
    """The first CUDA tensor among ``values`` (lists included), or None (a plain loop: this
    runs on every call, CPU ones included)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.is_cuda:
                return v
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    return t
    return None


def on_torch_stream(values):
    """A context in which CuPy's current stream is torch's current stream of the first CUDA
    tensor's device, and CuPy allocates from torch's caching allocator (a null context without
    a CUDA tensor). Every embnum launch and CuPy call of the op then runs on that stream, in
    order with the caller's torch work before and after it (an in-place op's writes included),
    the DLPack exchanges need no cross-stream wait, and the op's outputs and scratch are torch
    memory: ``torch.cuda.memory_allocated`` counts them and torch reuses them once freed (one
    pool, not CuPy's beside torch's)."""
    first = _first_cuda(values)
    if first is None:
        return _NO_STREAM
    import cupy

    device = first.device.index if first.device.index is not None else torch.cuda.current_device()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device))
    stack.enter_context(cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device))
    stack.enter_context(cupy.cuda.using_allocator(_torch_allocator(device)))
    return stack


_ALLOCATORS: dict = {}


def _torch_allocator(device: int):
    """CuPy's allocator signature (``nbytes -> cupy.cuda.MemoryPointer``) over torch's caching
    allocator on ``device``: a uint8 tensor owns the bytes (on torch's current stream, the op's
    stream), and CuPy's memory object keeps it alive while any array uses it."""
    alloc = _ALLOCATORS.get(device)
    if alloc is None:
        import cupy

        where = torch.device("cuda", device)

        def alloc(nbytes: int):
            block = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=where)
            memory = cupy.cuda.UnownedMemory(block.data_ptr(), block.numel(), block, device)
            return cupy.cuda.MemoryPointer(memory, 0)

        alloc = _ALLOCATORS[device] = alloc
    return alloc


def to_tensor(a) -> torch.Tensor:
    """A torch view of a NumPy/CuPy array: shared memory, no copy (a writeable NumPy
    array through ``torch.from_numpy``, about half of ``torch.from_dlpack``'s cost)."""
    if type(a) is np.ndarray and a.flags.writeable:
        return torch.from_numpy(a)
    return torch.from_dlpack(a)


def round_to_bfloat16(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor rounded once to bfloat16: to nearest even (torch's rounding); a NaN
    keeps its top 16 bits (torch's own conversion would replace its payload), so that a
    bfloat16 widened to float32 comes back bit for bit."""
    top = (t.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    return torch.where(t.isnan(), top, t.to(torch.bfloat16))


def _has_bf16(args: dict) -> bool:
    for a in args.values():
        if isinstance(a, torch.Tensor):
            if a.dtype == torch.bfloat16:
                return True
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
                    return True
    return False


def convert_inputs(args: dict, spec: Bridge):
    """Tensors (and lists of tensors) to arrays, bfloat16 by the module's rule.
    Returns the converted args and whether bfloat16 was widened (its float32 results
    are then rounded back)."""
    if not _has_bf16(args):  # the common case: views only
        out = {}
        for k, a in args.items():
            if isinstance(a, torch.Tensor):
                out[k] = to_array(a)
            elif isinstance(a, (list, tuple)):
                out[k] = [to_array(t) if isinstance(t, torch.Tensor) else t for t in a]
            else:
                out[k] = a
        return out, False
    if spec.bf16_patterns:
        return {k: to_array(a.view(torch.uint16)) if _is_bf16(a) else _arrays(a) for k, a in args.items()}, False
    if not spec.bf16:
        raise TypeError(f"{spec.name} does not take bfloat16 tensors")
    for k, a in args.items():
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                raise TypeError(
                    f"{spec.name}: {k} is float32 beside bfloat16 tensors; bfloat16 crosses the bridge widened to"
                    " float32, so a call takes one or the other (convert one side)"
                )

    def one(t):
        return to_array(t.float()) if _is_bf16(t) else to_array(t) if isinstance(t, torch.Tensor) else t

    return {k: [one(t) for t in a] if isinstance(a, (list, tuple)) else one(a) for k, a in args.items()}, True


def _is_bf16(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16


def _arrays(a):
    if isinstance(a, torch.Tensor):
        return to_array(a)
    if isinstance(a, (list, tuple)):
        return [to_array(t) if isinstance(t, torch.Tensor) else t for t in a]
    return a


def convert_output(a, spec: Bridge, bf16: bool) -> torch.Tensor | None:
    """An implementation's result as a tensor; ``bf16``: the call's bfloat16 was widened, so a
    float32 result is rounded back (:func:`round_to_bfloat16`)."""
    if a is None:
        return None  # an optional output that was not requested
    if isinstance(a, list):
        return a  # a Python list of ints returned beside arrays (schema type int[])
    t = to_tensor(a)
    if spec.bf16_patterns and t.dtype == torch.uint16:
        return t.view(torch.bfloat16)
    if bf16 and t.dtype == torch.float32:
        return round_to_bfloat16(t)
    return t
