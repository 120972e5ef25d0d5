"""The few array operations the containers need, for each kind of array they hold.

A container holds arrays of one kind: NumPy, CuPy or torch tensors. Its
methods call embnum ops (:func:`ops_for`: the public ops for NumPy/CuPy arrays,
``embnum.torch_bridge`` for tensors, so that torch results are differentiable
and trace under ``torch.compile``) plus the handful of plain operations below
(concatenate, make a small index array, ...). torch is looked up in
``sys.modules``, never imported here: a tensor can only exist once torch is.
"""

from __future__ import annotations

import functools
import sys
import types

import numpy as np

from .. import _registry


def _torch():
    return sys.modules.get("torch")


def is_tensor(a) -> bool:
    torch = _torch()
    return torch is not None and isinstance(a, torch.Tensor)


def is_cupy(a) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(a, cupy.ndarray)


def is_supported(a) -> bool:
    """A NumPy array, a CuPy array or a torch tensor (isinstance checks only: torch.compile traces them)."""
    return is_tensor(a) or isinstance(a, np.ndarray) or is_cupy(a)


def kind(a) -> str:
    """``"numpy"``, ``"cupy"`` or ``"torch"``."""
    if is_tensor(a):
        return "torch"
    if is_cupy(a):
        return "cupy"
    if isinstance(a, np.ndarray):
        return "numpy"
    raise TypeError(f"expected a NumPy array, a CuPy array or a torch tensor, got {type(a).__name__}")


def same_place(name: str, a, ref, ref_name: str) -> None:
    """``a`` is of the kind (and, for torch, on the device) of ``ref`` (TypeError otherwise)."""
    if a is None:
        return
    ka, kr = kind(a), kind(ref)
    if ka != kr:
        raise TypeError(f"{name} is a {ka} array but {ref_name} is a {kr} array: a container holds one kind")
    if ka == "torch" and a.device != ref.device:
        raise TypeError(f"{name} is on {a.device} but {ref_name} is on {ref.device}")


def ops_for(a):
    """The namespace whose ops take arrays like ``a``: ``embnum.torch_bridge`` for tensors, else
    the registry's public functions (the ops ``embnum`` exports)."""
    if is_tensor(a):
        from .. import torch_bridge  # (here: the bridge imports torch, which NumPy users may not have)

        return torch_bridge
    return _array_ops()


@functools.cache
def _array_ops() -> types.SimpleNamespace:
    return types.SimpleNamespace(**{op.name: op.public for op in _registry.ops()})


def compiling() -> bool:
    """True while torch.compile traces (host reads of data are then avoided or skipped)."""
    torch = _torch()
    return torch is not None and torch.compiler.is_compiling()


def is_integer(a) -> bool:
    if is_tensor(a):
        return not a.dtype.is_floating_point and not a.dtype.is_complex and a.dtype != _torch().bool
    return np.dtype(a.dtype).kind in "iu"


def is_index(a) -> bool:
    """int32 or int64: the dtypes the ops take for lengths, offsets and ids."""
    if is_tensor(a):
        return a.dtype in (_torch().int32, _torch().int64)
    return np.dtype(a.dtype) in (np.dtype(np.int32), np.dtype(np.int64))


def is_numeric(a) -> bool:
    """Not an object, string, void or date dtype (torch dtypes all are numeric)."""
    return is_tensor(a) or np.dtype(a.dtype).kind not in "OSUVMm"


def is_float(a) -> bool:
    if is_tensor(a):
        return a.dtype.is_floating_point
    return np.dtype(a.dtype).kind == "f"


def index_like(values, like, dtype=None):
    """A 1-D integer array holding the Python ints ``values``, of ``like``'s kind and device
    (``dtype``: a dtype of that kind, default ``like``'s)."""
    dtype = like.dtype if dtype is None else dtype
    if is_tensor(like):
        return _torch().tensor(list(values), dtype=dtype, device=like.device)
    xp = _xp(like)
    return xp.asarray(np.asarray(list(values), dtype=dtype))


def int64_like(values, like):
    if is_tensor(like):
        return index_like(values, like, _torch().int64)
    return index_like(values, like, np.int64)


def empty_like_kind(like, n, dtype=None):
    """An uninitialised 1-D array of ``n`` entries (dtype default ``like``'s)."""
    dtype = like.dtype if dtype is None else dtype
    if is_tensor(like):
        return _torch().empty(n, dtype=dtype, device=like.device)
    return _xp(like).empty(n, dtype=dtype)


def cat(arrays, like=None, axis=0):
    """Concatenate along ``axis`` (``like`` gives kind and dtype when ``arrays`` is empty)."""
    if not arrays:
        return empty_like_kind(like, 0)
    first = arrays[0]
    if is_tensor(first):
        return _torch().cat(list(arrays), dim=axis)
    return _xp(first).concatenate(list(arrays), axis=axis)


def diff(a):
    """``a[1:] - a[:-1]`` for a 1-D array."""
    return a[1:] - a[:-1]


def astype(a, dtype):
    if is_tensor(a):
        return a if a.dtype == dtype else a.to(dtype)
    return a if a.dtype == dtype else a.astype(dtype)


def to_list(a) -> list[int]:
    """The entries of a small 1-D integer array as Python ints (a host read)."""
    if is_tensor(a):
        return [int(x) for x in a.tolist()]
    if is_cupy(a):
        a = a.get()
    return [int(x) for x in a.tolist()]


def device_of(a):
    """torch device, ``"cpu"`` for NumPy, the CuPy device for CuPy."""
    if is_tensor(a):
        return a.device
    if is_cupy(a):
        return a.device
    return "cpu"


def dtype_name(a) -> str:
    return str(a.dtype).replace("torch.", "")


def _xp(a):
    if is_cupy(a):
        import cupy

        return cupy
    return np


def first_true(mask) -> int:
    """Index of the first True of a 1-D boolean array (a host read)."""
    if is_tensor(mask):
        return int(mask.nonzero()[0, 0])
    return int(_xp(mask).argmax(mask))


def total(a, bound: int) -> int:
    """Exact sum of a 1-D integer array whose entries lie in ``[0, bound]``, as a Python int (a
    host read): int64 sums of chunks short enough not to wrap, added in Python."""
    n = a.shape[0]
    if n == 0:
        return 0
    step = max(1, (2**63 - 1) // max(bound, 1))
    s = 0
    for start in range(0, n, step):
        part = a[start : start + step]
        s += int(part.sum(dtype=_torch().int64)) if is_tensor(a) else int(part.sum(dtype=np.int64))
    return s


def row_sums(a2d):
    """int64 sums of the rows of a 2-D integer array (no host read)."""
    if is_tensor(a2d):
        return a2d.sum(dim=1, dtype=_torch().int64)
    return a2d.sum(axis=1, dtype=np.int64)


class Held:
    """What every container answers from its ``_values`` and ``_backend``."""

    def device(self):
        return device_of(self._values)

    @property
    def backend(self):
        return self._backend
