"""Backends: which arrays belong to whom, how to allocate, how to move data.

Three backends share one small interface (:class:`Backend`):

* ``ref``  - the NumPy oracle (``embnum.ref``), host arrays;
* ``cpu``  - Numba host kernels (``embnum.cpu``), host arrays;
* ``cuda`` - Numba-CUDA kernels (``embnum.cuda``), CuPy arrays on a GPU, or
  NumPy arrays under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

Nothing here imports CuPy, torch or Numba-CUDA at import time.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os

import numpy as np


def is_numpy(a) -> bool:
    return isinstance(a, np.ndarray)


def is_cupy(a) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "__cuda_array_interface__")


def is_array(a) -> bool:
    return is_numpy(a) or is_cupy(a)


def to_host(a, dtype=None) -> np.ndarray:
    """A NumPy array of ``a`` (a device-to-host copy for CuPy; a NumPy array is not copied
    unless ``dtype`` asks for a conversion). The one way embnum reads device data on the host."""
    if is_cupy(a):
        a = a.get()
    return np.asarray(a, dtype=dtype)


def cuda_simulated() -> bool:
    """True when Numba's CUDA simulator is switched on for this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.cache
def gpu_present() -> bool:
    """True when the CUDA driver reports at least one device (probed without CuPy/Numba)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


@functools.cache
def _module_available(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


class Backend:
    """The interface every backend implements."""

    name: str = ""
    host: bool = True  # works on NumPy arrays

    def available(self) -> bool:
        raise NotImplementedError

    def owns(self, a) -> bool:
        """Whether ``a`` is an array this backend computes on directly."""
        raise NotImplementedError

    def owner(self):
        """:meth:`owns` as a plain function, decided once for the many arrays of one call."""
        return self.owns

    @property
    def xp(self):
        """The array module (numpy or cupy) of this backend's arrays."""
        return np

    def empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def from_host(self, a: np.ndarray):
        return a

    # -- running an op's kernel (the registry's one way in) ------------------
    def kernel(self, family: str, name: str):
        """The implementation ``embnum.<backend>.<family>.<name>`` (its module imported on first
        use); ``NotImplementedError`` where the family has none."""
        module = importlib.import_module(f"embnum.{self.name}.{family}")
        try:
            return getattr(module, name)
        except AttributeError:
            raise NotImplementedError(f"embnum.{self.name}.{family} has no {name}") from None

    def allocator(self, family: str):
        """``empty(shape, dtype)``: how this backend allocates the outputs of ``family``'s ops."""
        return self.empty

    def run(self, kernel, args: dict, out):
        """Run ``kernel`` on a plan's ``args``: it fills ``out`` (one array, or a list/tuple of
        them, None where an output is not requested) and returns nothing; with ``out`` None
        (an op whose sizes depend on the data, or an in-place op) it returns its result."""
        return kernel(**args) if out is None else kernel(**args, out=out)

    def runner(self, kernel):
        """``run(args, out)``: :meth:`run` with ``kernel`` bound, made once when the registry
        loads the kernel (a backend may settle there what each call would otherwise look up)."""
        return functools.partial(self.run, kernel)

    def to_host(self, a) -> np.ndarray:
        return to_host(a)

    def synchronize(self) -> None:
        pass

    @property
    def device(self) -> str:
        return "cpu"

    def __repr__(self) -> str:
        return f"<embnum backend {self.name!r} on {self.device}>"


class RefBackend(Backend):
    name = "ref"

    def available(self) -> bool:
        return True

    def owns(self, a) -> bool:
        return is_numpy(a)

    def run(self, kernel, args: dict, out):
        """The oracle returns its result (it fills no ``out``): returned as it is where ``out`` is
        None, else checked against the outputs (one result per output, the same shapes and
        dtypes: an ``AssertionError`` otherwise) and copied into them."""
        result = kernel(**args)
        if out is None:
            return result
        single = not isinstance(out, (list, tuple))
        results, outs = ([result], [out]) if single else (list(result), list(out))
        _check_oracle(kernel.__name__, results, outs)
        for o, r in zip(outs, results):
            if o is not None:
                o[...] = r
        return out


def _check_oracle(name: str, results: list, outs: list) -> None:
    if len(results) != len(outs):
        raise AssertionError(f"embnum.ref {name} returned {len(results)} results, expected {len(outs)}")
    for r, o in zip(results, outs):
        if o is None or r is None:
            if o is not None or r is not None:
                raise AssertionError(f"embnum.ref {name} returned {r!r} where the plan expects {o.dtype}{o.shape}")
            continue
        if tuple(r.shape) != o.shape or r.dtype != o.dtype:
            raise AssertionError(f"embnum.ref {name} returned {r.dtype}{tuple(r.shape)}, expected {o.dtype}{o.shape}")


