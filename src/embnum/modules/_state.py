"""Checks of a checkpoint before a module loads any of it (``docs/containers.md``, "At the edges").

torch's ``load_state_dict`` copies entry by entry and reports a wrong shape as a
``RuntimeError`` after copying the others; it casts any dtype, and takes NaN, a negative
sum of squares or a negative step. The modules here check every entry of their own
first, so a checkpoint that does not fit is a ``TypeError``/``ValueError`` naming the
entry and leaves the module as it was.

A rule is ``(like, kind)``: ``like`` the module's tensor (its shape, dtype and, for
``"layout"``, its value), ``kind`` one of ``"weights"`` (floating, finite once cast to
``like``'s dtype), ``"signed"`` (the same: a first moment, a momentum), ``"nonneg"`` (the
same and ``>= 0``: a sum of squares, a second moment), ``"step"`` (integer, in ``[0,
MAX_STEP]``), ``"layout"`` (integer, equal to ``like``: the layout is the module's
construction, not state) or ``"bytes"`` (``like``'s dtype exactly, any value: packed quantized rows).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

MAX_STEP = 2**62  # far above any real step count; keeps beta**step and step + 1 in int64


class StateDictError(ValueError, RuntimeError):
    """A checkpoint that does not fit the module: a ``ValueError`` naming the entry (and a
    ``RuntimeError``, the type of torch's own load errors, for code that catches that)."""


def _integer(dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check(state_dict, prefix: str, rules: dict) -> None:
    """Every entry of ``state_dict`` named ``prefix + name`` for a ``name`` of ``rules`` fits its rule
    (entries absent are left to torch's strict/non-strict rule)."""
    for name, (like, kind) in rules.items():
        key = prefix + name
        if key in state_dict:
            check_entry(key, name, state_dict[key], like, kind)


def check_entry(key: str, name: str, x, like, kind: str) -> None:
    """One entry ``x`` (``state_dict[key]``) against the rule ``(like, kind)`` of the module's ``name``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"state_dict[{key!r}] must be a torch.Tensor, got {type(x).__name__}")
    shape = tuple(x.shape)
    if like.dim() == 0 and shape == (1,):
        shape = ()  # torch loads a [1] tensor into a 0-d one
    if shape != tuple(like.shape):
        raise StateDictError(
            f"state_dict[{key!r}] has shape {list(x.shape)} but the module's {name} has {list(like.shape)}"
        )
    if kind == "bytes":
        if x.dtype != like.dtype:
            raise TypeError(f"state_dict[{key!r}] must have dtype {like.dtype} (packed rows), got {x.dtype}")
        return
    if kind in ("step", "layout"):
        if not _integer(x.dtype):
            raise TypeError(f"state_dict[{key!r}] must have an integer dtype, got {x.dtype}")
        _integers(key, name, x.detach().cpu().reshape(-1), like, kind)
        return
    if not x.dtype.is_floating_point:
        raise TypeError(f"state_dict[{key!r}] must have a floating dtype, got {x.dtype}")
    _values(key, x.detach().to(device="cpu", dtype=like.dtype).reshape(-1), kind)


def _integers(key, name, x, like, kind):
    if kind == "layout":
        if x.numel() and not torch.equal(x.to(torch.int64), like.detach().cpu().reshape(-1).to(torch.int64)):
            raise StateDictError(
                f"state_dict[{key!r}] = {x.tolist()} differs from the module's {name} "
                f"{like.reshape(-1).tolist()}: the layout is fixed at construction"
            )
        return
    for i, v in enumerate(x.tolist()):
        if not 0 <= v <= MAX_STEP:
            at = "" if x.numel() == 1 else f"[{i}]"
            raise ValueError(f"state_dict[{key!r}]{at} = {v} must be a step in [0, 2**62]")


def _values(key, x, kind):
    """``x``: the entry as the module will hold it (its dtype: a float64 1e39 is inf in float32)."""
    bad = ~torch.isfinite(x)
    if kind == "nonneg":
        bad |= x < 0
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        why = "finite" if kind != "nonneg" else "finite and >= 0 (a sum of squares)"
        raise ValueError(f"state_dict[{key!r}] must be {why}, but entry {i} is {x[i].item()!r}")


def check_keys(module, state_dict, strict: bool) -> None:
    """With ``strict``, the keys are exactly the module's (before anything is copied)."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a Mapping of names to tensors, got {type(state_dict).__name__}")
    if not strict:
        return
    own = set(module.state_dict().keys())
    missing = sorted(own - set(state_dict))
    unexpected = sorted(set(state_dict) - own)
    if missing or unexpected:
        raise StateDictError(
            f"state_dict does not fit {type(module).__name__} (strict=True): missing keys {missing[:5]}, "
            f"unexpected keys {unexpected[:5]}"
        )


def load_without_assign(module_class, module, state_dict, prefix, local_metadata, *args):
    """``module_class._load_from_state_dict`` with copies into the existing tensors, even under
    ``load_state_dict(..., assign=True)``: the kernels read these tensors (or buffers they view),
    so a replaced one would be read by nothing."""
    local_metadata = {**local_metadata, "assign_to_params_buffers": False}
    super(module_class, module)._load_from_state_dict(state_dict, prefix, local_metadata, *args)
