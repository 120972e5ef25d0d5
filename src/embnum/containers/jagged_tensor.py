"""``JaggedTensor``: one jagged feature in TorchRec's layout, on NumPy, CuPy or torch arrays.

``values [N, ...]``, ``lengths [B]`` or ``offsets [B + 1]`` (the other derived lazily),
optional ``weights [N]``; the dense forms are ``jagged_to_padded_dense`` on the matching
layer (``embnum`` or ``embnum.torch_bridge``: differentiable on tensors).
"""

from __future__ import annotations

from . import _arrays as A
from . import _checks as C
from . import _torchrec as T


class JaggedArrays(A.Held):
    """The array accessors JaggedTensor and KeyedJaggedTensor share (``_values``, ``_weights``,
    ``_lengths``, ``_offsets``, ``_backend``): offsets or lengths derived lazily from the other."""

    def values(self):
        return self._values

    def weights(self):
        if self._weights is None:
            raise ValueError(f"this {type(self).__name__} has no weights (use weights_or_none())")
        return self._weights

    def weights_or_none(self):
        return self._weights

    def lengths(self):
        if self._lengths is None:
            self._lengths = A.diff(self._offsets)
        return self._lengths

    def lengths_or_none(self):
        return self._lengths

    def offsets(self):
        if self._offsets is None:
            self._offsets = A.ops_for(self._lengths).complete_cumsum(self._lengths, backend=self._backend)
        return self._offsets

    def offsets_or_none(self):
        return self._offsets


class JaggedTensor(JaggedArrays):
    """One jagged feature: ``values [N, ...]``, ``lengths [B]`` or ``offsets [B + 1]``, optional ``weights [N]``.

    Bag ``b`` is ``values[offsets[b]:offsets[b+1]]``. ``backend=`` (keyword) picks the
    embnum backend of every op (``None``: from the arrays).
    """

    def __init__(self, values, weights=None, lengths=None, offsets=None, *, backend=None):
        C.array("values", values, ndim=(1,))
        C.jagged_arrays("JaggedTensor", values, weights, lengths, offsets)
        self._init(values, weights, lengths, offsets, backend)

    def _init(self, values, weights, lengths, offsets, backend):
        self._values, self._weights, self._lengths, self._offsets = values, weights, lengths, offsets
        self._backend = backend
        return self

    @classmethod
    def _make(cls, values, weights=None, lengths=None, offsets=None, backend=None):
        """A JaggedTensor from arrays known to be consistent (no checks, no host reads)."""
        return cls.__new__(cls)._init(values, weights, lengths, offsets, backend)

    # constructors
    @staticmethod
    def empty(is_weighted=False, device=None, values_dtype=None, weights_dtype=None, lengths_dtype=None, *, like=None):
        """An empty JaggedTensor (0 bags). Arrays are torch tensors when ``device`` or a dtype is a
        torch object or ``like`` is a tensor, CuPy arrays when ``like`` is one, else NumPy."""
        v, w, l = empty_arrays(is_weighted, device, values_dtype, weights_dtype, lengths_dtype, like)
        return JaggedTensor._make(v, w, l)

    @staticmethod
    def from_dense(values, weights=None, *, backend=None):
        """From a list of ``B`` 1-D (or ``[L_b, ...]``) arrays, one per bag."""
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError("values must be a non-empty list of arrays (one per bag)")
        lengths = A.int64_like([v.shape[0] for v in values], values[0])
        w = None if weights is None else A.cat(list(weights))
        return JaggedTensor(A.cat(list(values)), w, lengths, backend=backend)

    @staticmethod
    def from_dense_lengths(values, lengths, weights=None, *, backend=None):
        """From a padded ``[B, L, ...]`` array and ``lengths [B]`` (``lengths[b] <= L``)."""
        C.array("values", values, ndim=(2,))
        C.array("lengths", lengths, index=True)
        if lengths.shape[0] != values.shape[0]:
            raise ValueError(f"len(lengths) = {lengths.shape[0]} must equal values.shape[0] = {values.shape[0]}")
        C.nonneg("lengths", lengths)
        if not A.compiling() and lengths.shape[0] and int(lengths.max()) > values.shape[1]:
            raise ValueError(f"lengths has an entry {int(lengths.max())} above values.shape[1] = {values.shape[1]}")
        L = values.shape[1]
        pos = A.int64_like(range(L), lengths)
        mask = pos[None, :] < lengths[:, None]
        return JaggedTensor(values[mask], None if weights is None else weights[mask], lengths, backend=backend)

    # dense forms
    def to_dense(self) -> list:
        """One array per bag (views of ``values``; a host read of the lengths)."""
        o = A.to_list(self.offsets())
        return [self._values[a:b] for a, b in zip(o[:-1], o[1:])]

    def to_dense_weights(self):
        if self._weights is None:
            return None
        o = A.to_list(self.offsets())
        return [self._weights[a:b] for a, b in zip(o[:-1], o[1:])]

    def to_padded_dense(self, desired_length=None, padding_value=0.0):
        """``[B, L, ...]``: bag ``b`` in row ``b``, cut or padded to ``L`` (default: the longest bag)."""
        return padded_dense(self._values, self.offsets(), self.lengths(), desired_length, padding_value, self._backend)

    def to_padded_dense_weights(self, desired_length=None, padding_value=0.0):
        if self._weights is None:
            return None
        return padded_dense(self._weights, self.offsets(), self.lengths(), desired_length, padding_value, self._backend)

    # interop
    def to_torchrec(self):
        """A ``torchrec.sparse.jagged_tensor.JaggedTensor`` sharing this one's memory (torch tensors;
        NumPy/CuPy arrays are viewed through DLPack)."""
        return T.sparse().JaggedTensor(
            values=T.tensor(self.values()), weights=T.tensor(self.weights_or_none()), lengths=T.tensor(self.lengths())
        )

    @staticmethod
    def from_torchrec(obj, *, backend=None):
        """The JaggedTensor of a ``torchrec.sparse.jagged_tensor.JaggedTensor`` (its tensors, not copies)."""
        T.checked(obj, "JaggedTensor")
        return JaggedTensor(obj.values(), obj.weights_or_none(), lengths=obj.lengths(), backend=backend)

    def __repr__(self) -> str:
        v = self._values
        return (
            f"JaggedTensor(bags={self.lengths().shape[0]}, values={A.kind(v)} {A.dtype_name(v)}{tuple(v.shape)}, "
            f"weighted={self._weights is not None})"
        )


