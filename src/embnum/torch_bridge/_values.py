"""The schema value checks: every argument of a bridge call checked against its torch schema
type before torch's schema parser sees it (which raises a ``RuntimeError`` naming no argument)."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np
import torch

_INT64 = (-(2**63), 2**63 - 1)


def _is_int(x) -> bool:
    return (isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))) or isinstance(x, torch.SymInt)


def _exact_float(i: int) -> bool:
    try:
        return int(float(i)) == i
    except OverflowError:
        return False


def check_value(name: str, kind: str, x):
    """``x`` as the schema type ``kind`` takes it (NumPy scalars as Python ones);
    ``TypeError``/``ValueError`` naming ``name`` when it does not fit.

    A list of plain items (Python ints in the int64 range, ``str``, ``torch.Tensor``; lists of
    those) is recognised by :data:`PLAIN_LISTS` in one pass (a keyed_tensor call
    passes nested key lists); anything else takes :func:`check_exact`, which gives the same
    result for those and raises the errors."""
    plain = PLAIN_LISTS.get(kind)
    if plain is not None:
        got = plain(x)
        if got is not None:
            return got
    return check_exact(name, kind, x)


def _plain_items(test: Callable) -> Callable:
    """``check(x)``: a new list of ``x``'s items when ``x`` is a list/tuple whose every item
    passes ``test`` (then the exact rule returns each item unchanged), else None."""

    def check(x):
        if type(x) is not list and type(x) is not tuple:
            return None
        for v in x:
            if not test(v):
                return None
        return list(x)

    return check


def _plain_lists(inner: Callable) -> Callable:
    """``check(x)``: a list of ``inner(item)`` when ``x`` is a list/tuple and ``inner`` takes
    every item, else None."""

    def check(x):
        if type(x) is not list and type(x) is not tuple:
            return None
        out = []
        for v in x:
            got = inner(v)
            if got is None:
                return None
            out.append(got)
        return out

    return check


def _plain_int(v) -> bool:
    return type(v) is int and -(2**63) <= v < 2**63  # bool is not int here, as in _is_int


_plain_ints = _plain_items(_plain_int)
_plain_strs = _plain_items(lambda v: type(v) is str)
PLAIN_LISTS = {
    "int[]": _plain_ints,
    "SymInt[]": _plain_ints,
    "int[][]": _plain_lists(_plain_ints),
    "str[]": _plain_strs,
    "str[][]": _plain_lists(_plain_strs),
    "Tensor[]": _plain_items(lambda v: type(v) is torch.Tensor),
}


def _plain_scalar(test: Callable, optional: bool) -> Callable:
    if not optional:
        return test
    return lambda x: x is None or test(x)


_PLAIN_SCALARS = {
    "bool": lambda x: type(x) is bool,
    "int": _plain_int,
    "SymInt": _plain_int,
    "float": lambda x: type(x) is float,
    "str": lambda x: type(x) is str,
}


def unchanged_test(kind: str) -> Callable | None:
    """``test(x)``: True where :func:`check_exact` returns ``x`` itself for the schema type
    ``kind`` (a Python bool, an int in the int64 range, a float or a str of that type; None for
    an optional one), so a call may skip the check; None for every other kind (tensors, lists)."""
    optional = kind.endswith("?")
    base = _PLAIN_SCALARS.get(kind[:-1] if optional else kind)
    if base is not None:
        return _plain_scalar(base, optional)
    if optional:  # an optional list: None passes as it is
        return lambda x: x is None
    return None


def check_exact(name: str, kind: str, x):
    """:func:`check_value`'s rules, every case."""
    if kind.endswith("?"):
        if x is None:
            return None
        kind = kind[:-1]
    if kind.endswith("[]"):
        if not isinstance(x, (list, tuple)):
            raise TypeError(f"{name} must be a list, got {type(x).__name__}")
        return [check_exact(f"{name}[{i}]", kind[:-2], item) for i, item in enumerate(x)]
    if kind.startswith("Tensor"):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    elif kind in ("int", "SymInt"):
        if isinstance(x, torch.SymInt):
            return x
        if not _is_int(x):
            raise TypeError(f"{name} must be an int, got {x!r}")
        if not _INT64[0] <= int(x) <= _INT64[1]:
            raise ValueError(f"{name} = {int(x)} is outside the int64 range the torch schema carries")
        return int(x)
    elif kind == "float":
        if isinstance(x, (torch.SymFloat, torch.SymInt)):
            return x
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {x!r}")
        if isinstance(x, numbers.Integral) and not _exact_float(int(x)):
            raise ValueError(f"{name} = {int(x)} cannot be carried exactly by the torch schema (a float64)")
        return int(x) if isinstance(x, np.integer) else x  # a NumPy float scalar may carry exact bits
    elif kind == "bool":
        if isinstance(x, torch.SymBool):
            return x
        if not isinstance(x, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {x!r}")
        return bool(x)
    elif kind == "str":
        if not isinstance(x, str):
            raise TypeError(f"{name} must be a str, got {x!r}")
    return x
