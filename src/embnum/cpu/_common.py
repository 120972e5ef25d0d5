"""Helpers shared by the Numba host kernels.

Numba has no float16 on the CPU, and data-movement kernels do not care what
their elements mean: they see every array as unsigned integers of the same
width (:func:`bits`), which also keeps the number of compiled specialisations
small. Arithmetic on float16 goes through the conversions of ``embnum._half``
compiled here once (``half_bits_to_float``, ``half_bits_to_float32``,
``float_to_half_bits``, ...), the shared table (:func:`half_table`) and the
one accumulation rule (:func:`float32_result`, :func:`round_once`: float32
accumulation, one rounding to float16).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import operator
import os
import site
import sys
from collections.abc import Mapping
from types import MappingProxyType

import llvmlite.binding as llvm_binding
import llvmlite.ir as ir
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from .. import _half, _offsets_walk
from .._jit import _cpu_cache, _enable, njit

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous unsigned-integer array of the same item size (no copy
    when ``a`` is already contiguous)."""
    return np.ascontiguousarray(a).view(_UINT[a.dtype.itemsize])


def scalar_bits(x, dtype) -> int:
    """The bit pattern of ``x`` in ``dtype``, as the matching unsigned integer."""
    return np.array(x, dtype=dtype).view(_UINT[np.dtype(dtype).itemsize])[()]


def int64s(a: np.ndarray) -> np.ndarray:
    """A contiguous int64 copy or view of an index array."""
    return np.ascontiguousarray(a, dtype=np.int64)


def pack_offsets(offsets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """J offsets arrays as one flat int64 array plus the start of each: ``(flat, starts[J+1])``."""
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(o) for o in offsets])
    flat = np.concatenate([int64s(o) for o in offsets]) if offsets else np.zeros(0, np.int64)
    return flat, starts


# -- half precision (embnum._half, compiled for the host) ---------------------------
_jit = njit(cache=True, inline="always")
half_bits_to_float = _jit(_half.half_bits_to_float)
float_to_half_bits = _jit(_half.float_to_half_bits)
float32_bits_to_half_bits = _jit(_half.float32_bits_to_half_bits)
half_bits_to_float32_bits = _jit(_half.half_bits_to_float32_bits)
rne = _jit(_half.rne)

# x86 F16C (vcvtph2ps, vcvtps2ph): float16 <-> float32 in hardware, 8 lanes an instruction, the
# same bits as the rules of ``embnum._half`` (widening exact; narrowing to nearest-even, a NaN
# quieted with its top payload bits kept). Without it (another CPU) those rules run per element.
F16C = bool(llvm_binding.get_host_cpu_features().get("f16c", False))


