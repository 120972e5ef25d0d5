"""``KeyedTensor`` in TorchRec's layout: pooled embeddings of several keys side by side.

``values [B, D]`` (``key_dim=1``, the TorchRec default) holds key ``k_i``'s
``length_per_key[i]`` columns after those of the keys before it. ``regroup`` /
``regroup_as_dict`` build new groups of keys from several KeyedTensors with
``regroup_keyed_tensor`` (``permute_multi_embedding`` over ``kt_regroup_arguments``):
keys may be used several times or not at all; on torch tensors the regroup is
differentiable (the gradients of a key used twice are summed).
"""

from __future__ import annotations

from . import _arrays as A
from . import _checks as C
from . import _torchrec as T


class KeyedTensor(A.Held):
    """``KeyedTensor(keys, length_per_key, values, key_dim=1, offset_per_key=None, index_per_key=None,
    *, backend=None)`` as TorchRec's. Rejected at construction: repeated keys, ``length_per_key``
    of another length than ``keys`` or not summing to ``values.shape[key_dim]``."""

    def __init__(
        self, keys, length_per_key, values, key_dim=1, offset_per_key=None, index_per_key=None, *, backend=None
    ):
        keys = C.keys("keys", keys)
        lpk = C.int_list("length_per_key", length_per_key)
        C.array("values", values, ndim=(1,))
        key_dim = C.int_value("key_dim", key_dim)
        if key_dim >= values.ndim:
            raise ValueError(f"key_dim = {key_dim} is not a dimension of values (shape {tuple(values.shape)})")
        if len(lpk) != len(keys):
            raise ValueError(f"length_per_key must have one entry per key ({len(keys)}), got {len(lpk)}")
        if sum(lpk) != values.shape[key_dim]:
            raise ValueError(f"length_per_key sums to {sum(lpk)} but values.shape[{key_dim}] = {values.shape[key_dim]}")
        self._keys, self._lpk, self._values, self._key_dim = keys, lpk, values, key_dim
        self._backend = backend
        self._offset_per_key = None
        if offset_per_key is not None and C.int_list("offset_per_key", offset_per_key) != self.offset_per_key():
            raise ValueError(f"offset_per_key = {list(offset_per_key)} is not the cumsum of length_per_key")

    @staticmethod
    def from_tensor_list(keys, tensors, key_dim=1, cat_dim=1, *, backend=None):
        """Concatenate ``tensors`` (one per key) along ``cat_dim``; key ``i`` is ``tensors[i].shape[key_dim]`` wide."""
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise ValueError("tensors must be a non-empty list of arrays")
        if len(tensors) != len(keys):
            raise ValueError(f"tensors must hold one array per key ({len(keys)}), got {len(tensors)}")
        for i, t in enumerate(tensors):
            C.array(f"tensors[{i}]", t, ndim=(key_dim + 1,))
            A.same_place(f"tensors[{i}]", t, tensors[0], "tensors[0]")
        lpk = [int(t.shape[key_dim]) for t in tensors]
        return KeyedTensor(keys, lpk, A.cat(list(tensors), axis=cat_dim), key_dim, backend=backend)

    def keys(self) -> list[str]:
        return self._keys

    def values(self):
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> list[int]:
        return self._lpk

    def offset_per_key(self) -> list[int]:
        if self._offset_per_key is None:
            out = [0]
            for n in self._lpk:
                out.append(out[-1] + n)
            self._offset_per_key = out
        return self._offset_per_key

    def index_per_key(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self._keys)}

    _key_indices = index_per_key

    def _narrow(self, i):
        a, b = self.offset_per_key()[i], self.offset_per_key()[i + 1]
        index = [slice(None)] * self._values.ndim
        index[self._key_dim] = slice(a, b)
        return self._values[tuple(index)]

    def __getitem__(self, key: str):
        """Key ``key``'s columns (a view)."""
        try:
            i = self._keys.index(key)
        except ValueError:
            raise KeyError(f"key {key!r} is not one of {self._keys}") from None
        return self._narrow(i)

    def to_dict(self) -> dict:
        return {k: self._narrow(i) for i, k in enumerate(self._keys)}

    @staticmethod
    def regroup(keyed_tensors, groups) -> list:
        """One ``[B, width]`` array per group of keys (keys may repeat across and within groups, or be
        unused): ``regroup_keyed_tensor`` over the KeyedTensors' values (``key_dim = 1``, 2-D)."""
        if not isinstance(keyed_tensors, (list, tuple)) or not keyed_tensors:
            raise ValueError("keyed_tensors must be a non-empty list of KeyedTensors")
        for i, kt in enumerate(keyed_tensors):
            if not isinstance(kt, KeyedTensor):
                raise TypeError(f"keyed_tensors[{i}] must be an embnum KeyedTensor, got {type(kt).__name__}")
            if kt.key_dim() != 1 or kt.values().ndim != 2:
                raise ValueError(f"keyed_tensors[{i}] must be 2-D with key_dim = 1 to regroup")
        groups = _groups(groups)
        first = keyed_tensors[0].values()
        regroup = A.ops_for(first).regroup_keyed_tensor
        return regroup(
            [kt.values() for kt in keyed_tensors],
            [kt.keys() for kt in keyed_tensors],
            [kt.length_per_key() for kt in keyed_tensors],
            groups,
            backend=keyed_tensors[0].backend,
        )

    @staticmethod
    def regroup_as_dict(keyed_tensors, groups, keys) -> dict:
        """``{keys[j]: regroup(keyed_tensors, groups)[j]}``."""
        groups = _groups(groups)
        C.keys("keys", keys)
        if len(groups) != len(keys):
            raise ValueError(f"groups and keys must have the same length, got {len(groups)} and {len(keys)}")
        return dict(zip(keys, KeyedTensor.regroup(keyed_tensors, groups)))

    def to_torchrec(self):
        """A ``torchrec.sparse.jagged_tensor.KeyedTensor`` sharing this one's memory."""
        return T.sparse().KeyedTensor(
            keys=list(self.keys()),
            length_per_key=list(self.length_per_key()),
            values=T.tensor(self.values()),
            key_dim=self.key_dim(),
        )

    @staticmethod
    def from_torchrec(obj, *, backend=None):
        """The KeyedTensor of a torchrec ``KeyedTensor`` (its values tensor, not a copy)."""
        T.checked(obj, "KeyedTensor")
        return KeyedTensor(list(obj.keys()), list(obj.length_per_key()), obj.values(), obj.key_dim(), backend=backend)

    def to(self, device, non_blocking=False):
        if not A.is_tensor(self._values):
            raise TypeError("to(device) moves torch tensors; this KeyedTensor holds " + A.kind(self._values))
        return KeyedTensor(
            self._keys,
            self._lpk,
            self._values.to(device, non_blocking=non_blocking),
            self._key_dim,
            backend=self._backend,
        )

    def __repr__(self) -> str:
        v = self._values
        return (
            f"KeyedTensor(keys={self._keys}, length_per_key={self._lpk}, "
            f"values={A.kind(v)} {A.dtype_name(v)}{tuple(v.shape)})"
        )


def _groups(groups) -> list:
    """A list of lists of str (a str is not a list of its characters): ``TypeError`` naming the entry."""
    if not isinstance(groups, (list, tuple)):
        raise TypeError(f"groups must be a list of lists of keys, got {type(groups).__name__}")
    for j, g in enumerate(groups):
        if not isinstance(g, (list, tuple)):
            raise TypeError(f"groups[{j}] must be a list of keys, got {g!r}")
        for i, k in enumerate(g):
            if not isinstance(k, str):
                raise TypeError(f"groups[{j}][{i}] must be a str, got {k!r}")
    return [list(g) for g in groups]