class CpuBackend(Backend):
    """Numba host kernels on NumPy arrays. How a kernel is called (small calls on one thread,
    arguments by position) is the cpu package's rule, :func:`embnum.cpu._common.runner`, loaded
    by name like the kernels themselves (:meth:`Backend.kernel`): importing embnum loads no Numba."""

    name = "cpu"

    def __init__(self):
        self._runs: dict = {}  # kernel -> run(args, out), for run() calls with a kernel

    def available(self) -> bool:
        return _module_available("numba")

    def owns(self, a) -> bool:
        return is_numpy(a)

    def _common(self):
        return importlib.import_module(f"embnum.{self.name}._common")

    def allocator(self, family: str):
        """The family's ``empty_output`` where its cpu module has one (``embnum.cpu._pool``:
        reused large outputs), else ``np.empty``."""
        return getattr(importlib.import_module(f"embnum.{self.name}.{family}"), "empty_output", np.empty)

    def run(self, kernel, args: dict, out):
        """:meth:`Backend.run` by the cpu package's rule (:meth:`runner`)."""
        run = self._runs.get(kernel)
        if run is None:  # bound once per kernel (the registry keeps its own; TBE launch plans call run)
            run = self._runs[kernel] = self.runner(kernel)
        return run(args, out)

    def runner(self, kernel):
        return self._common().runner(kernel)

    @property
    def device(self) -> str:
        return self._common().describe()


class CudaBackend(Backend):
    """CuPy arrays on a GPU; NumPy arrays when the simulator is on."""

    name = "cuda"

    @property
    def simulated(self) -> bool:
        return cuda_simulated()

    def available(self) -> bool:
        if self.simulated:
            return _module_available("numba.cuda")
        return gpu_present() and _module_available("cupy") and _module_available("numba.cuda")

    def owns(self, a) -> bool:
        return is_numpy(a) if self.simulated else is_cupy(a)

    def owner(self):
        return is_numpy if self.simulated else is_cupy

    @property
    def xp(self):
        if self.simulated:
            return np
        import cupy

        return cupy

    def from_host(self, a):
        return np.asarray(a) if self.simulated else self.xp.asarray(a)

    def synchronize(self) -> None:
        if not self.simulated:
            self.xp.cuda.get_current_stream().synchronize()

    @property
    def device(self) -> str:
        if self.simulated:
            return "cuda (simulated)"
        import cupy

        dev = cupy.cuda.Device()
        return f"cuda:{dev.id} ({cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()})"


BACKENDS: dict[str, Backend] = {b.name: b for b in (RefBackend(), CpuBackend(), CudaBackend())}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"backend must be one of {sorted(BACKENDS)} or None, got {name!r}") from None


def available_backends() -> list[str]:
    """Names of the backends that can run in this process, in ref, cpu, cuda order."""
    return [name for name, b in BACKENDS.items() if b.available()]


def _describe(a) -> str:
    return f"{type(a).__module__}.{type(a).__name__}"


def select_backend(arrays: dict[str, object], backend: str | None) -> Backend:
    """Pick the backend for a call from its array arguments and ``backend=``.

    ``arrays`` maps an argument name (``"offsets[1]"`` for list items) to the
    array passed there. Host (NumPy) and device (CuPy) arrays may not be mixed.
    """
    if backend is None and all(type(a) is np.ndarray for a in arrays.values()):
        return BACKENDS["cpu"]  # the common case, decided without the checks below
    host = {k: a for k, a in arrays.items() if is_numpy(a)}
    device = {k: a for k, a in arrays.items() if k not in host and is_cupy(a)}
    if host and device:
        h, d = next(iter(host)), next(iter(device))
        raise TypeError(f"cannot mix host and device arrays: {h!r} is a NumPy array but {d!r} is a CuPy array")
    if backend is None:
        chosen = get_backend("cuda" if device else "cpu")
    else:
        chosen = get_backend(backend)
    owns = chosen.owner()
    for k, a in {**host, **device}.items():
        if not owns(a):
            hint = ""
            if chosen.name == "cuda" and is_numpy(a):
                hint = " (NumPy arrays run on backend='cuda' only under NUMBA_ENABLE_CUDASIM=1)"
            raise TypeError(f"backend {chosen.name!r} cannot take {k!r}, a {_describe(a)}{hint}")
    if not chosen.available():
        raise RuntimeError(f"backend {chosen.name!r} is not available in this process")
    return chosen
