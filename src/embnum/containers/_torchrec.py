"""Conversions to and from torchrec's containers (torchrec is never a dependency of embnum).

Arrays are shared, not copied: torch tensors as they are, NumPy/CuPy arrays viewed
as tensors through DLPack (``to_torchrec``). ``from_torchrec`` keeps torchrec's tensors.
"""

from __future__ import annotations

from . import _arrays as A


def _torchrec():
    try:
        from torchrec.sparse import jagged_tensor
    except ImportError as e:
        raise ImportError(
            "torchrec is not importable here; it is an optional peer: pip install --no-deps torchrec "
            "tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath"
        ) from e
    return jagged_tensor


def _t(a):
    if a is None or A.is_tensor(a):
        return a
    import torch

    return torch.from_dlpack(a)


def jt_to_torchrec(jt):
    return _torchrec().JaggedTensor(values=_t(jt.values()), weights=_t(jt.weights_or_none()), lengths=_t(jt.lengths()))


def kjt_to_torchrec(kjt):
    return _torchrec().KeyedJaggedTensor(
        keys=list(kjt.keys()),
        values=_t(kjt.values()),
        weights=_t(kjt.weights_or_none()),
        lengths=_t(kjt.lengths()),
        stride=kjt.stride(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank() if kjt.variable_stride_per_key() else None,
        inverse_indices=kjt.inverse_indices_or_none(),
    )


def kt_to_torchrec(kt):
    return _torchrec().KeyedTensor(
        keys=list(kt.keys()), length_per_key=list(kt.length_per_key()), values=_t(kt.values()), key_dim=kt.key_dim()
    )


def _check(obj, name):
    cls = getattr(_torchrec(), name)
    if not isinstance(obj, cls):
        raise TypeError(f"expected a torchrec {name}, got {type(obj).__name__}")


def kjt_from_torchrec(obj, *, backend=None):
    from .keyed_jagged_tensor import KeyedJaggedTensor

    _check(obj, "KeyedJaggedTensor")
    vbe = obj.variable_stride_per_key()
    return KeyedJaggedTensor(
        list(obj.keys()),
        obj.values(),
        obj.weights_or_none(),
        lengths=obj.lengths(),
        stride=obj.stride(),
        stride_per_key_per_rank=obj.stride_per_key_per_rank() if vbe else None,
        inverse_indices=obj.inverse_indices_or_none(),
        backend=backend,
    )


def kt_from_torchrec(obj, *, backend=None):
    from .keyed_tensor import KeyedTensor

    _check(obj, "KeyedTensor")
    return KeyedTensor(list(obj.keys()), list(obj.length_per_key()), obj.values(), obj.key_dim(), backend=backend)


def jt_from_torchrec(obj, *, backend=None):
    from .jagged_tensor import JaggedTensor

    _check(obj, "JaggedTensor")
    return JaggedTensor(obj.values(), obj.weights_or_none(), lengths=obj.lengths(), backend=backend)


def from_torchrec(obj, *, backend=None):
    """The embnum container of a torchrec ``KeyedJaggedTensor``, ``KeyedTensor`` or ``JaggedTensor``."""
    jt = _torchrec()
    for cls, fn in (
        (jt.KeyedJaggedTensor, kjt_from_torchrec),
        (jt.KeyedTensor, kt_from_torchrec),
        (jt.JaggedTensor, jt_from_torchrec),
    ):
        if isinstance(obj, cls):
            return fn(obj, backend=backend)
    raise TypeError(
        f"from_torchrec takes a torchrec KeyedJaggedTensor, KeyedTensor or JaggedTensor, got {type(obj).__name__}"
    )
