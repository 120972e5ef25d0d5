"""Construction-time checks shared by the containers (ValueError/TypeError naming the argument)."""

from __future__ import annotations

import numbers

import numpy as np

from . import _arrays as A


def keys(name: str, ks) -> list[str]:
    """A list of distinct str."""
    if isinstance(ks, str) or not isinstance(ks, (list, tuple)):
        raise TypeError(f"{name} must be a list of str, got {type(ks).__name__}")
    seen: dict[str, int] = {}
    for i, k in enumerate(ks):
        if not isinstance(k, str):
            raise TypeError(f"{name}[{i}] must be a str, got {k!r}")
        if k in seen:
            raise ValueError(f"{name} must be distinct, but {name}[{i}] = {k!r} repeats {name}[{seen[k]}]")
        seen[k] = i
    return list(ks)


def int_value(name: str, x, *, minimum: int = 0) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def flag(name: str, x) -> bool:
    """A Python or NumPy bool (``TypeError`` otherwise: ``2**32 - 1`` is not a yes)."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return bool(x)


def int_list(name: str, xs, *, minimum: int = 0) -> list[int]:
    """A list/tuple of ints, or a 1-D integer array (a float array is not truncated, a 0-d one
    is not a list)."""
    if A.is_supported(xs):
        array(name, xs, integer=True)
        xs = A.to_list(xs)
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints, got {type(xs).__name__}")
    return [int_value(f"{name}[{i}]", x, minimum=minimum) for i, x in enumerate(xs)]


def array(name: str, a, *, ndim=1, integer=False, floating=False, index=False):
    """A NumPy/CuPy array or torch tensor of a numeric dtype with ``ndim`` dimensions (an int or
    a minimum ``(k,)``); ``index``: int32 or int64 (lengths, offsets)."""
    if not A.is_supported(a):
        raise TypeError(f"{name} must be a NumPy array, a CuPy array or a torch tensor, got {type(a).__name__}")
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; pass its data (a.filled(...) or a.data): its mask would be dropped")
    if not A.is_numeric(a):
        raise TypeError(f"{name} must have a numeric dtype, got {A.dtype_name(a)}")
    if index and not A.is_index(a):
        raise TypeError(f"{name} must have an integer dtype int32 or int64, got {A.dtype_name(a)}")
    ok = a.ndim >= ndim[0] if isinstance(ndim, tuple) else a.ndim == ndim
    if not ok:
        want = f"at least {ndim[0]}-D" if isinstance(ndim, tuple) else f"{ndim}-D"
        raise ValueError(f"{name} must be {want}, got shape {tuple(a.shape)}")
    if integer and not A.is_integer(a):
        raise TypeError(f"{name} must have an integer dtype (int32/int64), got {A.dtype_name(a)}")
    if floating and not A.is_float(a):
        raise TypeError(f"{name} must have a float dtype, got {A.dtype_name(a)}")
    return a


def nonneg(name: str, a) -> None:
    """Every entry ``>= 0`` (a host read; skipped while torch.compile traces)."""
    if A.compiling() or a.shape[0] == 0:
        return
    if int(a.min()) < 0:
        i = A.first_true(a < 0)
        raise ValueError(f"{name} must be >= 0, but {name}[{i}] = {int(a[i])}")


def lengths_match(lengths_name: str, lengths, values_name: str, n: int) -> None:
    """``sum(lengths) == n`` for lengths already ``>= 0``, summed without wrapping (host reads;
    skipped while torch.compile traces)."""
    if A.compiling():
        return
    s = 0
    if lengths.shape[0]:
        top = int(lengths.max())
        if top > n:
            i = A.first_true(lengths == top)
            raise ValueError(
                f"{lengths_name}[{i}] = {top} exceeds len({values_name}) = {n}: {lengths_name} must sum to it"
            )
        s = A.total(lengths, top)
    if s != n:
        raise ValueError(f"{lengths_name} sums to {s} but len({values_name}) = {n}: they must be equal")


def offsets_array(name: str, offs, values_name: str, n: int) -> None:
    """Starts at 0, non-decreasing, ends at ``n`` (host reads; skipped while torch.compile traces)."""
    if offs.shape[0] == 0:
        raise ValueError(f"{name} must have at least one entry (0), got an empty array")
    if A.compiling():
        return
    if int(offs[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(offs[0])}")
    if offs.shape[0] > 1:
        down = offs[1:] < offs[:-1]  # compared, not subtracted: a difference can wrap
        if bool(down.any()):
            i = A.first_true(down) + 1
            raise ValueError(f"{name} must be non-decreasing, but {name}[{i}] = {int(offs[i])} < {int(offs[i - 1])}")
    if int(offs[-1]) != n:
        raise ValueError(f"{name}[-1] = {int(offs[-1])} must equal len({values_name}) = {n}")


def same_lengths(lengths, offs) -> None:
    """``offsets`` is the complete cumsum of ``lengths`` when both are given."""
    if offs.shape[0] != lengths.shape[0] + 1:
        raise ValueError(f"offsets must have len(lengths) + 1 = {lengths.shape[0] + 1} entries, got {offs.shape[0]}")
    if A.compiling() or lengths.shape[0] == 0:
        return
    bad = A.diff(offs) != lengths
    if bool(bad.any()):
        i = A.first_true(bad)
        raise ValueError(
            f"offsets and lengths disagree at bag {i}: offsets step {int(A.diff(offs)[i])}, length {int(lengths[i])}"
        )


def strides(keys, n_bags, stride, spkpr, spk, inverse_indices):
    """``(stride, stride_per_key_per_rank or None)`` checked against ``len(lengths)``."""
    T = len(keys)
    if spkpr is None and spk is not None:
        spkpr = [[s] for s in int_list("stride_per_key", spk)]
    if spkpr is not None:
        if A.is_supported(spkpr):
            spkpr = [A.to_list(r) for r in spkpr.reshape(T, -1)] if T else []
        if not isinstance(spkpr, (list, tuple)) or len(spkpr) != T:
            raise ValueError(f"stride_per_key_per_rank must hold one list per key ({T}), got {spkpr!r}")
        spkpr = [int_list(f"stride_per_key_per_rank[{t}]", r) for t, r in enumerate(spkpr)]
        per_key = [sum(r) for r in spkpr]  # lists, not generators: torch.compile traces this
        total = sum(per_key)
        if total != n_bags:
            raise ValueError(
                f"stride_per_key_per_rank sums to {total} bags but lengths has {n_bags} entries: they must be equal"
            )
        if stride is None:
            if inverse_indices is not None and inverse_indices[1].numel():
                stride = int(inverse_indices[1].shape[-1])
            else:
                stride = max(per_key) if per_key else 0
        return int_value("stride", stride), spkpr
    if T == 0:
        if n_bags:
            raise ValueError(f"keys is empty but lengths has {n_bags} entries")
        return (0 if stride is None else int_value("stride", stride)), None
    if stride is None:
        if n_bags % T:
            raise ValueError(
                f"len(lengths) = {n_bags} is not a multiple of len(keys) = {T}: give stride_per_key_per_rank "
                "for a variable batch per key"
            )
        return n_bags // T, None
    stride = int_value("stride", stride)
    if stride * T != n_bags:
        raise ValueError(
            f"stride = {stride} does not fit: len(lengths) = {n_bags} must be stride * len(keys) = {stride * T}"
        )
    return stride, None


def jagged_arrays(cls_name: str, values, weights, lengths, offsets) -> int:
    """The checks every jagged container makes of its arrays; returns the number of bags."""
    n = values.shape[0]
    if lengths is None and offsets is None:
        raise ValueError(f"{cls_name} needs lengths or offsets, got neither")
    if lengths is not None:
        array("lengths", lengths, index=True)
        A.same_place("lengths", lengths, values, "values")
        nonneg("lengths", lengths)
        lengths_match("lengths", lengths, "values", n)
        n_bags = lengths.shape[0]
    if offsets is not None:
        array("offsets", offsets, index=True)
        A.same_place("offsets", offsets, values, "values")
        offsets_array("offsets", offsets, "values", n)
        if lengths is not None:
            same_lengths(lengths, offsets)
        n_bags = offsets.shape[0] - 1
    if weights is not None:
        array("weights", weights, floating=True)
        A.same_place("weights", weights, values, "values")
        if weights.shape[0] != n:
            raise ValueError(f"len(weights) = {weights.shape[0]} must equal len(values) = {n}")
    return n_bags
