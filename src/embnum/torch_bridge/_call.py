"""The user-facing function of a bridged op (:class:`BridgedOp`): one path from the call to
the NumPy op, the eager autograd ``Function`` or the registered custom op."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch

from ._convert import convert_output
from ._spec import Bridge, same
from ._values import check_value, unchanged_test


def _watched() -> bool:
    """Whether something watches the dispatcher: torch.compile tracing, a dispatch or
    function mode, jit tracing, the profiler (a call must then go through ``torch.ops``).

    Dynamo's check comes first: Dynamo reads ``torch.compiler.is_dynamo_compiling()`` as True
    and traces none of the rest. It is one frame where ``is_compiling()`` is two (it also asks
    ``torch.jit.is_scripting``); what ``is_compiling()`` adds, non-strict export and AOT
    tracing, runs under a dispatch mode (fake tensors), which the next test sees. Reading the
    flag ``torch.compiler._is_compiling_flag`` directly would make Dynamo guard on its value.
    Each test is a bool already (no ``bool()`` around them: a builtin call per bridge call)."""
    return (
        _is_compiling()
        or _dispatch_stack_len() > 0
        or _function_mode_enabled()
        or _tracing_state() is not None
        or _profiler._is_profiler_enabled
    )


_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_tracing_state = torch._C._get_tracing_state
_profiler = torch.autograd.profiler
_grad_enabled = torch.is_grad_enabled
_bump_versions = torch._C._increment_version
_Tensor = torch.Tensor
_from_numpy = torch.from_numpy
_ndarray = np.ndarray
_SLOW = object()  # what the eager autograd call returns when the call must go through the dispatcher
_TENSOR_KINDS = ("Tensor", "Tensor?")
_LIST_KINDS = ("Tensor[]", "Tensor?[]", "Tensor[]?")


class BridgedOp:
    """``embnum.torch_bridge.<name>(<the op's parameters>, *, backend=None)``: the op on tensors.

    A call (:meth:`__call__`) binds the arguments in the op's order, encodes each codec's
    parameter and checks every argument against its schema type (:func:`check_value`: an error
    naming the argument), then runs the first of:

    1. the NumPy op (``embnum.<name>``) on views of the tensors (``Tensor.numpy``: no copy),
       where nothing watches the dispatcher (:func:`_watched`) and every tensor is a plain CPU
       tensor of a NumPy dtype that needs no gradient (:meth:`_checked`); what the
       dispatcher would run itself, without its per-call cost (an in-place op bumps the version
       counters of the tensors it writes first, as the dispatcher does);
    2. the eager autograd Function (:func:`_eager_autograd`) where a plain CPU tensor needs a
       gradient and the op has a formula;
    3. the registered custom op ``torch.ops.embnum.<name>`` (``torch_op``): torch.compile,
       other devices, tensor subclasses, bfloat16 and everything else.
    """

    def __init__(self, op, spec: Bridge, torch_op, impl: Callable):
        self.op, self.spec, self.torch_op, self._impl = op, spec, torch_op, impl
        self._numpy = op.__call__  # the NumPy op, bound once (calling the object looks its __call__ up each time)
        self._names = names = tuple(op.signature.parameters)
        kinds = [spec.types[n] for n in names]
        encode = [spec.codecs[n][0] if n in spec.codecs else None for n in names]
        # per parameter: (name, schema type, encode or None, whether a plain tensor needs no check,
        # None or a test of the values the check returns as they are: a Python scalar of the type, None where optional)
        unchanged = [None if k in _TENSOR_KINDS else unchanged_test(k) for k in kinds]
        self._params = tuple(zip(names, kinds, encode, [k in _TENSOR_KINDS for k in kinds], unchanged))
        self._decode = tuple(
            (i, spec.codecs[n][1]) for i, n in enumerate(names) if n in spec.codecs and spec.codecs[n][1] is not same
        )
        self._count = len(names)
        self._tensors = tuple(i for i, k in enumerate(kinds) if k in _TENSOR_KINDS)
        self._lists = tuple(i for i, k in enumerate(kinds) if k in _LIST_KINDS)
        self._written = tuple(i for i, n in enumerate(names) if n in op.mutates)
        # the host path's views need a second look (lists, written tensors, codecs to decode)
        self._more = bool(self._lists or self._written or self._decode)
        # every parameter a ``Tensor`` (no codec, none written): :meth:`__call__` views them in one short loop
        self._all_tensors = all(k == "Tensor" for k in kinds) and not spec.codecs and not self._more
        # the NumPy op takes the values positionally up to its keyword-only parameters
        self._positional = op._positional
        self._keyword = names[op._positional :]
        # a NumPy result becomes a tensor as it is (quant's bfloat16 patterns are converted)
        self._as_is = not spec.bf16_patterns
        # ... and needs no look at its flags where it is the one array the NumPy op allocated
        # (returns="array": its ``empty`` output, always writeable); torch.from_numpy warns on a
        # read-only array, which an op that computes its own result may return (a view)
        self._fresh = self._as_is and op.returns == "array"
        # an in-place op whose written arguments are not all tensors always takes the dispatcher
        self._host = all(i in self._tensors for i in self._written)
        self._eager = None if op.mutates else _eager_autograd(spec, list(names), self._no_grad_call)
        # what help(), inspect and the docs read from a function
        self.__name__ = self.__qualname__ = op.name
        self.__doc__ = op.declaration.__doc__
        self.__module__ = "embnum.torch_bridge"
        backend = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None)
        self.__signature__ = op.signature.replace(parameters=[*op.signature.parameters.values(), backend])

    def __call__(self, *args, backend=None, **kwargs):
        if kwargs or len(args) != self._count:  # all by position: nothing to order
            args = self.op.ordered(args, kwargs)
        watched = _watched()
        if self._all_tensors and not watched:  # each a plain tensor that Tensor.numpy() takes: no check needed
            arrays = []
            for x in args:
                if type(x) is not _Tensor:
                    break
                try:
                    arrays.append(x.numpy())
                except Exception:  # noqa: BLE001 - not a view the host path takes: the full rules
                    break
            else:
                return self._run_host(arrays, backend)
        values, arrays = self._checked(args, self._host and not watched)
        if arrays is not None:
            if self._written:
                _bump_versions(tuple(values[i] for i in self._written if values[i] is not None))
            return self._run_host(arrays, backend)
        if not watched and self._eager is not None and _grad_enabled():
            result = self._eager((*values, backend))
            if result is not _SLOW:
                return result
        return self.torch_op(*values, backend)

    def _checked(self, args, host: bool) -> tuple[list, list | None]:
        """``(values, arrays)``, one pass over the arguments (in the op's order): ``values`` as the
        schema takes them (a codec's parameter encoded, every value checked by
        :func:`check_value`; a plain tensor for a ``Tensor`` parameter needs no check); with
        ``host``, ``arrays`` the same with each tensor as a NumPy view (each tensor of a list too)
        and a codec's parameter decoded (as the implementation would decode it). ``arrays`` is None
        without ``host``, or where a tensor is not a plain CPU tensor of a NumPy dtype, needs a
        gradient, or is an inference tensor the op writes (the dispatcher's rules for those stay
        its own)."""
        values, arrays = [], []
        for (name, kind, encode, tensor_kind, unchanged), x in zip(self._params, args):
            if encode is not None:
                x = encode(x)
            if unchanged is not None and unchanged(x):
                values.append(x)
                arrays.append(x)
                continue
            if type(x) is _Tensor and tensor_kind:
                values.append(x)
                if host:
                    try:  # succeeds only for a plain CPU tensor of a NumPy dtype that needs no gradient
                        a = x.numpy()
                    except Exception:  # noqa: BLE001 - the full rule
                        a = _host_view(x)
                    host = a is not None
                    arrays.append(a)
                continue
            if x is not None or kind != "Tensor?":
                x = check_value(name, kind, x)
            values.append(x)
            arrays.append(x)
            if tensor_kind and x is not None:  # a tensor subclass: the dispatcher's
                host = False
        if not host:
            return values, None
        return values, self._lists_and_codecs(values, arrays) if self._more else arrays

    def _lists_and_codecs(self, values: list, arrays: list) -> list | None:
        """:meth:`_checked`'s second look: each tensor of a list as a view, written tensors not
        inference tensors, a codec's parameter decoded."""
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
        """The NumPy op on :meth:`_checked`'s arrays; its arrays as tensors (no copy)."""
        if self._keyword:
            k = self._positional
            result = self._numpy(*arrays[:k], **dict(zip(self._keyword, arrays[k:])), backend=backend)
        elif backend is None:
            result = self._numpy(*arrays)
        else:
            result = self._numpy(*arrays, backend=backend)
        if type(result) is _ndarray and (self._fresh or (self._as_is and result.flags.writeable)):
            return _from_numpy(result)
        if result is None:
            return None
        if type(result) is _ndarray:
            return convert_output(result, self.spec, False)
        if isinstance(result, tuple):
            return tuple(convert_output(r, self.spec, False) for r in result)
        return [convert_output(r, self.spec, False) for r in result]

    def _no_grad_call(self, args: tuple):
        """The call in the eager autograd forward (grad mode is off there): the host path, or
        the dispatcher's implementation (which converts what the host path cannot take). ``args``
        are schema values already (checking them again changes nothing)."""
        arrays = self._checked(args[:-1], True)[1]
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
    setup, formula = spec.setup, spec.backward
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
        grads = (list(grads),) if type(shape) is int else _restore(grads, shape)
        flat_needs = ctx.needs_input_grad
        ctx.needs_input_grad = _needs_by_argument(where, flat_needs[2:], ctx.embnum_lengths, len(every))
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
        found = _plain_cpu_tensors(args, tensors, lists)
        if found is None:
            return _SLOW
        call = _EagerCall(found[1], found[2])
        out = apply(args, call, *found[0])
        return list(out) if type(call.out) is int else _restore(out, call.out)

    return run


def _plain_cpu_tensors(args, tensors: list[int], lists: list[int]):
    """``(flat, where, lengths)`` of the tensors among ``args`` (those at ``tensors``, and each item
    of the lists at ``lists``): ``where[k] = (i, j)`` places ``flat[k]`` (``j`` None outside a list),
    ``lengths`` the lists' lengths. None unless every tensor is a plain CPU tensor and one needs a
    gradient."""
    lengths = {i: len(args[i]) for i in lists if args[i] is not None}
    found = [(i, None, args[i]) for i in tensors]
    found += [(i, j, t) for i in lengths for j, t in enumerate(args[i])]
    flat, where, needed = [], [], False
    for i, j, t in found:
        if t is not None:
            if type(t) is not torch.Tensor or not t.is_cpu:
                return None
            flat.append(t)
            where.append((i, j))
            needed = needed or t.requires_grad
    return (flat, where, lengths) if needed else None


def _restore(values: tuple, shape):
    """The op's result structure from the Function's flat tuple: ``shape`` None (as it is), or a
    tuple of flags (None where an optional result was not returned)."""
    if shape is None:
        return values
    it = iter(values)
    return tuple(next(it) if present else None for present in shape)


def _needs_by_argument(where, flat_needs, lengths: dict, count: int) -> tuple:
    """``needs_input_grad`` by the op's arguments from the flat tensors' flags (a list of flags for a
    list argument), as the family's formula reads it."""
    needs: list = [False] * count
    for (i, j), need in zip(where, flat_needs):
        if j is None:
            needs[i] = need
        else:
            if needs[i] is False:
                needs[i] = [False] * lengths[i]
            needs[i][j] = need
    return tuple(needs)
