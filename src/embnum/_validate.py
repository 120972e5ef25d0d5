"""Argument checks shared by every op and backend.

Each check raises ``TypeError`` (wrong kind or dtype), ``ValueError`` (wrong
shape or content) or ``IndexError`` (an index out of range), with a message
that names the argument and the offending value. Checks work on NumPy and
CuPy arrays alike (``xp`` is the array's module); they never modify inputs.
"""

from __future__ import annotations

import functools
import numbers
import operator

import numpy as np

from ._backend import is_array, is_cupy, to_host  # noqa: F401 - to_host: checks read device data through it

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
VALUE_DTYPES = FLOAT_DTYPES + INDEX_DTYPES
INT32_MAX = 2**31 - 1


def xp_of(a):
    if is_cupy(a):
        import cupy

        return cupy
    return np


def _names(dtypes) -> str:
    return "/".join(str(d) for d in dtypes)


def array(name: str, a, *, ndim=None, dtypes=None):
    """Check that ``a`` is a NumPy/CuPy array of an allowed ndim and dtype."""
    if type(a) is not np.ndarray and not is_array(a):  # the plain-NumPy test first: the per-call path
        raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(a).__name__}")
    if ndim is not None:
        n = a.ndim
        if n != ndim and (isinstance(ndim, int) or n not in ndim):
            allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
            want = " or ".join(f"{n}-D" for n in allowed)
            raise ValueError(f"{name} must be {want}, got shape {tuple(a.shape)}")
    if dtypes is not None and a.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_names(dtypes)}, got {a.dtype}")
    return a


def index_array(name: str, a, *, ndim=1):
    """An int32/int64 index, length or offset array."""
    if type(a) is np.ndarray:  # the per-call case, tested without a second call; errors from array()
        n = a.ndim
        if (n == ndim or ndim is None or (type(ndim) is not int and n in ndim)) and a.dtype in INDEX_DTYPES:
            return a
    return array(name, a, ndim=ndim, dtypes=INDEX_DTYPES)


def array_list(name: str, arrays, *, min_len=0, max_len=None):
    """A Python list or tuple of arrays (a bare array is a ``TypeError``)."""
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of arrays, got {type(arrays).__name__}")
    n = len(arrays)
    if n < min_len or (max_len is not None and n > max_len):
        bounds = f"between {min_len} and {max_len}" if max_len is not None else f"at least {min_len}"
        raise ValueError(f"{name} must hold {bounds} arrays, got {n}")
    for i, a in enumerate(arrays):
        array(f"{name}[{i}]", a)
    return list(arrays)


def _is_int(v) -> bool:
    """The one integer rule: a Python or NumPy integer; ``bool`` and ``np.bool_`` are not integers."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def integer(name: str, v, *, min=None, max=None, what: str = "an int") -> int:
    """A Python/NumPy integer (``TypeError`` otherwise, ``bool`` included) within
    ``[min, max]`` where given (``ValueError``); returned as a Python int."""
    if not _is_int(v):
        raise TypeError(f"{name} must be {what}, got {v!r}")
    v = operator.index(v)
    if (min is not None and v < min) or (max is not None and v > max):
        bounds = f">= {min}" if max is None else f"<= {max}" if min is None else f"in {min}..{max}"
        raise ValueError(f"{name} must be {bounds}, got {v}")
    return v


def size(name: str, v, *, limit: int | None = None) -> int:
    """A non-negative Python/NumPy integer (``bool`` is rejected) at most ``limit``
    (default :data:`MAX_SIZE`: a larger size cannot be an array), as a Python int."""
    v = integer(name, v, min=0, what="a non-negative int")
    if v > (MAX_SIZE if limit is None else limit):
        raise ValueError(f"{name} = {v} exceeds {_limit_text(limit)}")
    return v


def positive(name: str, v) -> int:
    """A Python/NumPy integer ``>= 1`` (``bool`` is rejected)."""
    return integer(name, v, min=1, what="a positive int")


def flag(name: str, v) -> bool:
    """A Python or NumPy bool (``TypeError`` for anything else, 0 and 1 included)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {v!r}")
    return bool(v)


