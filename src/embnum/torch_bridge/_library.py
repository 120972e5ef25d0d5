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
import functools
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


def build(spec: Bridge) -> Callable:
    """Register ``torch.ops.embnum.<name>`` and return the user-facing function."""
    op = get_op(spec.name)
    params = list(op.signature.parameters.values())
    params.append(inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None))
    signature = op.signature.replace(parameters=params)

    names = list(op.signature.parameters)
    decode = spec.decode if spec.codecs else None

    def impl(*args):
        # ``backend`` is the schema's only default (None): a caller of torch.ops.embnum.<name>
        # may leave it out, and the dispatcher then passes one argument fewer.
        values, backend = args[: len(names)], (args[len(names)] if len(args) > len(names) else None)
        arguments = dict(zip(names, values))
        with on_torch_stream(values):
            arrays, bf16 = _convert_inputs(decode(arguments) if decode else arguments, spec)
            result = op.call(arrays, None, backend)  # every parameter bound by name: no second binding
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
        custom.register_fake(_by_name(spec.fake, [p.name for p in params]))
        if spec.backward is not None:
            _register_autograd(custom.register_autograd, spec, [p.name for p in params])
    else:
        _register_functional(spec, impl, schema, [p.name for p in params])
    torch_op = getattr(torch.ops.embnum, spec.name).default

    user_function = _user_function(op, spec, torch_op, None if op.mutates else impl)
    functools.update_wrapper(user_function, op.declaration)
    del user_function.__wrapped__
    user_function.__signature__ = signature
    user_function.__module__ = "embnum.torch_bridge"
    user_function.torch_op = torch_op
    return user_function


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
_SLOW = object()  # what a direct path returns when the call must go through the dispatcher


