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

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from .. import _half, _offsets_walk
from .._jit import njit

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
# estimate). Both are constants (generated code has them written in, see serial_rule).
# SERIAL_OVERRIDE (tests, benchmarks): one limit for every kernel, read on every call.
SERIAL_BYTES = 1 << 16
SERIAL_BYTES_OF: Mapping[str, int] = MappingProxyType(
    {
        "complete_cumsum": 0,
        "exclusive_cumsum": 0,
        "inclusive_cumsum": 0,
        "permute_2d_sparse_data": 0,
        "permute_1d_sparse_data": 0,
        "invert_permute": 0,  # a serial scatter since issue 12 item 6: no parallel region
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
)  # read-only: serial_rule writes a kernel's threshold into generated code
SERIAL_OVERRIDE: int | None = None


def _thread_control():
    """``(get, set)`` of Numba's thread count: the runtime's own C entry points where this
    Numba exposes them (a fraction of a microsecond), else the public functions."""
    import numba
    from numba.np.ufunc import parallel

    parallel._launch_threads()
    get, put = getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None)
    if get is None or put is None:
        return numba.get_num_threads, numba.set_num_threads
    return get, put


_GET_THREADS, _SET_THREADS = _thread_control()


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
    n = _GET_THREADS()
    if n == 1:
        return fn(*args, **kwargs)
    _SET_THREADS(1)
    try:
        return fn(*args, **kwargs)
    finally:
        _SET_THREADS(n)


def small_call(impl, args: dict, out):
    """``impl(**args, out=out)`` (``out`` omitted when None), on one thread when the arrays
    it touches hold fewer than the kernel's threshold (``SERIAL_BYTES_OF[impl.__name__]``,
    else ``SERIAL_BYTES``; ``SERIAL_OVERRIDE`` when set). Kernels whose work is not told by
    their arrays' sizes (a lookup into a large table) apply the rule to their own work."""
    limit = SERIAL_OVERRIDE if SERIAL_OVERRIDE is not None else SERIAL_BYTES_OF.get(impl.__name__, SERIAL_BYTES)
    if limit:
        n = _GET_THREADS()  # on_one_thread written inline (and no byte count on one thread): every small call
        if n != 1 and array_bytes(args, out, limit) < limit:
            _SET_THREADS(1)
            try:
                return impl(**args) if out is None else impl(**args, out=out)
            finally:
                _SET_THREADS(n)
    return impl(**args) if out is None else impl(**args, out=out)


def serial_rule(name: str, call: str, args: str, out: str) -> list[str]:
    """:func:`small_call`'s rule for the kernel ``name`` as lines of Python source, for code that
    writes it inline (:func:`kernel_runner`; the registry's generated public function): ``call``
    (the kernel's positional call) unless the arrays may need one thread, then
    ``small_call(_impl, <args>, <out>)``. The kernel's threshold (``SERIAL_BYTES_OF[name]``, else
    ``SERIAL_BYTES``: constants) is written into the lines; ``SERIAL_OVERRIDE`` and the thread
    count are read on every call. The lines read ``_common`` (this module) and ``_impl`` (the
    kernel) from their scope and may assign ``_limit``."""
    small = f"    _common.small_call(_impl, {args}, {out})"
    limit = SERIAL_BYTES_OF.get(name, SERIAL_BYTES)
    if not limit:  # no threshold: only an override can ask for one thread
        return ["if _common.SERIAL_OVERRIDE and _common._GET_THREADS() != 1:", small, "else:", f"    {call}"]
    return [
        "_limit = _common.SERIAL_OVERRIDE",
        "if _limit is None:",
        f"    _limit = {int(limit)}",
        "if _limit and _common._GET_THREADS() != 1:",
        small,
        "else:",
        f"    {call}",
    ]


def positional_call(names, args: str, out: str) -> str:
    """``_impl(<args>['a'], <args>['b'], <out>)``: a kernel whose parameters are exactly ``names``
    then ``out``, called positionally (a missing key is still a ``KeyError``)."""
    return "_impl(" + ", ".join([f"{args}[{n!r}]" for n in names] + [out]) + ")"


def kernel_runner(impl, name: str, names) -> object:
    """``run(impl, args, out)``: :func:`small_call` for a kernel whose parameters are exactly
    ``names`` (the keys of its plan's ``args``, in order) then ``out``, with the kernel called
    positionally (:func:`positional_call`), which saves the keyword-dict merge of
    ``impl(**args, out=out)`` (~0.3 us) on every small call; the rule is :func:`serial_rule`'s."""
    import sys

    lines = serial_rule(name, positional_call(names, "_args", "_out"), "_args", "_out")
    src = "def run(_impl, _args, _out):\n" + "".join(f"    {line}\n" for line in lines)
    namespace = {"_common": sys.modules[__name__]}
    exec(compile(src, f"<embnum kernel runner {name}>", "exec"), namespace)
    return namespace["run"]


def serial_twin(kernel):
    """``kernel`` (a ``parallel=True`` njit function) compiled once more without the parallel
    runtime: the same code, ``prange`` run as ``range``, so the same results. Entering a parallel
    region costs ~2 us even on one thread; small calls, which run on one thread anyway, take the
    twin (see :func:`one_thread`). The twin is a copy of the Python function under its own name,
    so Numba's on-disk cache (keyed by name and signature, not by the parallel flag) keeps the two
    apart."""
    import types

    fn = kernel.py_func
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_serial"
    twin.__doc__ = fn.__doc__
    return njit(cache=True)(twin)


def one_thread() -> bool:
    """Whether Numba runs this thread's parallel regions on one thread now (``NUMBA_NUM_THREADS=1``,
    or inside :func:`small_call`'s one-thread window): then a :func:`serial_twin` does the same work."""
    return _GET_THREADS() == 1
