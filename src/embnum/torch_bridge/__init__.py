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
from ._library import BRIDGES, build, to_array, to_tensor

for _family in FAMILIES:  # each family's module here describes its bridges (one module per family)
    importlib.import_module(f"{__name__}.{_family}")

__all__ = ["to_array", "to_tensor"]
for _name, _spec in BRIDGES.items():
    globals()[_name] = build(_spec)
    __all__.append(_name)
del _name, _spec, _family
from . import codecs  # noqa: E402,F401 - communication codecs over the ops built above
from .fbgemm_aliases import register_fbgemm_aliases  # noqa: E402,F401 - opt-in torch.ops.fbgemm names