def _direct_path(op, spec: Bridge, names: list[str], impl: Callable) -> Callable:
    """``direct(args)``: run a functional op without the dispatcher where :func:`_direct`
    allows it (the same rules, written out per op: only the positions of its tensors and
    tensor lists are looked at), converting each CPU tensor with ``Tensor.numpy`` and calling
    the op's public NumPy function (whose short path then applies); returns ``_SLOW`` where
    the call needs the dispatcher, or a bfloat16 tensor needs the bridge's conversion (the
    full implementation does both). A call that needs a gradient goes to
    :func:`_eager_autograd` (ops with a formula).

    Generated per op (issue 12: the bridge's per-call cost): a plain tensor is first tried
    with ``t.numpy()`` alone, which succeeds only for a CPU tensor of a NumPy dtype (not
    bfloat16) that does not require grad; anything else (an exception) goes through
    :func:`_one`, the full rule (a tensor that requires grad runs here, detached, when grad
    is disabled). A plain ndarray result becomes a tensor with ``torch.from_numpy``."""
    tensors = [i for i, n in enumerate(names) if spec.types[n] in ("Tensor", "Tensor?")]
    lists = [i for i, n in enumerate(names) if spec.types[n] in ("Tensor[]", "Tensor?[]", "Tensor[]?")]
    params = list(op.signature.parameters.values())
    n = len(names)
    lines = [
        "def direct(args):",
        "    if (_is_compiling() or _dispatch_stack_len() or _function_mode_enabled()"
        " or _tracing_state() is not None or _profiler._is_profiler_enabled):",
        "        return _SLOW",
    ]
    for i in range(n):
        if i in tensors:
            lines += [
                f"    a{i} = args[{i}]",
                f"    if a{i} is not None:",
                f"        if type(a{i}) is not _Tensor:",
                "            return _fallback(args)",
                "        try:",
                f"            a{i} = a{i}.numpy()",
                "        except Exception:",
                f"            a{i} = _one(a{i})",
                f"            if a{i} is None:",
                "                return _fallback(args)",
            ]
        elif i in lists:
            lines += [
                f"    a{i} = args[{i}]",
                f"    if a{i} is not None:",
                f"        a{i} = _list(a{i})",
                f"        if a{i} is None:",
                "            return _fallback(args)",
            ]
        else:
            lines.append(f"    a{i} = args[{i}]")
    values = [_decoded(spec, p.name, f"a{i}") for i, p in enumerate(params)]
    call = [v for v, p in zip(values, params) if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    call += [f"{p.name}={v}" for v, p in zip(values, params) if p.kind is inspect.Parameter.KEYWORD_ONLY]
    call.append(f"backend=args[{n}] if len(args) > {n} else None")
    lines.append(f"    result = _public({', '.join(call)})")
    if not spec.bf16_patterns:
        lines += ["    if type(result) is _ndarray and result.flags.writeable:", "        return _from_numpy(result)"]
    lines.append("    return _convert_result(result)")

    def convert_result(result):
        if type(result) is np.ndarray:
            return _convert_output(result, spec, False)
        if result is None:
            return None
        if isinstance(result, tuple):
            return tuple(_convert_output(r, spec, False) for r in result)
        return [_convert_output(r, spec, False) for r in result]

    namespace = {
        "_is_compiling": _is_compiling,
        "_dispatch_stack_len": _dispatch_stack_len,
        "_function_mode_enabled": _function_mode_enabled,
        "_tracing_state": _tracing_state,
        "_profiler": torch.autograd.profiler,
        "_SLOW": _SLOW,
        "_Tensor": torch.Tensor,
        "_ndarray": np.ndarray,
        "_one": _one,
        "_list": _list,
        "_public": op.public,
        "_from_numpy": torch.from_numpy,
        "_convert_result": convert_result,
        "_fallback": None,
        "_decode": {k: c[1] for k, c in spec.codecs.items()},
    }
    exec(compile("\n".join(lines) + "\n", f"<embnum.torch_bridge direct {op.name}>", "exec"), namespace)
    direct = namespace["direct"]

    def no_grad_call(args):
        """The call in the eager autograd forward (grad mode is off there)."""
        result = direct(args)
        return impl(*args) if result is _SLOW else result

    eager = _eager_autograd(spec, names, no_grad_call, tuple(tensors), tuple(lists))

    def fallback(args):
        """A tensor the direct path cannot take: the eager autograd call where grad mode is on
        and the op has one (it returns ``_SLOW`` itself for what it cannot take), else ``_SLOW``."""
        return eager(args) if eager is not None and _grad_enabled() else _SLOW

    namespace["_fallback"] = fallback
    direct.convert_result = convert_result  # the user function's inline path converts results alike
    return direct


def _one(t):
    """``t`` (a tensor on which ``t.numpy()`` failed) as a NumPy array where the direct path
    can take it (a plain CPU tensor, not bfloat16, needing no gradient: detached), else None."""
    if type(t) is not torch.Tensor or not t.is_cpu or t.dtype is torch.bfloat16:
        return None
    if t.requires_grad:
        if _grad_enabled():
            return None
        t = t.detach()
    return t.numpy()


def _list(ts):
    """A list of tensors (None items kept) as NumPy arrays for the direct path, or None."""
    items = []
    for t in ts:
        if t is None:
            items.append(None)
            continue
        if type(t) is not torch.Tensor:
            return None
        try:
            a = t.numpy()
        except Exception:  # noqa: BLE001 - not a plain CPU tensor of a NumPy dtype: the full rule
            a = _one(t)
            if a is None:
                return None
        items.append(a)
    return items


_functorch_stack = torch._C._functorch.peek_interpreter_stack


class _EagerCall:
    """One eager autograd call's layout: ``where[k]`` = (argument position, list index or
    None) of the ``k``-th tensor passed to the Function, ``lengths`` of the list arguments,
    ``out`` the result's shape (set by the forward: None, a list length, or which tuple
    entries are present)."""

    __slots__ = ("where", "lengths", "out")

    def __init__(self, where, lengths):
        self.where, self.lengths, self.out = where, lengths, None


def _eager_autograd(spec: Bridge, names: list[str], impl: Callable, tensors: tuple, lists: tuple):
    """``run(args)``: an eager call that needs a gradient, through one ``torch.autograd.Function``
    per op whose forward is ``impl(args)`` (the direct path, else the implementation the
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


def _direct(args: tuple) -> bool:
    """Whether a call of a functional op may run its implementation without the dispatcher:
    plain CPU tensors only (no subclass: fake, functional, DTensor; no meta), none that needs
    a gradient, and nothing that watches the dispatcher (torch.compile tracing, a dispatch
    or function mode, jit tracing, the profiler). The dispatcher itself would then only
    pass through its autograd wrapper to the same implementation; skipping it saves most
    of the bridge's per-call cost on small inputs."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._get_tracing_state() is not None
        or torch.autograd.profiler._is_profiler_enabled
    ):
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if type(a) is torch.Tensor:
            if not a.is_cpu or (grad and a.requires_grad):
                return False
        elif type(a) is list:
            for t in a:
                if type(t) is torch.Tensor:
                    if not t.is_cpu or (grad and t.requires_grad):
                        return False
                elif isinstance(t, torch.Tensor):
                    return False
        elif isinstance(a, torch.Tensor):
            return False
    return True


