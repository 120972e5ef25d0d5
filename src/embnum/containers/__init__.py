"""TorchRec-shaped containers over embnum's ops: ``JaggedTensor``, ``KeyedJaggedTensor``, ``KeyedTensor``.

They hold NumPy, CuPy or torch arrays (one kind per container) in TorchRec's
layout and call the ops of the matching layer; torch is used only when they
hold tensors. ``from_torchrec(obj)`` / ``obj.to_torchrec()`` convert when
torchrec is importable.
"""

from ._torchrec import sparse
from .jagged_tensor import JaggedTensor
from .keyed_jagged_tensor import KeyedJaggedTensor
from .keyed_tensor import KeyedTensor


def from_torchrec(obj, *, backend=None):
    """The embnum container of a torchrec ``KeyedJaggedTensor``, ``KeyedTensor`` or ``JaggedTensor``."""
    torchrec = sparse()
    for cls in (KeyedJaggedTensor, KeyedTensor, JaggedTensor):
        if isinstance(obj, getattr(torchrec, cls.__name__)):
            return cls.from_torchrec(obj, backend=backend)
    raise TypeError(
        f"from_torchrec takes a torchrec KeyedJaggedTensor, KeyedTensor or JaggedTensor, got {type(obj).__name__}"
    )


__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "from_torchrec"]
