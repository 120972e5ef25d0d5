"""CUDA C kernels kept in ``embnum/cuda/kernels/*.cu``: compiled once, cached.

On a GPU, :func:`raw_kernel` compiles a source with CuPy (``cupy.RawModule``)
the first time a kernel of it is asked for. Without a GPU, :func:`compile_ptx`
compiles a source with NVRTC (``cuda-bindings`` + ``nvidia-cuda-nvrtc-cu12``)
so that CI catches CUDA C errors on a machine with no GPU.
"""

from __future__ import annotations

import functools
from pathlib import Path

KERNELS = Path(__file__).with_name("kernels")
OPTIONS = ("-std=c++17",)


def sources() -> list[Path]:
    """Every CUDA C source of embnum."""
    return sorted(KERNELS.glob("*.cu"))


class CompileError(RuntimeError):
    pass


@functools.cache
def nvrtc_missing() -> str | None:
    """Why NVRTC cannot compile here (``None`` when it can): ``cuda-bindings`` is not
    installed, or it is but the NVRTC library (``nvidia-cuda-nvrtc-cu12``) does not load."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        return f"cuda-bindings is not installed ({e})"
    try:
        err, *_ = nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - cuda-bindings raises RuntimeError (or OSError) when libnvrtc is absent
        return f"the NVRTC library does not load ({type(e).__name__}: {e})"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"nvrtcVersion failed: {err}"
    return None


def compile_ptx(code: str, name: str = "source.cu", arch: str = "compute_90") -> str:
    """Compile CUDA C ``code`` to PTX with NVRTC; raise :class:`CompileError` with the log."""
    from cuda.bindings import nvrtc

    def ok(result, what):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{what}: {err}")
        return rest[0] if rest else None

    prog = ok(nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in OPTIONS]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        ok(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{name} does not compile:\n{log.decode(errors='replace').rstrip(chr(0))}")
        size = ok(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        ok(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@functools.cache
def _module(filename: str):
    import cupy

    return cupy.RawModule(code=(KERNELS / filename).read_text(), options=OPTIONS)


def raw_kernel(filename: str, kernel: str):
    """``kernel`` from ``kernels/<filename>`` as a CuPy RawKernel (compiled on first use)."""
    return _module(filename).get_function(kernel)
