"""What a family module says about each op's torch side (:func:`bridge`), and the custom op's
schema built from it and the op's declaration."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .._registry import get as get_op


@dataclasses.dataclass
class Bridge:
    name: str
    types: dict[str, str]
    returns: str
    fake: Callable
    setup: Callable | None
    backward: Callable | None
    bf16: bool
    bf16_patterns: bool
    codecs: dict[str, tuple[Callable, Callable]] = dataclasses.field(default_factory=dict)
    grad_dtype: torch.dtype = torch.float64  # float dtype of differentiable inputs in the generic tests

    def encode(self, args: dict) -> dict:
        """Python values the schema cannot carry (e.g. a frozen dataclass) -> schema values
        (idempotent: an already encoded value passes unchanged)."""
        return {k: self.codecs[k][0](a) if k in self.codecs else a for k, a in args.items()}

    def decode(self, args: dict) -> dict:
        return {k: self.codecs[k][1](a) if k in self.codecs else a for k, a in args.items()}


def schema_of(op, types: dict[str, str], returns: str) -> str:
    """The custom op's schema. Only the trailing ``backend`` has a default (None), so
    ``torch.ops.embnum.<name>(...)`` runs without it; the op's own parameters declare
    none: the dispatcher drops trailing arguments equal to their defaults, which would
    change the input structure autograd sees (the Python wrapper passes every argument)."""
    params = [
        f"{_annotate(types[name], op.mutates.index(name)) if name in op.mutates else types[name]} {name}"
        for name in op.signature.parameters
    ]
    params.append("str? backend=None")
    return f"({', '.join(params)}) -> {returns}"


def _annotate(torch_type: str, k: int) -> str:
    """``Tensor`` -> ``Tensor(a!)`` (``Tensor?`` -> ``Tensor(a!)?``): an argument the op writes."""
    alias = f"Tensor({'abcdefgh'[k]}!)"
    return torch_type.replace("Tensor", alias, 1)


def same(x):
    """The decode of a codec whose schema value is what the NumPy API takes (the host path
    skips it)."""
    return x


BRIDGES: dict[str, Bridge] = {}


def bridge(
    name: str,
    *,
    types: dict[str, str] | None = None,
    returns: str = "Tensor",
    fake: Callable,
    setup: Callable | None = None,
    backward: Callable | None = None,
    bf16: bool = False,
    bf16_patterns: bool = False,
    codecs: dict[str, tuple[Callable, Callable]] | None = None,
    grad_dtype: torch.dtype = torch.float64,
) -> None:
    """Describe the torch side of op ``name`` (see the module docstring).

    ``types``: torch schema type per parameter that is not a plain ``"Tensor"``
    (``"Tensor?"``, ``"Tensor[]"``, ``"SymInt"``, ``"SymInt[]"``, ``"float"``, ...); a
    parameter of the declaration not named is a ``"Tensor"``. ``fake(**args)``: outputs with
    the right shapes on the meta device, every argument (``backend`` included) passed by
    name (declare the ones read, then ``**_``). ``setup(ctx, inputs,
    output)`` / ``backward(ctx, grad)``: as ``torch.library.register_autograd``.
    ``bf16``: the op takes bfloat16 tensors, by the module's one rule (else they are a
    ``TypeError``); ``bf16_patterns``: instead, its uint16 arrays are bfloat16 bit patterns
    (quant's two bfloat16 codecs only; see the module docstring).
    ``codecs``: ``{parameter: (encode, decode)}`` for Python values the schema
    cannot carry (the user function encodes, the implementation decodes).
    ``grad_dtype``: the float dtype the generic tests (gradcheck, opcheck) give
    differentiable inputs; float64 unless the op does not take it.
    """
    params = get_op(name).signature.parameters
    types = types or {}
    unknown = set(types) - set(params)
    if unknown:
        raise ValueError(f"bridge {name!r}: types names parameters the declaration does not have: {sorted(unknown)}")
    types = {p: types.get(p, "Tensor") for p in params}
    BRIDGES[name] = Bridge(name, types, returns, fake, setup, backward, bf16, bf16_patterns, codecs or {}, grad_dtype)
