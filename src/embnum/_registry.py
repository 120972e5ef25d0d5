"""Declare an op once; generate its public function and enumerate it.

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

Plain tuples rather than objects: every call builds one (issue 12's per-call cost).

The implementations are found by convention, never listed by hand:

* ``embnum.ref.<family>.<name>(**args)`` returns the result (NumPy);
* ``embnum.cpu.<family>.<name>(**args, out=...)`` and
  ``embnum.cuda.<family>.<name>(**args, out=...)`` fill ``out``, which
  arrives uninitialised (every element must be written).

From the declaration the registry builds ``embnum.<name>(..., out=None,
backend=None)``: bind the arguments, pick the backend from the arrays (see
``embnum._backend.select_backend``), validate once, check or allocate
``out``, run one implementation. Tests, benchmarks, the tour and the docs
iterate over :func:`ops`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _validate
from ._backend import BACKENDS, is_array, select_backend
from ._compare import exact_match


def out_spec(shape, dtype) -> tuple[tuple, np.dtype]:
    """One output as ``(shape, dtype)``: ``shape`` a tuple of Python ints, ``dtype`` a
    ``np.dtype``. An output above the size limit (or with a negative dimension) is a
    ``ValueError`` here, before anything is allocated.

    The common case (a tuple of non-negative Python ints, a ``np.dtype``, within the limit) is
    recognised in one loop (the generated public function writes its one-dimensional case
    inline); anything else takes :func:`_out_shape`, the exact rule."""
    if type(dtype) not in _DTYPE_TYPES:
        dtype = np.dtype(dtype)
    if type(shape) is tuple:
        n = dtype.itemsize
        for d in shape:
            if type(d) is not int or d < 0:  # negative or not a Python int: the exact rule
                break
            if d:  # zero dimensions are skipped (the exact rule's product)
                n *= d
        else:
            if n <= _MAX_SIZE:
                return shape, dtype
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


# The classes of every NumPy dtype instance (np.dtype(np.int32) is a numpy.dtypes.Int32DType): a set
# test is ~3x cheaper than isinstance(dtype, np.dtype), whose metaclass check is slow. Others (new
# dtypes) still pass np.dtype(dtype), which returns a dtype as it is.
_DTYPE_TYPES = frozenset(type(np.dtype(c)) for c in np.typecodes["All"])


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
    """One registered op (see the module docstring)."""

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
        self.mutates = tuple(mutates)
        self.signature = inspect.signature(declaration)
        self._example_fn: Callable | None = None
        self._implementations: dict[str, Callable] = {}
        self._run: Callable | None = None  # run(impl, args, out): the cpu kernel's small call, once loaded
        # how the cpu backend allocates this op's outputs: the family's cpu module may define
        # ``empty_output(shape, dtype)`` (embnum.cpu._pool: reused large outputs), else np.empty
        self._host_empty: Callable = np.empty
        self.check_fn: Callable = exact_match
        self.public = self._make_public()

    @property
    def example_fn(self) -> Callable | None:
        """``fn(rng, size) -> Example``: a realistic input for the tour and the benchmarks, from
        ``embnum.examples.<family>`` (imported on first use: the examples live apart from the
        declarations)."""
        if self._example_fn is None:
            importlib.import_module(f"embnum.examples.{self.family}")
        return self._example_fn

    # -- implementations -------------------------------------------------
    def implementation(self, backend: str) -> Callable:
        """The implementation of this op for ``backend`` (imported on first use)."""
        impl = self._implementations.get(backend)
        if impl is None:
            module = importlib.import_module(f"embnum.{backend}.{self.family}")
            try:
                impl = self._implementations[backend] = getattr(module, self.kernel_name)
            except AttributeError:
                raise NotImplementedError(f"embnum.{backend}.{self.family} has no {self.kernel_name}") from None
            if backend == "cpu":  # Numba and the cpu kernels are loaded: open the public function's short path
                from .cpu import _common

                self._namespace["_empty"] = self._host_empty = getattr(module, "empty_output", np.empty)
                self._namespace["_common"] = _common
                names = _positional_kernel(impl)
                kernel = getattr(impl, "__name__", "")  # the one-thread rule's key
                self._namespace["_run"] = self._run = (
                    _common.small_call if names is None else _common.kernel_runner(impl, kernel, names)
                )
                if names is not None:  # after _run is set: the rewritten code no longer checks it
                    call = _common.positional_call(names, "_args", "_result")
                    self._inline_kernel(_common.serial_rule(kernel, call, "_args", "_result"))
        return impl

    # -- the call --------------------------------------------------------
    def bind(self, args, kwargs) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def __call__(self, *args, out=None, backend=None, **kwargs):
        return self.call(self.bind(args, kwargs), out, backend)

    def call(self, arguments: dict[str, Any], out, backend):
        """Run the op on bound ``arguments`` (every parameter by name).

        The common case (plain NumPy arrays, no ``backend=``, no ``out=``) takes a
        short path: no backend search, the cpu kernel looked up once, its outputs
        allocated here (none for ``returns="computed"`` or an in-place op, whose
        arrays are checked apart first, as in :meth:`_call`). Everything else goes
        through :meth:`_call`.
        Running out of memory for sizes below the limit is an
        :class:`embnum._validate.AllocationError` (a ``MemoryError`` and a ``ValueError``).
        The public function (:meth:`_make_public`) runs the same short path inline."""
        try:
            if backend is None and out is None and _all_plain_numpy(arguments):
                plan = self.declaration(**arguments)
                args, planned = plan
                if planned is None:  # "computed": the kernel returns its result; "none": it writes in place
                    if self.mutates:
                        _validate.no_alias(arguments, self.mutates)  # as _call checks it, after the declaration
                    impl = self._implementations.get("cpu")
                    if impl is None or self._run is None:
                        impl = self._cpu_implementation()
                    return self._run(impl, args, None)
                if self.returns == "array":
                    impl = self._implementations.get("cpu")
                    if impl is None or self._run is None:
                        impl = self._cpu_implementation()
                    result = self._host_empty(*out_spec(*planned))
                    self._run(impl, args, result)  # small_call: one thread on small inputs
                    return result
                if self._run is not None and not self.mutates:
                    impl = self._implementations.get("cpu")
                    if impl is not None:  # several outputs (None: not requested), as _call allocates them
                        given = self._host_outputs(planned)
                        self._run(impl, args, given)
                        return given
                return self._call(arguments, out, backend, plan)
            return self._call(arguments, out, backend)
        except MemoryError as e:
            self._memory_error(e)

    def _host_outputs(self, planned: tuple | list) -> tuple | list:
        """The cpu backend's outputs for a plan of several (a tuple or list of ``(shape, dtype)``,
        None where an output is not requested), from the family's allocator; the short paths
        of :meth:`call` and of the public function both allocate them here."""
        empty = self._host_empty
        outs = [None if s is None else empty(*out_spec(*s)) for s in planned]
        return tuple(outs) if type(planned) is tuple else outs

    def _memory_error(self, e: MemoryError):
        if isinstance(e, _validate.AllocationError):
            raise e
        raise _validate.AllocationError(f"embnum.{self.name}: not enough memory for this call ({e})") from e

    def _cpu_call(self, args, out):
        impl = self._implementations.get("cpu")
        if impl is None or _small_call is None:
            impl = self._cpu_implementation()
        return _small_call(impl, args, out)

    def _cpu_implementation(self) -> Callable:
        global _small_call
        select_backend({}, "cpu")  # raises where Numba is missing
        from .cpu._common import small_call

        _small_call = small_call
        return self.implementation("cpu")

    def _call(self, arguments: dict[str, Any], out, backend, plan: tuple | None = None):
        arrays = _validate.arrays_in(arguments)
        if any(type(a) is not np.ndarray and isinstance(a, np.ndarray) for a in arrays.values()):
            arguments, arrays = _plain_arrays(arguments)
        chosen = select_backend(arrays, backend)
        if plan is None:
            plan = self.declaration(**arguments)
        if chosen.name == "ref":
            _check_returns(self, plan)
        args, planned = plan
        if self.mutates:
            _validate.no_alias(arguments, self.mutates)
        if planned is None:
            if out is not None:
                raise TypeError(f"{self.name} takes no out=")
            if chosen.name == "cpu":
                return self._cpu_call(args, None)
            return self.implementation(chosen.name)(**args)
        single = self.returns == "array"
        as_tuple = self.returns == "tuple"
        specs = [planned] if single else list(planned)
        shapes = [None if s is None else out_spec(*s) for s in specs]
        outs = None
        if out is not None:
            if single and isinstance(out, (list, tuple)):
                raise TypeError("out must be one array for this op, got a list")
            if not single and not isinstance(out, (list, tuple)):
                raise TypeError("out must be a list of arrays for this op")
            outs = _validate.out_arrays(out, shapes, arrays, chosen.owns)
        if chosen.name == "ref":
            result = _zero_d_arrays(self.implementation("ref")(**args))
            results = [result] if single else list(result)
            _check_oracle(self.name, results, shapes)
            if outs is None:
                return result
            for o, r in zip(outs, results):
                if o is not None:
                    o[...] = r
        else:
            if outs is None:
                empty = self._host_empty if chosen.name == "cpu" else chosen.empty
                outs = [None if s is None else empty(*s) for s in shapes]
            given = outs[0] if single else tuple(outs) if as_tuple else outs
            if chosen.name == "cpu":
                self._cpu_call(args, given)
            else:
                self.implementation(chosen.name)(**args, out=given)
        if out is not None:
            return out
        return outs[0] if single else tuple(outs) if as_tuple else outs

    def _make_public(self) -> Callable:
        """Generate ``def <name>(<params>, *, out=None, backend=None)`` from the declaration.

        The function is written out (not a ``*args`` wrapper) so that its
        signature is the op's and a call costs no argument binding. It holds the
        common case inline (issue 12: a tiny call's cost is its Python work): no
        ``out=``/``backend=``, every argument a plain ``np.ndarray`` or a Python
        scalar (``None`` included; with a list argument: :meth:`call`'s rule,
        :func:`_all_plain_numpy`), and the cpu kernel
        already loaded (by an earlier call through :meth:`call`). Then the
        declaration is called directly, its outputs checked (:func:`out_spec`; its
        one-dimensional common case written inline) and allocated, and the kernel run through
        ``cpu._common.small_call``'s rule: the same declaration, kernel and rules as
        :meth:`call`, without building the arguments dict, searching for a backend or
        scanning the arguments. Any other case (NumPy scalars, other array types, lists
        holding them) goes through :meth:`call`.

        Once the cpu kernel is loaded and takes its plan's arguments by name then ``out``,
        :meth:`_inline_kernel` rewrites the function's code with that call and the one-thread
        rule written out (``cpu._common.serial_rule``: no runner frame per call). The
        generated locals start with ``_``, which no op parameter does."""
        if any(name.startswith("_") for name in self.signature.parameters):
            raise ValueError(f"{self.name}: op parameters may not start with '_' (the generated code's locals do)")
        namespace = {
            "_op": self,
            "_defaults": {},
            "_declaration": self.declaration,
            "_implementations": self._implementations,
            "_run": None,  # set by implementation("cpu") once Numba and the cpu kernels are loaded
            "_out_spec": out_spec,
            "_MAX_SIZE": _MAX_SIZE,
            "_DTYPE_TYPES": _DTYPE_TYPES,
            "_empty": np.empty,  # the family's empty_output once the cpu kernels are loaded
            "_ndarray": np.ndarray,
            "_FAST_TYPES": _FAST_TYPES,
            "_plain_numpy": _plain_numpy,
            "_common": None,  # embnum.cpu._common, once loaded (the one-thread rule)
        }
        self._namespace = namespace
        public = self._compile_public(None)
        public.__doc__ = self.declaration.__doc__
        public.__module__ = "embnum"
        public.op = self
        return public

    def _compile_public(self, rule: list[str] | None) -> Callable:
        """The public function of :meth:`_make_public` compiled in its namespace; with ``rule``
        (``cpu._common.serial_rule``'s lines for the kernel's positional call) its
        single-output case runs those lines instead of calling ``_run``."""
        params = list(self.signature.parameters.values())
        defaults = self._namespace["_defaults"]
        defaults.update({p.name: p.default for p in params if p.default is not inspect.Parameter.empty})
        positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]  # stay keyword-only
        head = ", ".join(p.name if p.name not in defaults else f"{p.name}=_defaults[{p.name!r}]" for p in positional)
        tail = "out=None, backend=None" if self.takes_out else "backend=None"
        tail = ", ".join(
            [f"{p.name}=_defaults[{p.name!r}]" if p.name in defaults else p.name for p in keyword] + [tail]
        )
        args = ", ".join(f"{p.name!r}: {p.name}" for p in params)
        out = "out" if self.takes_out else "None"
        lines = [f"def {self.name}({head + ', ' if head else ''}*, {tail}):"]
        if (self.takes_out or self.returns == "computed") and params and not self.mutates:
            names = [p.name for p in params]
            if len(names) == 1:
                plain = f"type({names[0]}) is _ndarray"
            else:
                types = ", ".join(f"type({n})" for n in names)
                plain = (  # plain arrays and scalars; with a list argument, its items too (call's rule)
                    f"(_FAST_TYPES.issuperset(_types := ({types}))"
                    f" or (list in _types or tuple in _types) and _plain_numpy(({', '.join(names)},)))"
                )
            decl_args = ", ".join([p.name for p in positional] + [f"{p.name}={p.name}" for p in keyword])
            ready = "_run is not None and " if rule is None else ""  # the rewrite runs once it is set
            if self.returns == "array":
                body = [
                    f"_args, (_shape, _dtype) = _declaration({decl_args})",
                    "if not (  # out_spec's common case for one dimension; anything else takes out_spec",
                    "    type(_shape) is tuple and len(_shape) == 1 and type(_dtype) in _DTYPE_TYPES",
                    "    and type(_shape[0]) is int and 0 <= _shape[0] * _dtype.itemsize <= _MAX_SIZE",
                    "):",
                    "    _shape, _dtype = _out_spec(_shape, _dtype)",
                    "_result = _empty(_shape, _dtype)",
                    *(
                        ["_run(_impl, _args, _result)  # small_call: one thread on small inputs"]
                        if rule is None
                        else rule
                    ),
                    "return _result",
                ]
            elif self.returns == "computed":  # the kernel returns its own result
                body = [
                    f"_args, _planned = _declaration({decl_args})",
                    "return _run(_impl, _args, None)",
                ]
            else:  # several outputs (None: an output not requested)
                body = [
                    f"_args, _planned = _declaration({decl_args})",
                    "_given = _op._host_outputs(_planned)",
                    "_run(_impl, _args, _given)",
                    "return _given",
                ]
            lines += [
                f"    if {'out is None and ' if self.takes_out else ''}backend is None and {ready}{plain}:",
                "        _impl = _implementations.get('cpu')",
                "        if _impl is not None:",
                "            try:",
                *(f"                {line}" for line in body),
                "            except MemoryError as _e:",
                "                _op._memory_error(_e)",
            ]
        lines.append(f"    return _op.call({{{args}}}, {out}, backend)")
        code = compile("\n".join(lines) + "\n", f"<embnum op {self.name}>", "exec")
        # the function is defined in the namespace (its globals); a rewrite only takes its code
        scope = self._namespace if rule is None else dict(self._namespace)
        exec(code, scope)
        return scope[self.name] if rule is None else scope[self.name].__code__

    def _inline_kernel(self, rule: list[str]) -> None:
        """Give the public function the code with the cpu kernel's call and the one-thread rule
        written out (see :meth:`_make_public`): the same function object (its signature,
        defaults, docstring and identity are kept), a new ``__code__`` compiled for the same
        namespace."""
        if self.takes_out and self.signature.parameters and not self.mutates:
            self.public.__code__ = self._compile_public(rule)

    def __repr__(self) -> str:
        return f"<embnum op {self.family}.{self.name}>"


_MAX_SIZE = _validate.MAX_SIZE
_small_call: Callable | None = None  # embnum.cpu._common.small_call, once Numba is loaded

_SCALAR_TYPES = frozenset((int, float, bool, str, type(None)))
_FAST_TYPES = _SCALAR_TYPES | {np.ndarray}  # the argument types of the public function's short path
_NOT_ARRAYS = _SCALAR_TYPES | {list, tuple}  # a list item that is a list (nested keys) is no array


def _other_array(v) -> bool:
    """An array that is not a plain ``np.ndarray`` (a subclass, a CuPy array)."""
    t = type(v)
    return t not in _NOT_ARRAYS and t is not np.ndarray and (isinstance(v, np.ndarray) or is_array(v))


def _positional_kernel(impl: Callable) -> list[str] | None:
    """The names of a cpu kernel's parameters before ``out`` when they are plain names without
    defaults ending in ``out`` (the kernel is then called positionally:
    ``cpu._common.kernel_runner``, or the public function's inline call), else None (keyword
    call through ``cpu._common.small_call``)."""
    try:
        params = list(inspect.signature(impl).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)
    if not plain or not params or params[-1].name != "out":
        return None
    return [p.name for p in params[:-1]]


def _all_plain_numpy(arguments: dict[str, Any]) -> bool:
    """Whether every array among ``arguments`` (lists' items included) is a plain
    ``np.ndarray`` (or there is none): the call then runs on the cpu backend, as
    ``select_backend`` would pick it."""
    return _plain_numpy(arguments.values())


def _plain_numpy(values) -> bool:
    """:func:`_all_plain_numpy` over the argument values (the generated public function passes
    them as a tuple when one of them is a list or tuple)."""
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


def _zero_d_arrays(result):
    """The oracle's NumPy scalars (a ufunc on a 0-d array returns one) as 0-d arrays, like
    the other backends' results."""
    if isinstance(result, np.generic):
        return np.asarray(result)
    if isinstance(result, list):
        return [np.asarray(r) if isinstance(r, np.generic) else r for r in result]
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return tuple(np.asarray(r) if isinstance(r, np.generic) else r for r in result)
    return result


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


def _check_oracle(name, results, shapes):
    if len(results) != len(shapes):
        raise AssertionError(f"embnum.ref {name} returned {len(results)} results, expected {len(shapes)}")
    for r, spec in zip(results, shapes):
        if spec is None or r is None:
            if spec is not None or r is not None:
                raise AssertionError(f"embnum.ref {name} returned {r!r} where the plan expects {spec}")
            continue
        shape, dtype = spec
        if tuple(r.shape) != tuple(shape) or r.dtype != dtype:
            raise AssertionError(
                f"embnum.ref {name} returned {r.dtype}{tuple(r.shape)}, expected {dtype}{tuple(shape)}"
            )


_OPS: dict[str, Op] = {}


def op(
    family: str,
    *,
    returns: str | None = None,
    differentiable: tuple[str, ...] = (),
    same_as: str | None = None,
    mutates: tuple[str, ...] = (),
):
    """Register the decorated declaration as ``embnum.<name>``; return the public function.

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
        return o.public

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
    """Every registered op (of ``family`` when given), in declaration order."""
    from . import ops as _families  # noqa: F401 - importing registers every family

    return [o for o in _OPS.values() if family is None or o.family == family]


def get(name: str) -> Op:
    ops()
    try:
        return _OPS[name]
    except KeyError:
        raise ValueError(f"no op named {name!r}; known: {sorted(_OPS)}") from None


def backends() -> list[str]:
    """Every backend name, available here or not."""
    return list(BACKENDS)
