"""Declare an op once; the registered op is its public function; enumerate the ops.

An op declaration is a function decorated with :func:`op`. Its parameters
are the op's public parameters; its body validates them (through
``embnum._validate``) and returns the op's *plan*, a plain tuple ``(args, out)``:

* ``args``: a dict, the normalised arguments that every implementation receives
  (ints are Python ints, lists are lists);
* ``out``: the shape and dtype of each output, by the op's ``returns`` (:data:`RETURNS`):
  one ``(shape, dtype)`` (``"array"``), a list of them (``"list"``), a tuple of them with
  ``None`` for an output not requested (``"tuple"``), or ``None`` (``"computed"``,
  ``"none"``). The registry checks each against the size limit (:func:`out_spec`) before it
  allocates anything.

Plain tuples rather than objects: every call builds one.

The implementations are found by convention, never listed by hand:

* ``embnum.ref.<family>.<name>(**args)`` returns the result (NumPy);
* ``embnum.cpu.<family>.<name>(**args, out=...)`` and
  ``embnum.cuda.<family>.<name>(**args, out=...)`` fill ``out``, which
  arrives uninitialised (every element must be written).

``embnum.<name>(..., out=None, backend=None)`` is the :class:`Op` itself; a call
(:meth:`Op.__call__`) picks the backend from the arrays (see
``embnum._backend.select_backend``), runs the declaration (which validates), checks or
allocates ``out`` and hands the kernel to the backend (``Backend.run``, bound to the kernel
once: ``Backend.runner``). Tests, benchmarks,
the tour and the docs iterate over :func:`ops`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _validate
from ._backend import BACKENDS, Backend, get_backend, is_array, select_backend
from ._compare import exact_match


def out_spec(shape, dtype) -> tuple[tuple, np.dtype]:
    """One output as ``(shape, dtype)``: ``shape`` a tuple of Python ints, ``dtype`` a
    ``np.dtype``. An output above the size limit (or with a negative dimension) is a
    ``ValueError`` here, before anything is allocated.

    The common case (a tuple of non-negative Python ints, a ``np.dtype`` of a fixed item size,
    within the limit) is recognised in one loop; anything else takes :func:`_out_shape`, the
    exact rule."""
    n = _ITEMSIZE.get(type(dtype))
    if n is not None and type(shape) is tuple:
        for d in shape:
            if type(d) is not int or d < 0:  # negative or not a Python int: the exact rule
                break
            if d:  # zero dimensions are skipped (the exact rule's product)
                n *= d
        else:
            if n <= _MAX_SIZE:
                return shape, dtype
    dtype = np.dtype(dtype)  # (a dtype is returned as it is)
    return _out_shape(shape, dtype), dtype


def _out_shape(shape, dtype: np.dtype) -> tuple:
    """:func:`out_spec`'s exact rule: ``shape`` as a tuple of Python ints whose elements times the
    item size (zero dimensions skipped) is at most :data:`embnum.MAX_SIZE` bytes, no dimension
    negative; a ``ValueError`` otherwise (before anything is allocated)."""
    if type(shape) is tuple:  # a tuple of Python ints is kept as it is
        for d in shape:
            if type(d) is not int:
                shape = tuple(map(int, shape))
                break
    else:
        shape = tuple(map(int, shape))
    n = dtype.itemsize  # _validate.shape_fits(shape + (itemsize,))
    for d in shape:
        if d > 0:
            n *= d
        elif d < 0:
            n = -1
            break
    if n > _MAX_SIZE or n < 0:
        raise ValueError(
            f"an output of shape {shape} ({dtype}) is negative or above the size limit 2**48 (embnum.MAX_SIZE);"
            " check the size arguments"
        )
    return shape


# The item size by the class of a NumPy dtype instance (np.dtype(np.int32) is a
# numpy.dtypes.Int32DType, 4 bytes) for every class whose instances all have one size (not strings,
# bytes or void): one lookup answers "a dtype?" and its size, without isinstance(dtype, np.dtype) (slow:
# its metaclass) or the dtype.itemsize getter. Other dtypes take np.dtype().
_ITEMSIZE = {type(np.dtype(c)): np.dtype(c).itemsize for c in np.typecodes["All"] if np.dtype(c).kind not in "SUV"}


@dataclasses.dataclass(frozen=True)
class Example:
    """A realistic input for the tour and the benchmarks: ``args`` for the
    public function, made on the host (NumPy)."""

    args: dict[str, Any]
    label: str


# What an op returns, declared in ``@op(returns=...)``; the plan's ``out`` must agree.
RETURNS = {
    "array": "one array; the plan's out is one (shape, dtype); out= takes one array",
    "list": "a list of arrays; the plan's out is a list of (shape, dtype); out= takes a list",
    "tuple": "a tuple of arrays with None for outputs not requested; the plan's out is a tuple of (shape, dtype)"
    " or None; out= a tuple/list",
    "computed": "sizes that depend on the data (or small host values): the implementation returns its own result;"
    " the plan's out is None; no out=",
    "none": "nothing: an in-place op (implied by mutates=); the plan's out is None; no out=",
}


class Op:
    """One registered op; the op is also its public function, ``embnum.<name>``.

    ``embnum.<name>(<the declaration's parameters>, *, out=None, backend=None)`` calls
    :meth:`__call__` (``out=`` only where the op takes one): the declaration validates the
    arguments and returns the plan, the backend is chosen from the arrays, the outputs are
    allocated (or ``out=`` checked) and the backend runs its kernel (:meth:`Backend.run`).
    The object carries the declaration's name, docstring and signature (``help``,
    ``inspect.signature``)."""

    def __init__(
        self,
        declaration: Callable,
        family: str,
        *,
        differentiable: tuple[str, ...],
        returns: str,
        same_as: str | None,
        mutates: tuple[str, ...] = (),
    ):
        self.declaration = declaration
        self.name = declaration.__name__
        self.family = family
        self.kernel_name = same_as or self.name
        self.differentiable = differentiable
        self.returns = returns
        self.takes_out = returns in ("array", "list", "tuple")
        self._single = returns == "array"  # one output (a call reads this flag, not a string compare)
        self.mutates = tuple(mutates)
        self.signature = inspect.signature(declaration)
        self.check_fn: Callable = exact_match
        self._example_fn: Callable | None = None
        # backend -> (kernel, allocator, run): loaded on first use (importing embnum loads no Numba)
        self._kernels: dict[Backend, tuple[Callable, Callable, Callable]] = {}
        self._names = tuple(self.signature.parameters)
        self._positional = sum(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in self.signature.parameters.values())
        self._defaults = {
            n: p.default for n, p in self.signature.parameters.items() if p.default is not inspect.Parameter.empty
        }
        # what help(), inspect and the docs read from a function
        self.__name__ = self.__qualname__ = self.name
        self.__doc__ = declaration.__doc__
        self.__module__ = "embnum"
        keyword = inspect.Parameter.KEYWORD_ONLY
        extra = [inspect.Parameter("out", keyword, default=None)] if self.takes_out else []
        extra.append(inspect.Parameter("backend", keyword, default=None))
        self.__signature__ = self.signature.replace(parameters=[*self.signature.parameters.values(), *extra])

    @property
    def public(self) -> Op:
        """``embnum.<name>``: the op itself."""
        return self

    @property
    def op(self) -> Op:
        """The op (``embnum.<name>.op``, as the declaration modules and decorators read it)."""
        return self

    @property
    def example_fn(self) -> Callable | None:
        """``fn(rng, size) -> Example``: a realistic input for the tour and the benchmarks, from
        ``embnum.examples.<family>`` (imported on first use: the examples live apart from the
        declarations)."""
        if self._example_fn is None:
            importlib.import_module(f"embnum.examples.{self.family}")
        return self._example_fn

    def implementation(self, backend: str) -> Callable:
        """The kernel of this op for ``backend`` (imported on first use)."""
        return self._load(get_backend(backend))[0]

    def _load(self, backend: Backend) -> tuple[Callable, Callable, Callable]:
        """``(kernel, allocator, run)`` of this op on ``backend``, loaded once: ``run(args, out)``
        is ``backend.run`` with the kernel bound (:meth:`Backend.runner`)."""
        loaded = self._kernels.get(backend)
        if loaded is None:
            if not backend.available():
                raise RuntimeError(f"backend {backend.name!r} is not available in this process")
            kernel = backend.kernel(self.family, self.kernel_name)
            loaded = self._kernels[backend] = (kernel, backend.allocator(self.family), backend.runner(kernel))
        return loaded

    # -- the call --------------------------------------------------------
    def __call__(self, *args, out=None, backend=None, **kwargs):
        """Run the op (see the class docstring). Plain NumPy arrays and scalars without
        ``backend=`` run on the cpu backend with no further look at them; anything else goes
        through :meth:`_route` first. Running out of memory for sizes below the limit is an
        :class:`embnum._validate.AllocationError` (a ``MemoryError`` and a ``ValueError``)."""
        if out is not None and not self.takes_out:
            raise TypeError(f"{self.name}() got an unexpected keyword argument 'out'")
        chosen = None
        if backend is None:  # plain arrays and scalars: the cpu backend, as select_backend picks it
            chosen = _CPU
            for a in args:
                if type(a) not in _FAST_TYPES:
                    chosen = None
                    break
            if kwargs:  # (an empty dict's values view is not free: most calls pass none)
                for a in kwargs.values():
                    if type(a) not in _FAST_TYPES:
                        chosen = None
                        break
        if chosen is None:
            chosen, args, kwargs = self._route(args, kwargs, backend)
        try:
            # (a call with **kwargs costs a dict merge even when empty: most calls pass none)
            plan = self.declaration(*args, **kwargs) if kwargs else self.declaration(*args)
            if chosen is _REF:
                _check_returns(self, plan)
            plan_args, planned = plan
            if self.mutates:
                _validate.no_alias(self.bind(args, kwargs), self.mutates)
            _, empty, run = self._kernels.get(chosen) or self._load(chosen)
            if out is not None:
                run(plan_args, self._given_outputs(planned, out, self.bind(args, kwargs), chosen))
                return out
            if planned is None:  # the kernel returns its result ("computed") or writes in place ("none")
                return run(plan_args, None)
            if self._single:
                shape, dtype = out_spec(*planned)
                outputs = empty(shape, dtype)
            else:  # a list or tuple of outputs (None where one is not requested)
                outputs = [None if s is None else empty(*out_spec(*s)) for s in planned]
                if self.returns == "tuple":
                    outputs = tuple(outputs)
            run(plan_args, outputs)
            return outputs
        except MemoryError as e:
            self._memory_error(e)

    def _route(self, args: tuple, kwargs: dict, backend) -> tuple[Backend, tuple, dict]:
        """``(backend, args, kwargs)`` of a call that is not all plain positional NumPy: the cpu
        backend with the arguments as given where every array (lists' items included) is a plain
        ``np.ndarray`` (or there is none) and ``backend=`` is not given; else the arguments bound by
        name, NumPy subclasses viewed as plain arrays and the backend chosen from the arrays
        (``embnum._backend.select_backend``)."""
        if backend is None and _plain_numpy(args) and _plain_numpy(kwargs.values()):
            return _CPU, args, kwargs
        arguments = self.bind(args, kwargs)
        arrays = _validate.arrays_in(arguments)
        if any(type(a) is not np.ndarray and isinstance(a, np.ndarray) for a in arrays.values()):
            arguments, arrays = _plain_arrays(arguments)
        return select_backend(arrays, backend), (), arguments

    def call(self, arguments: dict[str, Any], out, backend):
        """The op on ``arguments`` (every parameter by name): ``self(**arguments, ...)``."""
        return self(**arguments, out=out, backend=backend)

    def bind(self, args, kwargs) -> dict[str, Any]:
        """The arguments of a call by name in the signature's order, defaults filled in (a
        ``TypeError`` as Python words it for a call that does not fit the signature)."""
        return dict(zip(self._names, self.ordered(args, kwargs)))

    def ordered(self, args, kwargs) -> list:
        """The arguments of a call in the signature's order, defaults filled in (a ``TypeError``
        as Python words it for a call that does not fit the signature)."""
        if not args and len(kwargs) == len(self._names):  # every argument by keyword
            values = []
            for name in self._names:
                if name not in kwargs:
                    break  # an unknown keyword in place of this one: the rules below
                values.append(kwargs[name])
            else:
                return values
        if len(args) <= self._positional:
            values = list(args)
            taken = 0  # keyword arguments used
            for name in self._names[len(args) :]:
                if name in kwargs:
                    values.append(kwargs[name])
                    taken += 1
                elif name in self._defaults:
                    values.append(self._defaults[name])
                else:
                    break  # missing
            else:
                if taken == len(kwargs):  # none unknown or given twice
                    return values
        bound = self.signature.bind(*args, **kwargs)  # raises what Python would
        bound.apply_defaults()
        return list(bound.arguments.values())

    def _given_outputs(self, planned, out, arguments: dict, backend: Backend):
        """``out=`` checked against the plan (shapes, dtypes, the backend's arrays, no overlap
        with an input), in the form the kernel takes."""
        single = self._single
        shapes = [None if s is None else out_spec(*s) for s in ([planned] if single else planned)]
        if single and isinstance(out, (list, tuple)):
            raise TypeError("out must be one array for this op, got a list")
        if not single and not isinstance(out, (list, tuple)):
            raise TypeError("out must be a list of arrays for this op")
        outs = _validate.out_arrays(out, shapes, _validate.arrays_in(arguments), backend.owns)
        return outs[0] if single else tuple(outs) if self.returns == "tuple" else outs

    def _memory_error(self, e: MemoryError):
        if isinstance(e, _validate.AllocationError):
            raise e
        raise _validate.AllocationError(f"embnum.{self.name}: not enough memory for this call ({e})") from e

    def __repr__(self) -> str:
        return f"<embnum op {self.family}.{self.name}>"


_MAX_SIZE = _validate.MAX_SIZE
_CPU = BACKENDS["cpu"]
_REF = BACKENDS["ref"]

_SCALAR_TYPES = frozenset((int, float, bool, str, type(None)))
_FAST_TYPES = _SCALAR_TYPES | {np.ndarray}  # argument types that need no closer look
_NOT_ARRAYS = _SCALAR_TYPES | {list, tuple}  # a list item that is a list (nested keys) is no array


def _other_array(v) -> bool:
    """An array that is not a plain ``np.ndarray`` (a subclass, a CuPy array)."""
    t = type(v)
    return t not in _NOT_ARRAYS and t is not np.ndarray and (isinstance(v, np.ndarray) or is_array(v))


def _all_plain_numpy(arguments: dict[str, Any]) -> bool:
    """Whether every array among ``arguments`` (lists' items included) is a plain
    ``np.ndarray`` (or there is none): the call then runs on the cpu backend, as
    ``select_backend`` would pick it."""
    return _plain_numpy(arguments.values())


def _plain_numpy(values) -> bool:
    """:func:`_all_plain_numpy` over the argument values."""
    for v in values:
        t = type(v)
        if t is list or t is tuple:
            for x in v:
                if type(x) is not np.ndarray and type(x) not in _NOT_ARRAYS and _other_array(x):
                    return False
        elif t is not np.ndarray and t not in _NOT_ARRAYS and _other_array(v):
            return False
    return True


def _plain_arrays(arguments: dict[str, Any]):
    """NumPy subclasses (``np.matrix``, ...) as plain ndarray views, so that no backend
    sees or returns the caller's class; masked arrays are a ``TypeError`` (their mask
    would be dropped silently)."""

    def plain(name, a):
        if isinstance(a, np.ma.MaskedArray):
            raise TypeError(f"{name} is a masked array; pass its data (a.filled(...) or a.data) instead")
        return a.view(np.ndarray) if isinstance(a, np.ndarray) and type(a) is not np.ndarray else a

    out = {}
    for k, v in arguments.items():
        if isinstance(v, (list, tuple)):
            items = [plain(f"{k}[{i}]", x) for i, x in enumerate(v)]
            out[k] = items if isinstance(v, list) else tuple(items)
        else:
            out[k] = plain(k, v)
    return out, _validate.arrays_in(out)


def _check_returns(op: Op, plan) -> None:
    """The declaration's plan is ``(args, out)`` and ``out`` agrees with the op's declared
    ``returns`` (checked on the oracle path, which the tests run for every op)."""
    if type(plan) is not tuple or len(plan) != 2 or type(plan[0]) is not dict:
        raise AssertionError(f"{op.name}'s declaration must return (args: dict, out), got {type(plan).__name__}")
    out = plan[1]
    if out is None:
        kind = "computed" if not op.mutates else "none"
    elif type(out) is list:
        kind = "list"
    elif type(out) is tuple and len(out) == 2 and out[1] is not None and type(out[1]) is not tuple:
        kind = "array"  # (shape, dtype): a dtype is never a tuple or None
    elif type(out) is tuple:
        kind = "tuple"
    else:
        kind = type(out).__name__
    if kind != op.returns:
        raise AssertionError(f"{op.name} is declared returns={op.returns!r} but its plan describes {kind!r}")


_OPS: dict[str, Op] = {}


def op(
    family: str,
    *,
    returns: str | None = None,
    differentiable: tuple[str, ...] = (),
    same_as: str | None = None,
    mutates: tuple[str, ...] = (),
):
    """Register the decorated declaration as ``embnum.<name>``; return the op (its public function).

    ``returns`` is the kind of result (:data:`RETURNS`): ``"array"`` (the
    default), ``"list"``, ``"tuple"``, ``"computed"`` (data-dependent sizes:
    the implementation returns its own result, no ``out=``) or ``"none"``.
    ``differentiable`` names the array arguments the torch bridge gives a
    gradient. ``same_as`` names another op of the family whose
    implementations serve this one (the declaration then returns that op's
    plan arguments: a special case written as a call of the general op).
    ``mutates`` names the array arguments an in-place op writes; it implies
    ``returns="none"`` (no ``out=``); its plan passes those arrays through
    unchanged so that the implementation writes the caller's memory.
    Parameters may be keyword-only (after ``*``); they stay keyword-only.
    """
    if mutates and returns not in (None, "none"):
        raise ValueError(f"an op that mutates {mutates} returns nothing; got returns={returns!r}")
    returns = returns or ("none" if mutates else "array")
    if returns not in RETURNS:
        raise ValueError(f"returns must be one of {sorted(RETURNS)}, got {returns!r}")
    if returns == "none" and not mutates:
        raise ValueError("returns='none' is for in-place ops: name the arrays it writes in mutates=")

    def register(declaration: Callable) -> Callable:
        o = Op(declaration, family, differentiable=differentiable, returns=returns, same_as=same_as, mutates=mutates)
        if o.name in _OPS:
            raise ValueError(f"op {o.name!r} declared twice")
        _OPS[o.name] = o
        return o

    return register


def example(public: Callable):
    """Attach ``fn(rng, size) -> Example`` as the tour/benchmark input of ``public``'s op."""

    def attach(fn):
        public.op._example_fn = fn
        return fn

    return attach


def check(public: Callable):
    """Attach ``fn(got, want, args) -> (max_err, ok)`` as the op's oracle comparison."""

    def attach(fn):
        public.op.check_fn = fn
        return fn

    return attach


def ops(family: str | None = None) -> list[Op]:
    """Every registered op (of ``family`` when given), in declaration order. (``embnum``'s
    ``__init__`` imports the declarations, ``embnum.ops``, which registers them all before any
    module of the package can ask.)"""
    return [o for o in _OPS.values() if family is None or o.family == family]


def get(name: str) -> Op:
    try:
        return _OPS[name]
    except KeyError:
        raise ValueError(f"no op named {name!r}; known: {sorted(_OPS)}") from None


def backends() -> list[str]:
    """Every backend name, available here or not."""
    return list(BACKENDS)