def real(name: str, v) -> float:
    """A Python/NumPy real number (``bool`` is rejected), as a Python float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {v!r}")
    return float(v)


def choice(name: str, value, table: dict[str, int]) -> int:
    """A mode given by name (any case) or by its integer code: ``table`` maps the
    names to the codes (``{"sum": 0, "mean": 1, "none": 2}``); returns the code."""
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    if _is_int(value) and int(value) in table.values():
        return int(value)
    names = ", ".join(repr(k) for k in table)
    codes = sorted(set(table.values()))
    raise ValueError(f"{name} must be one of {names} or a code {codes[0]}..{codes[-1]}, got {value!r}")


HALF_OR_FLOAT = (np.dtype(np.float32), np.dtype(np.float16))


def output_dtype(value, allowed=HALF_OR_FLOAT, name: str = "output_dtype") -> np.dtype:
    """A dtype name or NumPy dtype among ``allowed`` (default float32/float16); ``TypeError`` otherwise
    (``"bfloat16"`` gets its own message: NumPy has no such dtype)."""
    if isinstance(value, str) and value.lower() == "bfloat16":
        raise TypeError(f"{name} bfloat16 is not supported (NumPy has no bfloat16); use {_choices(allowed)}")
    try:
        dt = np.dtype(value)
    except (TypeError, ValueError):  # ValueError: NumPy's answer to a torch tensor
        dt = None
    if dt not in allowed:
        raise TypeError(f"{name} must be {_choices(allowed)}, got {value!r}")
    return dt


def _choices(dtypes) -> str:
    """``'float32' or 'float16'`` (built only for an error message: naming dtypes is slow)."""
    return " or ".join(repr(str(d)) for d in dtypes)


def int_list(name: str, v, *, length=None) -> list[int]:
    """A list/tuple (or 1-D integer NumPy array) of non-negative ints."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu":
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of ints, got {type(v).__name__}")
    if all(type(x) is int and 0 <= x <= MAX_SIZE for x in v):  # the usual case: no name built per entry
        out = list(v)
    else:
        out = [size(f"{name}[{i}]", x) for i, x in enumerate(v)]
    if length is not None and len(out) != length:
        raise ValueError(f"{name} must have {length} entries, got {len(out)}")
    return out


# -- device summaries: several checks of device data, read back in ONE copy ----------------
# (NumPy int32/int64 arrays take the compiled one-pass checks instead: no device to read from)
_HOST_SCALARS = (int, np.integer, np.bool_)


def read_ints(*parts) -> np.ndarray:
    """Device scalars and small 1-D device arrays (bools, integers) as one host int64 array, in
    order: one device-to-host copy for CuPy however many checks feed it (nothing to copy for NumPy)."""
    if all(isinstance(p, _HOST_SCALARS) for p in parts):  # host values: no array work
        return np.array([int(p) for p in parts], dtype=np.int64)
    arrays = [p for p in parts if is_array(p)]
    xp = xp_of(arrays[0]) if arrays else np
    flat = [xp.asarray(p, dtype=xp.int64).reshape(-1) for p in parts]
    return to_host(xp.concatenate(flat) if flat else xp.zeros(0, xp.int64))


def row_sums(a):
    """``a.sum(axis=1, dtype=int64)`` of a 2-D index array: one compiled pass for NumPy
    int32/int64 arrays (NumPy's widening sum costs ~8x as much), the array library's sum
    otherwise."""
    fast = _fast(a)
    if fast is not None:
        return fast.row_sums(a)
    return a.sum(axis=1, dtype=np.int64)


def sum_parts(a) -> list:
    """``[min, int64 sum, big]`` of the integer array ``a`` as device scalars (for :func:`read_ints`);
    ``big`` is 1 where the exact sum may pass MAX_SIZE (then the int64 sum may have wrapped).
    :func:`sum_fits` tells from the three read-back values whether the int64 sum is exact."""
    if a.size == 0:
        return [0, 0, 0]
    fast = _fast(a)
    if fast is not None:  # one compiled pass, exact (the same verdict through sum_fits)
        return [int(x) for x in fast.sum_summary(a, MAX_SIZE)]
    xp = xp_of(a)
    flat = a.reshape(-1)
    big = (flat.max() > MAX_SIZE) | (flat.sum(dtype=xp.float64) > 2.0 * MAX_SIZE)
    return [flat.min(), flat.sum(dtype=xp.int64), big]


def sum_fits(mn, total, big) -> bool:
    """Read-back :func:`sum_parts`: every entry ``>= 0`` and the exact sum ``<= MAX_SIZE``. Then the
    int64 sum did not wrap: a true sum past 2**63 makes the float64 sum (relative error below 1e-12)
    pass 2 * MAX_SIZE, and a true sum below 2**63 is the int64 sum itself."""
    return mn >= 0 and not big and 0 <= total <= MAX_SIZE


