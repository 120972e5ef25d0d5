"""Stage ``versions``: what runs here (packages, the device), and the versions that would mislead."""

from __future__ import annotations

import importlib.metadata
import platform
import sys


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _at_least(version: str | None, low: tuple) -> bool:
    if version is None:
        return False
    parts = []
    for p in version.split(".")[: len(low)]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= low


def device(sim: bool) -> dict:
    if sim:
        return {"name": "Numba CUDA simulator"}
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    free, total = dev.mem_info
    return {
        "name": props["name"].decode(),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessors": props["multiProcessorCount"],
        "memory_GiB": round(total / 2**30, 1),
        "free_GiB": round(free / 2**30, 1),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "runtime": cupy.cuda.runtime.runtimeGetVersion(),
    }


def stage(ctx, limit) -> tuple[str, str]:
    import embnum

    dists = ["numpy", "numba", "numba-cuda", "cuda-bindings", "cuda-core", "torch", "setuptools", "pytest"]
    dists += ["pytest-timeout", "hypothesis", "fbgemm-gpu", "fbgemm-gpu-cpu"]
    cupy = next((d for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if _version(d)), "cupy-cuda13x")
    found = {"python": sys.version.split()[0], "platform": platform.platform(), "embnum": embnum.__version__}
    found.update({d: _version(d) for d in [*dists, cupy]})
    warnings = []
    if not _at_least(found["numba-cuda"], (0, 25)):
        warnings.append(f"numba-cuda {found['numba-cuda']} synchronises a stream per CuPy argument (needs 0.25)")
    if not _at_least(found["setuptools"], (64,)):
        warnings.append(f"setuptools {found['setuptools']} cannot install embnum without a registry (needs 64)")
    if found["pytest-timeout"] is None:
        warnings.append("pytest-timeout is not installed: the pytest stage has only its overall limit")
    try:
        import torch

        found["torch_cuda"] = torch.version.cuda
        found["torch_sees_gpu"] = torch.cuda.is_available()
    except ImportError:
        warnings.append("torch is not importable: the bridge, FusedTBE and profiler checks cannot run")
    found["device"] = device(ctx.sim)
    found["warnings"] = warnings
    ctx.write("versions", found)
    dev = found["device"]
    line = f"{dev['name']}" + ("" if ctx.sim else f", {dev['multiprocessors']} SMs, {dev['memory_GiB']} GiB")
    line += f"; numba-cuda {found['numba-cuda']}, torch {found['torch']}, {cupy} {found[cupy]}"
    if warnings:
        line += "; warnings: " + "; ".join(warnings)
    return "ok", line
