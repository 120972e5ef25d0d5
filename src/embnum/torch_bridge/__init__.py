"""embnum ops on torch tensors: zero-copy (DLPack), torch custom ops with autograd.

``embnum.torch_bridge.<name>`` takes the same arguments as ``embnum.<name>``
(``backend=`` included, no ``out=``) with tensors in place of arrays, CPU or
CUDA, and returns tensors on the same device. Every op is also registered as
``torch.ops.embnum.<name>``, with a fake implementation for
``torch.compile`` and, where the op has one, an autograd formula.
The torch modules built on these ops are in :mod:`embnum.modules`.
"""

import importlib

from ..ops import FAMILIES
from ._library import BRIDGES, BUILT, build, to_array, to_tensor

for _family in FAMILIES:  # each family's module here describes its bridges (one module per family)
    importlib.import_module(f"{__name__}.{_family}")

for _spec in BRIDGES.values():
    build(_spec)
__all__ = ["to_array", "to_tensor", *BUILT]
del _family, _spec


def __getattr__(name: str):
    """``embnum.torch_bridge.<op>``: the op on tensors (``_library.BridgedOp``)."""
    found = BUILT.get(name)
    if found is None:
        raise AttributeError(f"module 'embnum.torch_bridge' has no attribute {name!r}")
    return found


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


from . import codecs  # noqa: E402,F401 - communication codecs over the ops built above
from .fbgemm_aliases import register_fbgemm_aliases  # noqa: E402,F401 - opt-in torch.ops.fbgemm names