def range_parts(a, n) -> list:
    """``[1 if every entry of the index array a lies in [0, n) else 0]`` as a device scalar."""
    if a.size == 0:
        return [1]
    fast = _fast(a)
    if fast is not None:
        lo, hi = fast.min_max(a)
        return [int(lo >= 0 and hi < n)]
    return [(a.min() >= 0) & (a.max() < n)]


def permutation_parts(p, n) -> list:
    """``[in_range, once]`` of the 1-D index array ``p`` (``n`` entries, ``n >= 1``) as device
    scalars: every entry in ``[0, n)``; and no value twice (then ``p`` is a permutation). One
    compiled pass for NumPy arrays."""
    fast = _fast(p)
    if fast is not None:
        return [int(x) for x in fast.permutation_flags(p)]
    xp = xp_of(p)
    seen = xp.bincount(xp.clip(p, 0, n - 1).astype(np.int64), minlength=n)
    return [*range_parts(p, n), seen.max() == 1]


def offsets_parts(offs) -> list:
    """``[offs[0], the first i with offs[i] < offs[i-1] or 0, offs[-1]]`` as device scalars
    (``offs`` 1-D with at least one entry)."""
    fast = _fast(offs)
    if fast is not None:
        return [int(x) for x in fast.offsets_summary(offs)]
    xp = xp_of(offs)
    drop = 0
    if offs.shape[0] > 1:
        falls = offs[1:] < offs[:-1]
        drop = xp.where(falls.any(), xp.argmax(falls) + 1, 0)
    return [offs[0], drop, offs[-1]]


@functools.cache
def compiled():
    """The Numba-compiled generic reductions (:mod:`embnum._validate_numba`), or None where
    Numba is missing (loaded on first use: ``import embnum`` loads no Numba). Each family's
    compiled verdicts load only where this is not None (tests stub it to run the exact rules)."""
    try:
        from . import _validate_numba
    except ImportError:
        return None
    return _validate_numba


def _fast(a):
    """The compiled checks when ``a`` is a plain NumPy int32/int64 array, else None."""
    if type(a) is np.ndarray and a.dtype in INDEX_DTYPES:
        return compiled()
    return None


def min_max(a) -> tuple[int, int]:
    """``(min(a), max(a))`` of a non-empty integer array as Python ints: one compiled pass
    for NumPy int32/int64 arrays (two reductions otherwise)."""
    fast = _fast(a)
    if fast is not None:
        lo, hi = fast.min_max(a)
        return int(lo), int(hi)
    return int(a.min()), int(a.max())


def _offsets_summary(offs) -> tuple[int, int, int]:
    """``(offs[0], the first i with offs[i] < offs[i-1] or 0, offs[-1])``: one compiled pass for
    NumPy offsets; read back once for CuPy ones (one device-to-host copy instead of one per rule)."""
    fast = _fast(offs)
    if fast is not None:
        first, i, last = fast.offsets_summary(offs)
        return int(first), int(i), int(last)
    first, i, last = (int(x) for x in read_ints(*offsets_parts(offs)))
    return first, i, last


def offsets(name: str, offs, *, n_values=None, first_zero=False, last_equals=None, summary=None):
    """Valid offsets: 1-D int32/int64, ``len >= 1``, ``offs[0] >= 0``, non-decreasing,
    ``offs[-1] <= n_values`` (when given). ``summary``: the read-back :func:`offsets_parts`
    of ``offs`` when the caller read it with other checks (else it is read here, once)."""
    index_array(name, offs)
    if offs.shape[0] < 1:
        raise ValueError(f"{name} must have at least 1 entry, got 0")
    first, i, last = _offsets_summary(offs) if summary is None else (int(x) for x in summary)
    if first < 0 or (first_zero and first != 0):
        want = "0" if first_zero else ">= 0"
        raise ValueError(f"{name}[0] must be {want}, got {first}")
    if i > 0:
        raise ValueError(
            f"{name} must be non-decreasing, but {name}[{i}] = {int(offs[i])} < {name}[{i - 1}] = {int(offs[i - 1])}"
        )
    if n_values is not None and last > n_values:
        raise ValueError(f"{name}[-1] = {last} exceeds the {n_values} available rows")
    if last_equals is not None and last != last_equals:
        raise ValueError(f"{name}[-1] must equal {last_equals}, got {last}")
    return offs