def _user_function(op, spec: Bridge, torch_op, impl: Callable | None) -> Callable:
    """``def <name>(<the op's parameters>, *, backend=None)`` calling ``torch_op`` with every
    argument in order: written out (as the registry writes ``embnum.<name>``) so that a call
    costs no ``inspect`` binding. A codec's parameter is encoded; every argument is checked
    against its schema type (:func:`check_types`' rules; a tuple for a list parameter
    becomes a list). With ``impl`` (functional
    ops), a call that :func:`_direct` allows runs ``impl`` itself."""
    params = list(op.signature.parameters.values())
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def declared(p):
        return f"{p.name}=_defaults[{p.name!r}]" if p.name in defaults else p.name

    positional = [declared(p) for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [declared(p) for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def passed(p):
        """The argument as the schema takes it, checked first (``_check_value``: an error
        naming the argument, not torch's parser's); a plain tensor for a ``Tensor``
        parameter needs no check."""
        kind = spec.types[p.name]
        x = f"_encode[{p.name!r}]({p.name})" if p.name in spec.codecs else p.name
        checked = f"_check({p.name!r}, {kind!r}, {x})"
        if kind == "Tensor" and p.name not in spec.codecs:
            return f"{x} if type({x}) is _Tensor else {checked}"
        return checked

    # the types _check_value returns unchanged, tested inline first (~0.3 us a call each)
    unchanged = {"Tensor": "type({v}) is _Tensor", "Tensor?": "{v} is None or type({v}) is _Tensor"}
    unchanged["str"] = "type({v}) is str"

    def checked_into(i, p):
        """``a{i} = <the argument as the schema takes it>``: :func:`passed`'s value, a codec's
        encoding computed once into the local before its type is tested."""
        kind = spec.types[p.name]
        if p.name not in spec.codecs:
            if kind == "Tensor?":
                v = p.name
                return f"    a{i} = {v} if {unchanged[kind].format(v=v)} else _check({p.name!r}, {kind!r}, {v})\n"
            return f"    a{i} = {passed(p)}\n"
        line = f"    a{i} = _encode[{p.name!r}]({p.name})\n"
        test = unchanged.get(kind)
        if test is None:
            return line + f"    a{i} = _check({p.name!r}, {kind!r}, a{i})\n"
        return line + f"    if not ({test.format(v=f'a{i}')}):\n        a{i} = _check({p.name!r}, {kind!r}, a{i})\n"

    head = ", ".join(positional + ["*"] + keyword + ["backend=None"])
    direct_call = _direct_path(op, spec, list(op.signature.parameters), impl) if impl is not None else None
    inline = _inline_direct(op, spec, params) if impl is not None or op.mutates else ""
    if inline:
        # every argument checked into a local, the direct path's common case inline (below)
        src = f"def {op.name}({head}):\n"
        src += "".join(checked_into(i, p) for i, p in enumerate(params))
        src += inline
        src += f"    args = ({''.join(f'a{i}, ' for i in range(len(params)))}backend)\n"
    else:
        body = ", ".join([passed(p) for p in params] + ["backend"])
        src = f"def {op.name}({head}):\n    args = ({body},)\n"
    if impl is not None:
        src += "    result = _direct_call(args)\n    if result is not _SLOW:\n        return result\n"
    src += "    return _torch_op(*args)\n"
    namespace = {
        "_torch_op": torch_op,
        "_impl": impl,
        "_direct": _direct,
        "_direct_call": direct_call,
        "_direct_result": getattr(direct_call, "convert_result", None),
        "_SLOW": _SLOW,
        "_check": _check_value,
        "_Tensor": torch.Tensor,
        "_defaults": defaults,
        "_encode": {k: c[0] for k, c in spec.codecs.items()},
        "_decode": {k: c[1] for k, c in spec.codecs.items()},
        "_bump": torch._C._increment_version,
        "_is_compiling": _is_compiling,
        "_dispatch_stack_len": _dispatch_stack_len,
        "_function_mode_enabled": _function_mode_enabled,
        "_tracing_state": _tracing_state,
        "_profiler": torch.autograd.profiler,
        "_public": op.public,
        "_ndarray": np.ndarray,
        "_from_numpy": torch.from_numpy,
    }
    exec(compile(src, f"<embnum.torch_bridge {op.name}>", "exec"), namespace)
    return namespace[op.name]


def _inline_direct(op, spec: Bridge, params: list) -> str:
    """The user function's inline form of :func:`_direct_path`'s common case (issue 12: the
    bridge's per-call cost is its Python work): nothing watches the dispatcher (the same five
    tests), every ``Tensor`` argument is a plain ``torch.Tensor`` (``Tensor?``: or None) that
    ``t.numpy()`` converts (a CPU tensor of a NumPy dtype needing no gradient), and the op has
    no tensor-list argument. Then the op's public NumPy function is called (a codec's parameter
    decoded: the value the implementation would get) and a writeable ndarray result comes back
    through ``torch.from_numpy``; ops whose results need the bridge's conversion (bfloat16
    patterns, several outputs) return ``_SLOW``'s way: through ``_direct_call``. Anything else
    falls through to the lines after it (``_direct_call``, which applies every rule, then the
    dispatcher): no tuple of arguments, no second frame.

    An in-place op (``op.mutates``; no ``_direct_call``, the rest goes to the dispatcher) takes
    it too when no tensor it writes is an inference tensor (the dispatcher's rules for those
    stay its own): what the custom op's dispatch then adds is only the version-counter bump of
    the written tensors (its ``ADInplaceOrView`` kernel; done here the same way, before the
    call), and no autograd (no tensor needs a gradient: ``t.numpy()`` refuses one that does)."""
    kinds = [spec.types[p.name] for p in params]
    if any(k not in ("Tensor", "Tensor?") and k.startswith("Tensor") for k in kinds) or spec.bf16_patterns:
        return ""
    tensors = [i for i, k in enumerate(kinds) if k in ("Tensor", "Tensor?")]
    if not tensors:
        return ""
    plain = " and ".join(
        f"type(a{i}) is _Tensor" if kinds[i] == "Tensor" else f"(a{i} is None or type(a{i}) is _Tensor)"
        for i in tensors
    )
    written = [i for i, p in enumerate(params) if p.name in op.mutates]
    if any(i not in tensors for i in written):
        return ""
    plain += "".join(
        f" and not a{i}.is_inference()" if kinds[i] == "Tensor" else f" and (a{i} is None or not a{i}.is_inference())"
        for i in written
    )
    watched = (
        "_is_compiling() or _dispatch_stack_len() or _function_mode_enabled()"
        " or _tracing_state() is not None or _profiler._is_profiler_enabled"
    )
    # the watchers first: under torch.compile the rest is not evaluated (Dynamo cannot trace is_inference)
    lines = [f"    if not ({watched}) and {plain}:", "        try:"]
    for i in tensors:
        conv = f"a{i}.numpy()" if kinds[i] == "Tensor" else f"None if a{i} is None else a{i}.numpy()"
        lines.append(f"            n{i} = {conv}")
    lines += [
        "        except Exception:  # not a plain CPU tensor of a NumPy dtype: _direct_call's rules",
        "            pass",
    ]
    values = [f"n{i}" if i in tensors else _decoded(spec, p.name, f"a{i}") for i, p in enumerate(params)]
    call = [v for v, p in zip(values, params) if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    call += [f"{p.name}={v}" for v, p in zip(values, params) if p.kind is inspect.Parameter.KEYWORD_ONLY]
    lines.append("        else:")
    if written:
        bumped = ", ".join(f"a{i}" for i in written if kinds[i] == "Tensor")
        optional = [i for i in written if kinds[i] != "Tensor"]
        tensors_written = f"({bumped},)" + "".join(f" + (() if a{i} is None else (a{i},))" for i in optional)
        lines += [
            f"            _bump({tensors_written})",
            f"            return _public({', '.join(call + ['backend=backend'])})",
        ]
        return "\n".join(lines) + "\n"
    lines += [
        f"            result = _public({', '.join(call + ['backend=backend'])})",
        "            if type(result) is _ndarray and result.flags.writeable:",
        "                return _from_numpy(result)",
        "            return _direct_result(result)",
    ]
    return "\n".join(lines) + "\n"


def same(x):
    """The decode of a codec whose schema value is what the NumPy API takes (no call is
    written for it on the direct paths)."""
    return x


def _decoded(spec: Bridge, name: str, local: str) -> str:
    """The expression a direct path passes to the NumPy function for parameter ``name`` held
    in ``local`` (its schema value): the codec's decode, as the implementation applies it."""
    codec = spec.codecs.get(name)
    if codec is None or codec[1] is same:
        return local
    return f"_decode[{name!r}]({local})"


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


def check_types(spec: Bridge, args: dict) -> dict:
    """Every argument checked against its schema type before torch's schema parser sees it
    (which raises ``RuntimeError`` naming no argument); returns them as the schema takes them."""
    return {name: _check_value(name, spec.types[name], x) for name, x in args.items()}


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
