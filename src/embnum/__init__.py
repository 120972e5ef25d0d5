"""embnum: recommendation-system embedding kernels you can read, test and change.

Every op is ``embnum.<name>(..., out=None, backend=None)`` on NumPy or CuPy
arrays; ``embnum.torch_bridge`` has the same ops on torch tensors with
autograd. ``embnum.ops()`` lists them. Importing embnum loads neither torch,
CuPy nor Numba: each is loaded the first time something needs it.
"""

from . import ops as _declarations
from ._backend import available_backends
from ._registry import get as get_op
from ._registry import ops
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
for _op in ops():
    globals()[_op.name] = _op.public
    __all__.append(_op.name)
for _family in _declarations.FAMILIES:  # host helpers a family exports beside its ops (no backend)
    for _name in getattr(getattr(_declarations, _family), "HELPERS", ()):
        globals()[_name] = getattr(getattr(_declarations, _family), _name)
        __all__.append(_name)
del _op, _declarations
