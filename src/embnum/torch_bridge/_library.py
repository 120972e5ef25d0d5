"""Turn registered embnum ops into torch custom ops, generically.

A family module in this package describes, per op, only what is torch
specific (:func:`bridge`): the torch type of each parameter, the fake
(meta) implementation, the autograd formula and how bfloat16 is carried.
From that and the op's declaration this module builds

* ``torch.ops.embnum.<name>``: a custom op (``torch.library.custom_op``)
  whose implementation views every tensor as a NumPy or CuPy array through
  DLPack (no copy), calls ``embnum.<name>`` and views the result back;
* ``embnum.torch_bridge.<name>``: the Python function users call, with the
  op's own signature plus ``backend=``.

bfloat16 (NumPy and CuPy have none) crosses the bridge by one rule, the same for
every op that takes it (``bridge(..., bf16=True)``): each bfloat16 tensor argument is
widened exactly to float32 (every bfloat16 is a float32), the op runs on float32,
and each float32 result is rounded once back to bfloat16 (to nearest even, as
torch rounds; a NaN keeps its top 16 bits). Data that an op only moves comes back
bit for bit (a widened value needs no rounding; NaN payloads kept), sums are
accumulated in float32 or wider and rounded once, and a scalar such as a padding
value is rounded along with the result. A call that also passes float32 tensors
is a ``TypeError`` (its float32 results could not be told apart). The one place the
spec defines bfloat16 otherwise: quant's ``float_to_bfloat16`` / ``bfloat16_to_float``
are codecs of bfloat16 bit patterns, carried by NumPy as uint16 (quant.md, section 3),
so there (``bf16_patterns=True``) a bfloat16 tensor is its pattern: a uint16 view in,
a bfloat16 view of the uint16 result out (no conversion; widening and rounding back
would give the same bits).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
from collections.abc import Callable

import numpy as np
import torch

from .._registry import get as get_op


def to_array(t: torch.Tensor):
    """A NumPy (CPU) or CuPy (CUDA) view of ``t``: shared memory, no copy.

    CPU tensors through ``Tensor.numpy`` (about a third of ``np.from_dlpack``'s cost,
    the same view: strides and storage offset kept)."""
    if t.is_cpu:
        return (t.detach() if t.requires_grad else t).numpy()
    t = t.detach()
    if t.device.type == "cuda":
        import cupy

        return cupy.from_dlpack(t)
    raise TypeError(f"embnum.torch_bridge takes CPU or CUDA tensors, got one on {t.device}")


_NO_STREAM = contextlib.nullcontext()


def _first_cuda(values):
    """The first CUDA tensor among ``values`` (lists included), or None (a plain loop: this
    runs on every call, CPU ones included)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.is_cuda:
                return v
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    return t
    return None


def on_torch_stream(values):
    """A context in which CuPy's current stream is torch's current stream of the first CUDA
    tensor's device (a null context without one). Every embnum launch and CuPy call of the op
    then runs on that stream, in order with the caller's torch work before and after it (an
    in-place op's writes included), and the DLPack exchanges need no cross-stream wait."""
    first = _first_cuda(values)
    if first is None:
        return _NO_STREAM
    import cupy

    device = first.device.index if first.device.index is not None else torch.cuda.current_device()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device))
    stack.enter_context(cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream, device))
    return stack


def to_tensor(a) -> torch.Tensor:
    """A torch view of a NumPy/CuPy array: shared memory, no copy (a writeable NumPy
    array through ``torch.from_numpy``, about half of ``torch.from_dlpack``'s cost)."""
    if type(a) is np.ndarray and a.flags.writeable:
        return torch.from_numpy(a)
    return torch.from_dlpack(a)