def scalar_for(name: str, value, dtype: np.dtype):
    """Convert a padding-like Python/NumPy number to ``dtype``.

    Floats round by IEEE rules (overflow gives inf); integer dtypes need an
    integral value that fits. A NumPy scalar already of ``dtype`` is kept
    bit for bit (NaN payloads included).
    """
    dtype = np.dtype(dtype)
    if isinstance(value, np.generic) and value.dtype == dtype:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            return dtype.type(float(value))
    if isinstance(value, numbers.Integral):
        ivalue = int(value)
    else:
        fvalue = float(value)
        if not np.isfinite(fvalue) or fvalue != int(fvalue):
            raise ValueError(f"{name} must be integral for {dtype} values, got {value!r}")
        ivalue = int(fvalue)
    info = np.iinfo(dtype)
    if not info.min <= ivalue <= info.max:
        raise ValueError(f"{name} = {value!r} does not fit {dtype}")
    return dtype.type(ivalue)


def _byte_span(a) -> tuple[int, int]:
    """[first byte, one past the last byte] that ``a`` can touch."""
    if a.size == 0:
        return (0, 0)
    if is_cupy(a):
        start = a.data.ptr
    else:
        start = a.__array_interface__["data"][0]
    lo = hi = start
    for n, st in zip(a.shape, a.strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return (lo, hi + a.itemsize)


def writable(a) -> bool:
    """Whether ``a`` may be written: NumPy's ``flags.writeable``; CuPy arrays have no such flag
    (device memory is always writable)."""
    return bool(getattr(a.flags, "writeable", True))


def overlaps(a, b) -> bool:
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    return a0 < b1 and b0 < a1


def out_arrays(out, specs, inputs: dict, owns) -> list:
    """Check a user-given ``out`` against the expected ``specs``.

    ``specs`` is a list of ``(shape, dtype)``, or ``None`` for a slot that
    must hold ``None`` (an output that was not requested); ``out`` is one
    array when there is one spec and ``single`` output, else a list or tuple.
    ``owns(a)`` tells whether the chosen backend can write ``a``. Returns
    ``out`` as a list.
    """
    outs = out if isinstance(out, (list, tuple)) else [out]
    if len(outs) != len(specs):
        raise ValueError(f"out must hold {len(specs)} arrays, got {len(outs)}")
    for i, (o, spec) in enumerate(zip(outs, specs)):
        name = "out" if len(specs) == 1 and not isinstance(out, (list, tuple)) else f"out[{i}]"
        if spec is None or o is None:
            if spec is not None or o is not None:
                want = "None (that output is not requested)" if spec is None else "an array, not None"
                raise ValueError(f"{name} must be {want}")
            continue
        shape, dtype = spec
        if not is_array(o):
            raise TypeError(f"{name} must be an array, got {type(o).__name__}")
        if not owns(o):
            raise TypeError(f"{name} lives on the wrong device for this call ({type(o).__module__})")
        if tuple(o.shape) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(o.shape)}")
        if o.dtype != np.dtype(dtype):
            raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {o.dtype}")
        if not o.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if not writable(o):
            raise ValueError(f"{name} is read-only")
        for k, a in inputs.items():
            if overlaps(o, a):
                raise ValueError(f"{name} shares memory with the input {k!r}")
        for j in range(i):
            if outs[j] is not None and overlaps(o, outs[j]):
                raise ValueError(f"{name} shares memory with out[{j}]")
    return list(outs)


# -- overflow-safe checks ---------------------------------------------------------------
# Sizes, sums of lengths and ``offset + length`` bounds are computed so that they cannot
# wrap: scalars as Python ints, arrays with bounds checked before adding or multiplying
# (``offset > width - length``, never ``offset + length > width``) and sums that stay
# exact whatever the entries. The kernels then trust what passed.

INT64_MAX = 2**63 - 1
MAX_SIZE = 2**48
"""Largest element count (and byte count) of any array an op allocates or indexes.

No 64-bit platform gives a process more than 2**48 bytes of address space today
(x86-64 with 4-level paging: 2**47; arm64: 2**48), so a larger size cannot be a real
array; it is rejected with a ``ValueError`` before anything is allocated. Every
position computed from sizes below it fits int64 with room to spare."""


