"""The shared pieces of the surface tier (``hostile_surfaces.py``): the kinds of array a case
runs on, the conversion of results to NumPy, their comparison, and the plain-Python checks the
models of ``hostile_containers.py`` and ``hostile_modules.py`` are written with (nothing here
calls embnum, so a model cannot inherit an embnum defect)."""

from __future__ import annotations

import numbers

import numpy as np

INVALID = "invalid"
# an input whose float32 intermediates overflow where the float64 oracle's do not (README, "Not
# guaranteed"): every kind must still answer cleanly, but no result is compared
BEYOND_FLOAT32 = "beyond float32"
KINDS = ("numpy-ref", "numpy-cpu", "torch")
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)


class NotExpressible(Exception):
    """The input has no form on this kind (an object array as a tensor)."""


# -- kinds -----------------------------------------------------------------------------------
def tensor(a):
    import torch

    if type(a) is not np.ndarray:
        raise NotExpressible(f"torch has no {type(a).__name__}")
    if not a.flags.writeable:
        raise NotExpressible("torch tensors have no read-only flag")
    if a.dtype == np.uint64:
        return torch.from_numpy(a.view(np.int64).copy()).view(torch.uint64)
    try:
        return torch.from_numpy(a)
    except (TypeError, ValueError, RuntimeError) as e:
        raise NotExpressible(f"torch.from_numpy: {e}") from None


def on(kind, a):
    """``a`` as the kind's array (NumPy arrays stay; others are left alone)."""
    if kind == "torch" and isinstance(a, np.ndarray):
        return tensor(a)
    return a


def backend_of(kind):
    return {"numpy-ref": "ref", "numpy-cpu": "cpu", "torch": None}[kind]


def host(x):
    """Results as NumPy/Python, recursively (tensors detached and copied)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.uint64:
            return x.view(torch.int64).numpy().view(np.uint64).copy()
        return x.numpy().copy()
    if isinstance(x, np.ndarray):
        return np.array(x)
    if isinstance(x, dict):
        return {k: host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [host(v) for v in x]
    return x


def same(a, b, tol=0.0) -> bool:
    """Equal structure, dtypes and values (NaN equal to NaN; floats within ``tol`` relative)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(same(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same(x, y, tol) for x, y in zip(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if tol:
            return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
        if a.dtype != b.dtype:
            return False
        return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return a == b


# -- the model's checks (plain Python ints: nothing wraps) ------------------------------------------
def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def index_array(a, ndim=1) -> bool:
    return type(a) is np.ndarray and a.ndim == ndim and a.dtype in (I32, I64)


def str_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(k, str) for k in x) and len(set(x)) == len(x)


def int_list(x):
    """``x`` as a list of Python ints (a list/tuple of ints, or an integer 1-D array), or None."""
    if type(x) is np.ndarray:
        return [int(v) for v in x.tolist()] if x.ndim == 1 and x.dtype.kind in "iu" else None
    if isinstance(x, (list, tuple)) and all(is_int(v) for v in x):
        return [int(v) for v in x]
    return None


def plain(a) -> bool:
    """A plain ndarray (subclasses such as np.matrix or masked arrays: no verdict)."""
    return type(a) is np.ndarray
