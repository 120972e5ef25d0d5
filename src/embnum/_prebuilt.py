"""Host kernels compiled ahead and shipped inside the package, for a fast first call.

A first call on a cold cache compiles its kernels (0.4-2.7 s per op on the 2-core VMs the
project is measured on, minutes for the whole tour); fbgemm's kernels come prebuilt. Here
``python -m embnum warmup --prebuilt`` runs the warmup's work (every op's small and large tour
examples on the cpu backend) in worker processes whose Numba compiles for :data:`BASELINE_CPU`
with :data:`BASELINE_FEATURES` instead of for this machine's CPU, on an empty cache directory,
then copies that cache into ``embnum/_prebuilt/<package>/`` (``embnum._warmup.prebuild``). A
wheel built afterwards carries it (setup.py).

A process loads a kernel from there when its own cache lacks it (``embnum._jit``: the same
index key, with the baseline's CPU name and features in place of the host's) and only where the
host has every baseline feature (:func:`usable`); Python and Numba versions, the platform and
the sources must match too (the index files are named per Python version, stamped with Numba's
version and a hash of every embnum source the kernel reads). Anything else compiles as before.

The baseline is x86-64-v3 (AVX2, FMA, BMI2; x86-64 servers since about 2015): on the 2-core
AMD EPYC VM its kernels ran as fast as ones compiled for the host (benchmarks/RESULTS.md).
``EMBNUM_PREBUILT_DIR`` names another directory to load from, or, set empty, turns loading off.
"""

from __future__ import annotations

import functools
import os
import platform

BASELINE_CPU = "x86-64-v3"
BASELINE_FEATURES = (
    "avx", "avx2", "bmi", "bmi2", "cx16", "f16c", "fma", "lzcnt",
    "movbe", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3", "xsave",
)  # fmt: skip
ENV = "EMBNUM_PREBUILT_DIR"
PACKAGE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.join(PACKAGE, "_prebuilt")


def features() -> str:
    """:data:`BASELINE_FEATURES` as LLVM's feature string (``NUMBA_CPU_FEATURES``)."""
    return ",".join("+" + f for f in BASELINE_FEATURES)


def magic(host_magic: tuple) -> tuple:
    """The ``(triple, cpu, features)`` part of a prebuilt kernel's index key, for a host whose
    own is ``host_magic`` (Numba's ``codegen.magic_tuple()``)."""
    return (host_magic[0], BASELINE_CPU, features())


def root() -> str | None:
    """Where prebuilt kernels are loaded from: ``$EMBNUM_PREBUILT_DIR`` when set (empty: nowhere),
    else ``embnum/_prebuilt``."""
    where = os.environ.get(ENV, DEFAULT_ROOT)
    return where or None


@functools.cache
def usable() -> bool:
    """Whether this host runs code built for the baseline: x86-64 with every baseline feature."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    from llvmlite import binding

    try:
        host = binding.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot tell on this host
        return False
    return all(host.get(f, False) for f in BASELINE_FEATURES)


def package_key(directory: str) -> str:
    """``embnum`` or ``embnum.cpu``: the name of a package directory inside the prebuilt root."""
    rel = os.path.relpath(directory, PACKAGE)
    return "embnum" if rel == "." else "embnum." + rel.replace(os.sep, ".")


@functools.cache
def directory_of(py_file: str) -> str | None:
    """The prebuilt directory for kernels defined in ``py_file``, or None (nothing to load: loading
    off, a host without the baseline, or no kernels built for that package)."""
    where = root()
    if where is None or not usable():
        return None
    path = os.path.join(where, package_key(os.path.dirname(os.path.abspath(py_file))))
    return path if os.path.isdir(path) else None


def describe() -> str:
    """``kernels prebuilt for x86-64-v3`` where this process would load some, else ``""``."""
    where = root()
    if where is None or not usable() or not os.path.isdir(where) or not os.listdir(where):
        return ""
    return f"kernels prebuilt for {BASELINE_CPU}"