@intrinsic
def widen_half(typingctx, u):
    """The float32 of float16 bits ``u`` (LLVM ``fpext half``: exact; a NaN stays a NaN, quieted)."""

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def narrow_half(typingctx, x):
    """The float16 bits of float32 ``x`` (LLVM ``fptrunc`` to ``half``: nearest-even, overflow to
    infinity, a NaN quieted with its top payload bits kept), as :func:`float32_bits_to_half_bits`
    computes them. Only where :data:`F16C` (elsewhere LLVM would call a library routine)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@_jit
def bits_to_float32(u):
    """``embnum._half.bits_to_float32`` on the host: the float32 with bit pattern ``u``
    (a reinterpretation; NaN payloads kept)."""
    return np.uint32(u).view(np.float32)


@_jit
def float32_to_bits(v):
    """``embnum._half.float32_to_bits`` on the host: the bit pattern (int64) of the float32
    ``v``, NaN -> 0x7FC00000 (a reinterpretation, which the host has and a GPU kernel has not)."""
    if v != v:
        return np.int64(0x7FC00000)
    return np.int64(np.float32(v).view(np.uint32))


@_jit
def half_bits_to_float32(h):
    """The float32 value of the float16 bit pattern ``h`` (exact, through the float32 bits)."""
    return np.uint32(half_bits_to_float32_bits(h)).view(np.float32)


def half_table() -> np.ndarray:
    """The float32 value of every float16 bit pattern (``embnum._half.float32_table``)."""
    return _half.float32_table()


def float32_result(out: np.ndarray) -> np.ndarray:
    """Where a kernel accumulates a result for ``out``: ``out`` itself when it is float32,
    else a float32 scratch of its shape (then :func:`round_once` writes ``out``)."""
    return out if out.dtype == np.float32 else np.empty(out.shape, np.float32)


round_once = _half.round_once


@njit(cache=True, inline="always")
def copy_run(dst, d0, src, s0, n):
    """``dst[d0 : d0 + n] = src[s0 : s0 + n]`` (1-D), element by element through bounded views,
    so the loop vectorises. Kernels copy runs with this, not a slice assignment: Numba compiles
    a slice assignment from an array with its shape-mismatch message, which costs ~2 s of
    string formatting code on a cold cache."""
    d = dst[d0 : d0 + n]
    s = src[s0 : s0 + n]
    for k in range(n):
        d[k] = s[k]


leaf_segment = njit(cache=True)(_offsets_walk.leaf_segment)
slab_of_segment = njit(cache=True)(_offsets_walk.slab_of_segment)


# -- small calls on one thread ----------------------------------------------------------
# A parallel region waits for every Numba thread; on a machine whose cores are busy a
# tiny call then waits for a time slice (median 54 us, p90 8 ms for a tiny TBE forward
# on two threads here), while its work takes microseconds. Below a kernel's threshold
# (bytes of its input and output arrays) the registry runs it with one thread (the
# parallel loops then run inline on the calling thread, no other thread is woken).
#
# SERIAL_BYTES_OF: each kernel's threshold, measured by ``python benchmarks/bench_tail.py
# --sweep`` on a quiet machine (2026-11-24 05:10 UTC, 2 cores, load 1.1; single calls on one
# thread and on all, alternating, inputs of 4 KiB to 16 MiB; table in benchmarks/RESULTS.md):
# the size at which the kernel's one-thread work reaches twice the measured cost of waking
# its parallel region, i.e. where a free second core pays for itself (the sweep's direct
# crossover, where all threads were >= 10% faster by p10, was at or above these sizes for
# every kernel that had one). 0: the kernel has no parallel region (switching the thread
# count would cost ~1.5 us for nothing). Kernels not in the table use SERIAL_BYTES (an
# estimate). SERIAL_OVERRIDE (tests, benchmarks): one limit for every kernel. The cpu backend looks
# a kernel's threshold up once, when it loads the kernel; SERIAL_OVERRIDE is read on every call.
SERIAL_BYTES = 1 << 16
SERIAL_BYTES_OF: Mapping[str, int] = MappingProxyType(
    {
        "complete_cumsum": 0,
        "exclusive_cumsum": 0,
        "inclusive_cumsum": 0,
        "permute_2d_sparse_data": 0,
        "permute_1d_sparse_data": 0,
        "invert_permute": 0,  # a serial scatter: no parallel region
        "expand_into_jagged_permute": 0,  # a serial kernel: switching the thread count only costs (~1.5 us)
        "keyed_jagged_index_select_dim1": 0,  # the permutes' gather: it picks its own threads (SPLIT_BYTES)
        "offsets_range": 1909760,
        "jagged_to_padded_dense": 3133440,
        "dense_to_jagged": 16960176,
        "segment_sum_csr": 886784,
        "block_bucketize_sparse_features": 478208,
        "float_to_fused_8bit_rowwise": 1347584,
        "fused_8bit_rowwise_to_float": 2125824,
        "float_to_fused_nbit_rowwise": 614400,
        "fused_nbit_rowwise_to_float": 1390592,
        "float_to_fp16": 147456,
        "float_to_bfloat16": 3665920,
        "permute_multi_embedding": 5262336,
        # keyed_tensor: small calls take serial kernels (no switch needed); larger ones apply the
        # default rule (SERIAL_BYTES) themselves, in cpu/keyed_tensor.py
        "permute_pooled_embs": 0,
        "permute_multi_embedding_backward": 0,
        "regroup_keyed_tensor": 0,
        "kt_regroup_arguments": 0,  # host Python only
    }
)
SERIAL_OVERRIDE: int | None = None


def _load_tbb() -> str | None:
    """Load the TBB runtime of the ``tbb`` wheel (a dependency of embnum on x86-64), so that Numba's
    default threading layer is TBB: a late or descheduled worker's share of a parallel loop is
    taken by the threads that are running (work stealing), where OpenMP's fixed shares make the
    whole call wait for it (measured: docs/using.md, "A busy machine"). The wheel puts the library in
    ``<prefix>/lib``, which the dynamic loader does not search, and Numba opens it by name: loaded
    here once, by path, the loader finds it by that name. Returns the path loaded, or None (no
    wheel: Numba then picks OpenMP or its own workqueue as before)."""
    name = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib"}.get(sys.platform)
    if name is None:
        return None
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, site.USER_BASE or "")):
        path = os.path.join(prefix, "lib", name)
        if prefix and os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return path
    return None


TBB_LOADED = _load_tbb()


def _thread_control():
    """``(get, set)`` of Numba's thread count: the runtime's own C entry points where this
    Numba exposes them (a fraction of a microsecond), else the public functions."""
    from numba.np.ufunc import parallel

    parallel._launch_threads()
    get, put = getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None)
    if get is None or put is None:
        return numba.get_num_threads, numba.set_num_threads
    return get, put


get_threads, set_threads = _thread_control()


def array_bytes(args: dict, out, limit: int) -> int:
    """Bytes of the arrays among ``args`` (lists of arrays included) and ``out`` (an array,
    a list/tuple of arrays, or None), counted until ``limit`` is reached."""
    total = 0
    for a in (out, *args.values()):
        if type(a) is np.ndarray:
            total += a.nbytes
        elif type(a) is list or type(a) is tuple:
            for x in a:
                if type(x) is np.ndarray:
                    total += x.nbytes
        if total >= limit:
            break
    return total


def on_one_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with Numba's thread count set to 1 for the call."""
    n = get_threads()
    if n == 1:
        return fn(*args, **kwargs)
    set_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        set_threads(n)