class AllocationError(MemoryError, ValueError):
    """Not enough memory for a call whose sizes are below :data:`MAX_SIZE` (the registry
    turns NumPy's ``MemoryError`` into this: still a ``MemoryError``, and a ``ValueError``
    like every other rejected input)."""


def _limit_text(limit) -> str:
    return "the size limit 2**48 (embnum.MAX_SIZE)" if limit is None or limit == MAX_SIZE else f"{limit}"


def shape_fits(shape) -> bool:
    """Whether every dim is ``>= 0`` and the product of the dims (zeros counted as 1,
    so that strides computed from the other dims stay small too) is at most MAX_SIZE."""
    n = 1
    for d in shape:
        if d < 0:
            return False
        if d:
            n *= d
            if n > MAX_SIZE:
                return False
    return True


def checked_sum(name: str, a, *, limit: int | None = None, what: str = "the sum of") -> int:
    """Exact sum of the non-negative integer array ``a`` (checked ``>= 0`` by the caller) as a
    Python int; ``ValueError`` naming ``name`` when it exceeds ``limit`` (default MAX_SIZE).

    The sum never wraps: when ``len(a) * max(a)`` could pass int64 it is taken in chunks
    whose int64 sums cannot wrap."""
    limit = MAX_SIZE if limit is None else limit
    n = a.size
    if n == 0:
        return 0
    fast = _fast(a)
    if fast is not None and 0 <= limit <= INT64_MAX:
        total = int(fast.bounded_sum(a, limit))
        if total >= 0:
            return total
        # over the limit (or a negative entry): the path below finds which and says so
    flat = a.reshape(-1)
    if a.dtype.itemsize <= 4 and n < 2**32:  # an int32 entry is < 2**31: n * 2**31 < 2**63
        total = int(flat.sum(dtype=np.int64))
    else:
        top = int(flat.max())
        if top > limit:
            i = int(xp_of(a).argmax(flat > limit))
            raise ValueError(f"{what} {name} exceeds {_limit_text(limit)}: entry {i} alone is {top}")
        chunk = INT64_MAX // max(top, 1)
        if chunk >= n:
            total = int(flat.sum(dtype=np.int64))
        else:
            total = sum(int(flat[i : i + chunk].sum(dtype=np.int64)) for i in range(0, n, chunk))
    if total > limit:
        raise ValueError(f"{what} {name} = {total} exceeds {_limit_text(limit)}")
    return total


def spans_exceed(start, length, limit):
    """Elementwise ``start + length > limit`` without forming ``start + length``.

    ``start``, ``length`` and ``limit`` are int64 arrays (or Python ints) with
    ``length >= 0`` and ``limit >= 0`` (then ``limit - length`` cannot wrap)."""
    return start > limit - length


def arrays_in(arguments: dict) -> dict:
    """Every array among ``arguments``' values, by name; an array in a list or tuple
    argument ``k`` is named ``k[i]``."""
    found = {}
    for k, x in arguments.items():
        if is_array(x):
            found[k] = x
        elif isinstance(x, (list, tuple)):
            for i, item in enumerate(x):
                if is_array(item):
                    found[f"{k}[{i}]"] = item
    return found


def no_alias(arguments: dict, written) -> None:
    """``ValueError`` naming both when an array an in-place op writes (its ``written``
    argument names) shares memory with any other array argument, or is passed twice.

    ``arguments`` maps names to values (arrays, lists of arrays, anything else); every
    in-place op calls this with all its arguments, so new state arrays are covered.
    The verdict is ``np.may_share_memory``'s default (bounds) one for NumPy arrays and
    :func:`overlaps` otherwise, pair by pair in argument order (the first pair is named);
    a pair with no written member is not compared. Nothing here is compiled: a compiled
    byte span per array type cost the op's first call 0.5-0.9 s of compiling for ~4 us
    a call saved."""
    arrays = arrays_in(arguments)
    names = list(arrays)
    for i, k in enumerate(names):
        a, mine = arrays[k], k in written
        for m in names[i + 1 :]:
            if (mine or m in written) and (a is arrays[m] or _may_share(a, arrays[m])):
                raise ValueError(f"{k} shares memory with {m}: an in-place op needs its arrays apart")


def _may_share(a, b, _nd=np.ndarray) -> bool:
    if type(a) is _nd and type(b) is _nd:
        return np.may_share_memory(a, b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    return overlaps(a, b)
