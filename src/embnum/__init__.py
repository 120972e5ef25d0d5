"""embnum: recommendation-system embedding kernels you can read, test and change.

Every op is ``embnum.<name>(..., out=None, backend=None)`` on NumPy or CuPy
arrays; ``embnum.torch_bridge`` has the same ops on torch tensors with
autograd. ``embnum.ops()`` lists them. Importing embnum loads neither torch,
CuPy nor Numba: each is loaded the first time something needs it.
"""

from . import ops as _declarations
from ._backend import available_backends
from ._registry import _OPS, ops
from ._registry import get as get_op
from ._validate import MAX_SIZE
from .containers import JaggedTensor, KeyedJaggedTensor, KeyedTensor, from_torchrec

__version__ = "0.1.0"

__all__ = [
    "MAX_SIZE",
    "available_backends",
    "get_op",
    "ops",
    "__version__",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "from_torchrec",
]
_HELPERS = {  # host helpers a family exports beside its ops (no backend)
    name: getattr(getattr(_declarations, family), name)
    for family in _declarations.FAMILIES
    for name in getattr(getattr(_declarations, family), "HELPERS", ())
}
__all__ += [o.name for o in ops()] + list(_HELPERS)
del _declarations


def __getattr__(name: str):
    """``embnum.<op>`` (the registered op, :func:`get_op`) and the families' helpers."""
    found = _OPS.get(name) or _HELPERS.get(name)
    if found is None:
        raise AttributeError(f"module 'embnum' has no attribute {name!r}")
    return found


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