def serial_bytes(name: str) -> int:
    """The one-thread threshold of the kernel ``name``: ``SERIAL_OVERRIDE`` when set, else
    ``SERIAL_BYTES_OF[name]``, else ``SERIAL_BYTES`` (0: never switch the thread count). The
    cpu backend's ``run`` (:func:`runner`) applies it to every call."""
    if SERIAL_OVERRIDE is not None:
        return SERIAL_OVERRIDE
    return SERIAL_BYTES_OF.get(name, SERIAL_BYTES)


class _SerialKey:
    """Mixed into the on-disk cache of a :func:`serial_twin`: the parallel kernel's index file
    (the same Python function), its entries keyed apart (Numba keys an entry by signature and
    bytecode, not by the parallel flag, so without the mark a twin would load the parallel
    machine code, or the kernel the serial one)."""

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), "serial")


@functools.cache
def _serial_cache():
    return type("SerialCache", (_SerialKey, _cpu_cache()), {})


def serial_twin(kernel):
    """``kernel`` (a ``parallel=True`` njit function) compiled once more without the parallel
    runtime: the same code, ``prange`` run as ``range``, so the same results. Entering a parallel
    region costs ~2 us even on one thread; small calls, which run on one thread anyway, take the
    twin (see :func:`one_thread`). Cached on disk beside the kernel (:class:`_SerialKey`)."""
    return _enable(njit(kernel.py_func), _serial_cache)


def one_thread() -> bool:
    """Whether Numba runs this thread's parallel regions on one thread now (``NUMBA_NUM_THREADS=1``,
    or inside the cpu backend's one-thread window): then a :func:`serial_twin` does the same work."""
    return get_threads() == 1


def runner(kernel):
    """``run(args, out)`` for ``kernel`` (the cpu backend's ``run``), settled once per kernel: on
    one Numba thread when the arrays the call touches hold fewer bytes than the kernel's threshold
    (:func:`serial_bytes`; a parallel region waits for every thread, which on a busy machine costs
    far more than a small call's work; kernels whose work their arrays do not tell apply the rule
    themselves). A kernel whose parameters are plain names then ``out`` (every cpu kernel but
    TBE's) is called by position, its arguments picked from ``args`` by name (a keyword call binds
    each name anew: about 0.25 us for one argument, 1 us for nine); any other by keyword.
    ``SERIAL_OVERRIDE`` is read on every call; where it or the kernel's threshold is set, the call
    takes the one-thread rule (``ruled``)."""
    threshold = SERIAL_BYTES_OF.get(kernel.__name__, SERIAL_BYTES)

    def by_name(args: dict, out):
        return kernel(**args) if out is None else kernel(**args, out=out)

    def ruled(args: dict, out):
        limit = SERIAL_OVERRIDE
        if limit is None:
            limit = threshold
        if limit and get_threads() != 1 and array_bytes(args, out, limit) < limit:
            return on_one_thread(by_name, args, out)
        return by_name(args, out)

    names = _names_before_out(kernel)
    if names is None:
        return ruled
    if len(names) == 1:
        (name,) = names

        def run(args: dict, out):
            if threshold or SERIAL_OVERRIDE is not None:
                return ruled(args, out)
            return kernel(args[name], out)

    else:
        pick = operator.itemgetter(*names)

        def run(args: dict, out):
            if threshold or SERIAL_OVERRIDE is not None:
                return ruled(args, out)
            return kernel(*pick(args), out)

    return run


def _names_before_out(kernel) -> list[str] | None:
    """The names of ``kernel``'s parameters before its last, ``out``, where every parameter is a
    plain name without a default (the kernel can then be called by position), else None."""
    try:
        params = list(inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)
    if not plain or len(params) < 2 or params[-1].name != "out":
        return None
    return [p.name for p in params[:-1]]


def describe() -> str:
    """``cpu (N threads, layer)``: Numba's thread count and its threading layer (importing this
    module started the threads; the layer is known once a parallel kernel has run)."""
    threads = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # set at import
    try:
        return f"cpu ({threads} threads, {numba.threading_layer()})"
    except ValueError:  # no parallel kernel has run yet
        return f"cpu ({threads} threads)"
