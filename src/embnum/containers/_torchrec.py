"""torchrec's side of the containers' conversions (torchrec is never a dependency of embnum).

Each container's ``to_torchrec`` / ``from_torchrec`` reads and builds its own fields; this
module knows only torchrec and imports none of the containers. Arrays are shared, not copied:
torch tensors as they are, NumPy/CuPy arrays viewed as tensors through DLPack.
"""

from __future__ import annotations

from . import _arrays as A


def sparse():
    """``torchrec.sparse.jagged_tensor``, or an ImportError that says how to install torchrec."""
    try:
        from torchrec.sparse import jagged_tensor
    except ImportError as e:
        raise ImportError(
            "torchrec is not importable here; it is an optional peer: pip install --no-deps torchrec "
            "tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath"
        ) from e
    return jagged_tensor


def tensor(a):
    """``a`` as a torch tensor sharing its memory (``None`` stays ``None``)."""
    if a is None or A.is_tensor(a):
        return a
    import torch

    return torch.from_dlpack(a)


def checked(obj, name: str):
    """``obj`` when it is a torchrec ``name`` (``"JaggedTensor"``, ``"KeyedJaggedTensor"``,
    ``"KeyedTensor"``); a TypeError otherwise."""
    if not isinstance(obj, getattr(sparse(), name)):
        raise TypeError(f"expected a torchrec {name}, got {type(obj).__name__}")
    return obj