def round_to_bfloat16(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor rounded once to bfloat16: to nearest even (torch's rounding); a NaN
    keeps its top 16 bits (torch's own conversion would replace its payload), so that a
    bfloat16 widened to float32 comes back bit for bit."""
    top = (t.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    return torch.where(t.isnan(), top, t.to(torch.bfloat16))


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


def _schema(op, types: dict[str, str], returns: str) -> str:
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


def _has_bf16(args: dict) -> bool:
    for a in args.values():
        if isinstance(a, torch.Tensor):
            if a.dtype == torch.bfloat16:
                return True
        elif isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16:
                    return True
    return False


def _convert_inputs(args: dict, spec: Bridge):
    """Tensors (and lists of tensors) to arrays, bfloat16 by the module's rule.
    Returns the converted args and whether bfloat16 was widened (its float32 results
    are then rounded back)."""
    if not _has_bf16(args):  # the common case: views only
        out = {}
        for k, a in args.items():
            if isinstance(a, torch.Tensor):
                out[k] = to_array(a)
            elif isinstance(a, (list, tuple)):
                out[k] = [to_array(t) if isinstance(t, torch.Tensor) else t for t in a]
            else:
                out[k] = a
        return out, False
    if spec.bf16_patterns:
        return {k: to_array(a.view(torch.uint16)) if _is_bf16(a) else _arrays(a) for k, a in args.items()}, False
    if not spec.bf16:
        raise TypeError(f"{spec.name} does not take bfloat16 tensors")
    for k, a in args.items():
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                raise TypeError(
                    f"{spec.name}: {k} is float32 beside bfloat16 tensors; bfloat16 crosses the bridge widened to"
                    " float32, so a call takes one or the other (convert one side)"
                )

    def one(t):
        return to_array(t.float()) if _is_bf16(t) else to_array(t) if isinstance(t, torch.Tensor) else t

    return {k: [one(t) for t in a] if isinstance(a, (list, tuple)) else one(a) for k, a in args.items()}, True


def _is_bf16(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16


def _arrays(a):
    if isinstance(a, torch.Tensor):
        return to_array(a)
    if isinstance(a, (list, tuple)):
        return [to_array(t) if isinstance(t, torch.Tensor) else t for t in a]
    return a


def _convert_output(a, spec: Bridge, bf16: bool) -> torch.Tensor | None:
    """An implementation's result as a tensor; ``bf16``: the call's bfloat16 was widened, so a
    float32 result is rounded back (:func:`round_to_bfloat16`)."""
    if a is None:
        return None  # an optional output that was not requested
    if isinstance(a, list):
        return a  # a Python list of ints returned beside arrays (schema type int[])
    t = to_tensor(a)
    if spec.bf16_patterns and t.dtype == torch.uint16:
        return t.view(torch.bfloat16)
    if bf16 and t.dtype == torch.float32:
        return round_to_bfloat16(t)
    return t


def build(spec: Bridge) -> BridgedOp:
    """Register ``torch.ops.embnum.<name>`` and return the user-facing function."""
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
            arrays, bf16 = _convert_inputs(decode(arguments) if decode else arguments, spec)
            result = op.call(arrays, None, backend)
            if result is None:  # an in-place op (it wrote its ``mutates`` arguments)
                return None
            if isinstance(result, tuple):
                return tuple(_convert_output(r, spec, bf16) for r in result)
            if isinstance(result, list):
                return [_convert_output(r, spec, bf16) for r in result]
            return _convert_output(result, spec, bf16)

    schema = _schema(op, spec.types, spec.returns)
    if op.mutates:
        # an in-place op: custom_op also bumps the version counters of the tensors it writes
        custom = torch.library.custom_op(f"embnum::{spec.name}", impl, mutates_args=op.mutates, schema=schema)
        custom.register_fake(_by_name(spec.fake, every))
        if spec.backward is not None:
            _register_autograd(custom.register_autograd, spec, every)
    else:
        _register_functional(spec, impl, schema, every)
    return BridgedOp(op, spec, getattr(torch.ops.embnum, spec.name).default, impl)


def _watched() -> bool:
    """Whether something watches the dispatcher: torch.compile tracing, a dispatch or
    function mode, jit tracing, the profiler (a call must then go through ``torch.ops``)."""
    return bool(
        _is_compiling()
        or _dispatch_stack_len()
        or _function_mode_enabled()
        or _tracing_state() is not None
        or torch.autograd.profiler._is_profiler_enabled
    )


_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_tracing_state = torch._C._get_tracing_state
_grad_enabled = torch.is_grad_enabled
_bump_versions = torch._C._increment_version
_SLOW = object()  # what the eager autograd call returns when the call must go through the dispatcher
_TENSOR_KINDS = ("Tensor", "Tensor?")
_LIST_KINDS = ("Tensor[]", "Tensor?[]", "Tensor[]?")


class BridgedOp:
    """``embnum.torch_bridge.<name>(<the op's parameters>, *, backend=None)``: the op on tensors.

    A call (:meth:`__call__`) binds the arguments in the op's order, encodes each codec's
    parameter and checks every argument against its schema type (:func:`_check_value`: an error
    naming the argument), then runs the first of:

    1. the NumPy op (``embnum.<name>``) on views of the tensors (``Tensor.numpy``: no copy),
       where nothing watches the dispatcher (:func:`_watched`) and every tensor is a plain CPU
       tensor of a NumPy dtype that needs no gradient (:meth:`_host_arrays`); what the
       dispatcher would run itself, without its per-call cost (an in-place op bumps the version
       counters of the tensors it writes first, as the dispatcher does);
    2. the eager autograd Function (:func:`_eager_autograd`) where a plain CPU tensor needs a
       gradient and the op has a formula;
    3. the registered custom op ``torch.ops.embnum.<name>`` (``torch_op``): torch.compile,
       other devices, tensor subclasses, bfloat16 and everything else.
    """

    def __init__(self, op, spec: Bridge, torch_op, impl: Callable):
        self.op, self.spec, self.torch_op, self._impl = op, spec, torch_op, impl
        self._names = tuple(op.signature.parameters)
        self._kinds = tuple(spec.types[n] for n in self._names)
        self._encode = tuple(spec.codecs[n][0] if n in spec.codecs else None for n in self._names)
        self._decode = tuple(
            (i, spec.codecs[n][1])
            for i, n in enumerate(self._names)
            if n in spec.codecs and spec.codecs[n][1] is not same
        )
        self._tensors = tuple(i for i, k in enumerate(self._kinds) if k in _TENSOR_KINDS)
        self._lists = tuple(i for i, k in enumerate(self._kinds) if k in _LIST_KINDS)
        self._written = tuple(i for i, n in enumerate(self._names) if n in op.mutates)
        # the NumPy op takes the values positionally up to its keyword-only parameters
        self._positional = op._positional
        self._keyword = self._names[op._positional :]
        # an in-place op whose written arguments are not all tensors always takes the dispatcher
        self._host = all(i in self._tensors for i in self._written)
        self._eager = None if op.mutates else _eager_autograd(spec, list(self._names), self._no_grad_call)
        # what help(), inspect and the docs read from a function
        self.__name__ = self.__qualname__ = op.name
        self.__doc__ = op.declaration.__doc__
        self.__module__ = "embnum.torch_bridge"
        backend = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None)
        self.__signature__ = op.signature.replace(parameters=[*op.signature.parameters.values(), backend])

    def __call__(self, *args, backend=None, **kwargs):
        values = self._schema_values(args, kwargs)
        if not _watched():
            arrays = self._host_arrays(values) if self._host else None
            if arrays is not None:
                if self._written:
                    _bump_versions(tuple(values[i] for i in self._written if values[i] is not None))
                return self._run_host(arrays, backend)
            if self._eager is not None and _grad_enabled():
                result = self._eager((*values, backend))
                if result is not _SLOW:
                    return result
        return self.torch_op(*values, backend)

    def _schema_values(self, args: tuple, kwargs: dict) -> list:
        """The arguments in the op's order as the schema takes them: a codec's parameter
        encoded, every value checked (:func:`_check_value`; a plain tensor for a ``Tensor``
        parameter needs no check)."""
        if kwargs or len(args) != len(self._names):
            arguments = self.op.bind(args, kwargs)
            args = [arguments[n] for n in self._names]
        values = []
        for name, kind, encode, x in zip(self._names, self._kinds, self._encode, args):
            if encode is not None:
                x = encode(x)
            if type(x) is not torch.Tensor or kind not in _TENSOR_KINDS:
                if x is not None or kind != "Tensor?":
                    x = _check_value(name, kind, x)
            values.append(x)
        return values

    def _host_arrays(self, values: list) -> list | None:
        """``values`` with each tensor (and each tensor of a list) as a NumPy view, a codec's
        parameter decoded (as the implementation would decode it); None where a tensor is not a
        plain CPU tensor of a NumPy dtype, needs a gradient, or is an inference tensor the op
        writes (the dispatcher's rules for those stay its own)."""
        arrays = values.copy()
        for i in self._tensors:
            t = values[i]
            if t is not None:
                try:
                    arrays[i] = t.numpy() if type(t) is torch.Tensor else None
                except Exception:  # noqa: BLE001 - not a plain CPU tensor of a NumPy dtype: the full rule
                    arrays[i] = _host_view(t)
                if arrays[i] is None:
                    return None
        for i in self._lists:
            if values[i] is not None:
                arrays[i] = [None if t is None else _host_view(t) for t in values[i]]
                if any(a is None and t is not None for a, t in zip(arrays[i], values[i])):
                    return None
        for i in self._written:
            if values[i] is not None and values[i].is_inference():
                return None
        for i, decode in self._decode:
            arrays[i] = decode(arrays[i])
        return arrays

    def _run_host(self, arrays: list, backend):
        """The NumPy op on :meth:`_host_arrays`' values; its arrays as tensors (no copy)."""
        if self._keyword:
            k = self._positional
            result = self.op(*arrays[:k], **dict(zip(self._keyword, arrays[k:])), backend=backend)
        else:
            result = self.op(*arrays, backend=backend)
        if type(result) is np.ndarray and result.flags.writeable and not self.spec.bf16_patterns:
            return torch.from_numpy(result)
        if result is None:
            return None
        if type(result) is np.ndarray:
            return _convert_output(result, self.spec, False)
        if isinstance(result, tuple):
            return tuple(_convert_output(r, self.spec, False) for r in result)
        return [_convert_output(r, self.spec, False) for r in result]

    def _no_grad_call(self, args: tuple):
        """The call in the eager autograd forward (grad mode is off there): the host path, or
        the dispatcher's implementation (which converts what the host path cannot take)."""
        arrays = self._host_arrays(list(args[:-1]))
        return self._impl(*args) if arrays is None else self._run_host(arrays, args[-1])

    def __repr__(self) -> str:
        return f"<embnum.torch_bridge op {self.op.family}.{self.op.name}>"


def _host_view(t):
    """A NumPy view of ``t`` where the host path can take it (a plain CPU tensor, not bfloat16,
    needing no gradient, or needing one while grad mode is off: detached), else None."""
    if type(t) is not torch.Tensor or not t.is_cpu or t.dtype is torch.bfloat16:
        return None
    if t.requires_grad:
        if _grad_enabled():
            return None
        t = t.detach()
    try:
        return t.numpy()
    except Exception:  # noqa: BLE001 - a dtype NumPy has not (complex32, ...): the dispatcher's conversion
        return None


_functorch_stack = torch._C._functorch.peek_interpreter_stack


class _EagerCall:
    """One eager autograd call's layout: ``where[k]`` = (argument position, list index or
    None) of the ``k``-th tensor passed to the Function, ``lengths`` of the list arguments,
    ``out`` the result's shape (set by the forward: None, a list length, or which tuple
    entries are present)."""

    __slots__ = ("where", "lengths", "out")

    def __init__(self, where, lengths):
        self.where, self.lengths, self.out = where, lengths, None


def _eager_autograd(spec: Bridge, names: list[str], impl: Callable):
    """``run(args)``: an eager call that needs a gradient, through one ``torch.autograd.Function``
    per op whose forward is ``impl(args)`` (the host path, else the implementation the
    dispatcher runs; grad mode is off inside a Function's forward) and whose
    ``setup``/``backward`` are the family's formula, called with the same arguments and
    gradient structure as the registered autograd (:func:`_register_autograd`). What the
    registered path adds per call (the dispatcher's autograd kernel, ``torch.library``'s
    pytree flattening of every list and the default refill) is about 0.2 ms of the
    ~0.35 ms an autograd call of a list op costs on a tiny input; here the tensor positions
    are known per op. Returns ``_SLOW`` (the dispatcher then runs it) for anything but plain
    CPU tensors (a subclass, another device, a functorch transform), and where nothing needs
    a gradient. None for ops without a formula or with non-tensor results."""
    if spec.backward is None or spec.setup is None or "int" in spec.returns:
        return None
    setup, formula, plain = spec.setup, spec.backward, torch.Tensor
    every = (*names, "backend")
    tensors = [i for i, n in enumerate(names) if spec.types[n] in _TENSOR_KINDS]
    lists = [i for i, n in enumerate(names) if spec.types[n] in _LIST_KINDS]

    def forward(ctx, args, call, *flat):
        result = impl(args)
        setup(ctx, dict(zip(every, args)), result)
        ctx.embnum_where, ctx.embnum_lengths = call.where, call.lengths
        if type(result) is list:
            ctx.embnum_out = call.out = len(result)
            return tuple(result)
        if type(result) is tuple:
            ctx.embnum_out = call.out = tuple(r is not None for r in result)
            return tuple(r for r in result if r is not None)
        ctx.embnum_out = call.out = None
        return result

    def backward(ctx, *grads):
        shape, where = ctx.embnum_out, ctx.embnum_where
        if type(shape) is int:  # a Tensor[] result: the gradients as one list
            grads = (list(grads),)
        elif shape is not None:  # a tuple with optional results: None where one was not returned
            it = iter(grads)
            grads = tuple(next(it) if present else None for present in shape)
        flat_needs = ctx.needs_input_grad
        needs = [False] * len(every)
        for (i, j), need in zip(where, flat_needs[2:]):
            if j is None:
                needs[i] = need
            else:
                if needs[i] is False:
                    needs[i] = [False] * ctx.embnum_lengths[i]
                needs[i][j] = need
        ctx.needs_input_grad = tuple(needs)
        try:
            by_name = formula(ctx, *grads)
        finally:
            ctx.needs_input_grad = flat_needs
        out = []
        for i, j in where:
            g = by_name.get(every[i])
            out.append(g if j is None or g is None else g[j])
        return (None, None, *out)

    # grad_fn: Eager_<name>Backward (a profile names the op)
    eager = type(
        f"Eager_{spec.name}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    apply = eager.apply

    def run(args):
        if _functorch_stack() is not None:
            return _SLOW
        lengths = {i: len(args[i]) for i in lists if args[i] is not None}
        found = [(i, None, args[i]) for i in tensors]
        found += [(i, j, t) for i in lengths for j, t in enumerate(args[i])]
        flat, where, needed = [], [], False
        for i, j, t in found:
            if t is not None:
                if type(t) is not plain or not t.is_cpu:
                    return _SLOW
                flat.append(t)
                where.append((i, j))
                needed = needed or t.requires_grad
        if not needed:
            return _SLOW
        call = _EagerCall(where, lengths)
        out = apply(args, call, *flat)
        shape = call.out
        if type(shape) is int:
            return list(out)
        if shape is not None:
            it = iter(out)
            return tuple(next(it) if present else None for present in shape)
        return out

    return run


def same(x):
    """The decode of a codec whose schema value is what the NumPy API takes (no call is
    written for it on the direct paths)."""
    return x


_INT64 = (-(2**63), 2**63 - 1)


def _is_int(x) -> bool:
    return (isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))) or isinstance(x, torch.SymInt)


def _exact_float(i: int) -> bool:
    try:
        return int(float(i)) == i
    except OverflowError:
        return False


def _check_value(name: str, kind: str, x):
    """``x`` as the schema type ``kind`` takes it (NumPy scalars as Python ones);
    ``TypeError``/``ValueError`` naming ``name`` when it does not fit.

    A list of plain items (Python ints in the int64 range, ``str``, ``torch.Tensor``; lists of
    those) is recognised by :data:`_PLAIN_LISTS` in one pass (issue 12: a keyed_tensor call
    passes nested key lists); anything else takes :func:`_check_exact`, which gives the same
    result for those and raises the errors."""
    plain = _PLAIN_LISTS.get(kind)
    if plain is not None:
        got = plain(x)
        if got is not None:
            return got
    return _check_exact(name, kind, x)


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
_PLAIN_LISTS = {
    "int[]": _plain_ints,
    "SymInt[]": _plain_ints,
    "int[][]": _plain_lists(_plain_ints),
    "str[]": _plain_strs,
    "str[][]": _plain_lists(_plain_strs),
    "Tensor[]": _plain_items(lambda v: type(v) is torch.Tensor),
}


def _check_exact(name: str, kind: str, x):
    """:func:`_check_value`'s rules, every case."""
    if kind.endswith("?"):
        if x is None:
            return None
        kind = kind[:-1]
    if kind.endswith("[]"):
        if not isinstance(x, (list, tuple)):
            raise TypeError(f"{name} must be a list, got {type(x).__name__}")
        return [_check_exact(f"{name}[{i}]", kind[:-2], item) for i, item in enumerate(x)]
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


_LIB = None


def _register_functional(spec: Bridge, impl: Callable, schema: str, names: list[str]) -> None:
    """A functional op through a ``torch.library.Library``: the schema, ``impl`` as the kernel
    of every device, the fake implementation and the autograd formula. What ``custom_op`` does
    minus its per-call wrappers (its own dispatch-level Python wrapper, a torch.compile
    guard and an aliasing check around every call), which cost about three times the
    bare dispatch on a tiny input. An op without a formula gets one that raises, as
    ``custom_op`` does, so that backpropagating through it is an error, not a warning."""
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("embnum", "FRAGMENT")
    _LIB.define(f"{spec.name}{schema}")
    qualname = f"embnum::{spec.name}"
    # one kernel for every device, and for calls without a tensor (as custom_op registers it)
    _LIB.impl(spec.name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, _by_name(spec.fake, names), lib=_LIB)

    def register(backward, setup_context):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=_LIB)

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