def padded_dense(values, offsets, lengths, desired_length, padding_value, backend):
    """``jagged_to_padded_dense`` of one jagged dimension; ``desired_length`` None: the longest bag."""
    if desired_length is None:
        if A.compiling():
            raise ValueError("to_padded_dense needs desired_length under torch.compile (the longest bag is data)")
        desired_length = int(lengths.max()) if lengths.shape[0] else 0
    L = C.int_value("desired_length", desired_length)
    return A.ops_for(values).jagged_to_padded_dense(values, [offsets], [L], padding_value, backend=backend)


def empty_arrays(is_weighted, device, values_dtype, weights_dtype, lengths_dtype, like):
    """Empty values, weights (or None) and lengths: torch when a torch device/dtype or ``like`` says so."""
    torchy = A.is_tensor(like) or any(
        type(x).__module__.startswith("torch") for x in (device, values_dtype, weights_dtype, lengths_dtype)
    )
    if torchy:
        import torch

        device = like.device if device is None and like is not None else device
        mk = lambda dt, default: torch.empty(0, dtype=dt or default, device=device)  # noqa: E731
        f32, i32 = torch.float32, torch.int32
    else:
        import numpy as np

        xp = np
        if like is not None and A.kind(like) == "cupy":
            import cupy as xp
        mk = lambda dt, default: xp.empty(0, dtype=dt or default)  # noqa: E731
        f32, i32 = np.float32, np.int32
    return mk(values_dtype, f32), mk(weights_dtype, f32) if is_weighted else None, mk(lengths_dtype, i32)
