"""Turn registered embnum ops into torch custom ops, generically.

A family module in this package describes, per op, only what is torch
specific (:func:`bridge`, in ``_spec``): the torch type of each parameter, the fake
(meta) implementation, the autograd formula and how bfloat16 is carried.
From that and the op's declaration this module builds

* ``torch.ops.embnum.<name>``: a custom op whose implementation views every tensor as a
  NumPy or CuPy array (``_convert``: no copy; bfloat16 by its one rule), calls
  ``embnum.<name>`` and views the result back;
* ``embnum.torch_bridge.<name>``: the object users call (``_call.BridgedOp``), with the
  op's own signature plus ``backend=``.

The family modules import :func:`bridge` and :func:`same` from here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .._registry import get as get_op
from ._call import BridgedOp
from ._convert import convert_inputs, convert_output, on_torch_stream, round_to_bfloat16, to_array, to_tensor
from ._spec import BRIDGES, Bridge, bridge, same, schema_of

__all__ = [
    "BRIDGES",
    "BUILT",
    "Bridge",
    "bridge",
    "build",
    "round_to_bfloat16",
    "same",
    "to_array",
    "to_tensor",
    "user_function",
]

BUILT: dict[str, BridgedOp] = {}  # name -> ``embnum.torch_bridge.<name>``, filled by :func:`build`


def user_function(name: str) -> BridgedOp:
    """``embnum.torch_bridge.<name>``, for a family module's backward that calls another op: a plain
    CPU call (grad mode off) skips the dispatcher; anything it watches (torch.compile, modes) still
    goes through ``torch.ops``."""
    return BUILT[name]


def build(spec: Bridge) -> BridgedOp:
    """Register ``torch.ops.embnum.<name>`` and return the user-facing function (also kept in :data:`BUILT`)."""
    op = get_op(spec.name)
    names = list(op.signature.parameters)
    every = [*names, "backend"]
    decode = spec.decode if spec.codecs else None

    def impl(*args):
        # ``backend`` is the schema's only default (None): a caller of torch.ops.embnum.<name>
        # may leave it out, and the dispatcher then passes one argument fewer.
        values, backend = args[: len(names)], (args[len(names)] if len(args) > len(names) else None)
        arguments = dict(zip(names, values))
        with on_torch_stream(values):
            arrays, bf16 = convert_inputs(decode(arguments) if decode else arguments, spec)
            result = op.call(arrays, None, backend)
            if result is None:  # an in-place op (it wrote its ``mutates`` arguments)
                return None
            if isinstance(result, tuple):
                return tuple(convert_output(r, spec, bf16) for r in result)
            if isinstance(result, list):
                return [convert_output(r, spec, bf16) for r in result]
            return convert_output(result, spec, bf16)

    schema = schema_of(op, spec.types, spec.returns)
    if op.mutates:
        # an in-place op: custom_op also bumps the version counters of the tensors it writes
        custom = torch.library.custom_op(f"embnum::{spec.name}", impl, mutates_args=op.mutates, schema=schema)
        custom.register_fake(_by_name(spec.fake, every))
        if spec.backward is not None:
            _register_autograd(custom.register_autograd, spec, every)
    else:
        _register_functional(spec, impl, schema, every)
    built = BUILT[spec.name] = BridgedOp(op, spec, getattr(torch.ops.embnum, spec.name).default, impl)
    return built


@functools.cache
def _library() -> torch.library.Library:
    """The ``embnum`` namespace's fragment that holds the functional ops."""
    return torch.library.Library("embnum", "FRAGMENT")


def _register_functional(spec: Bridge, impl: Callable, schema: str, names: list[str]) -> None:
    """A functional op through a ``torch.library.Library``: the schema, ``impl`` as the kernel
    of every device, the fake implementation and the autograd formula. What ``custom_op`` does
    minus its per-call wrappers (its own dispatch-level Python wrapper, a torch.compile
    guard and an aliasing check around every call), which cost about three times the
    bare dispatch on a tiny input. An op without a formula gets one that raises, as
    ``custom_op`` does, so that backpropagating through it is an error, not a warning."""
    lib = _library()
    lib.define(f"{spec.name}{schema}")
    qualname = f"embnum::{spec.name}"
    # one kernel for every device, and for calls without a tensor (as custom_op registers it)
    lib.impl(spec.name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, _by_name(spec.fake, names), lib=lib)

    def register(backward, setup_context):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)

    if spec.backward is not None:
        _register_autograd(register, spec, names)
    else:

        def no_formula(ctx, *grads):
            raise RuntimeError(f"Trying to backward through embnum::{spec.name}, which has no autograd formula")

        register(no_formula, None)


def _by_name(fake: Callable, names: list[str]) -> Callable:
    """``fake`` called with every argument by name: a family's fake declares only the
    parameters it reads, then ``**_`` (it does not restate the op's signature)."""

    def by_name(*args, **kwargs):
        return fake(**dict(zip(names, args)), **kwargs)

    return by_name


def _register_autograd(register: Callable, spec: Bridge, names: list[str]) -> None:
    """Adapt the family's ``setup(ctx, args, output)`` / ``backward(ctx, *grads) -> {name: grad}``
    to torch's positional, structure-matching convention."""

    def setup_context(ctx, inputs, output):
        # ``inputs`` has every schema argument (torch fills defaults back in), but the
        # dispatcher dropped a trailing ``backend`` equal to its default (None): the
        # gradient tuple must match the arguments actually passed.
        passed = inputs if inputs[-1] is not None else inputs[:-1]
        ctx.embnum_structure = [
            len(x) if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor) else None for x in passed
        ]
        spec.setup(ctx, dict(zip(names, inputs)), output)

    def backward(ctx, *grads):
        by_name = spec.backward(ctx, *grads)
        return tuple(
            by_name.get(name, None if n is None else [None] * n) for name, n in zip(names, ctx.embnum_structure)
        )

    register(backward, setup_context=setup_context)
