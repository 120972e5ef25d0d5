"""``KeyedJaggedTensor`` in TorchRec's layout, on NumPy, CuPy or torch arrays.

Layout (as ``torchrec.sparse.jagged_tensor``): a KJT of keys ``k_0..k_{T-1}`` holds
``values [N]`` (1-D), ``lengths [sum(stride_per_key)]`` (1-D, key-major: the bags of
key 0, then of key 1, ...), optional ``weights [N]`` (float), offsets derived lazily
(``complete_cumsum(lengths)``, the dtype of ``lengths``), and a batch size per key:
one ``stride`` for all keys, or ``stride_per_key_per_rank`` (a variable batch per key).

Methods are embnum ops on the matching layer (``embnum`` for NumPy/CuPy arrays,
``embnum.torch_bridge`` for tensors: differentiable in ``values`` and ``weights``, and
``torch.compile(fullgraph=True)``-traceable). The ops that want 2-D ``lengths``
get a reshaped view. Metadata (keys, strides) is plain Python; methods that need
per-key value counts as Python ints (``length_per_key``, views in ``split``,
``__getitem__``, ``to_dict``) read them from the arrays once and cache them, except
while torch.compile traces: then they use the ops' dynamic output sizes instead
(a permute of the key range), so no host read breaks the graph.
"""

from __future__ import annotations

from . import _arrays as A
from . import _checks as C
from . import _torchrec as T
from .jagged_tensor import JaggedArrays, JaggedTensor, empty_arrays, padded_dense

_UNSET = object()


def _op(like, name):
    return getattr(A.ops_for(like), name)


class KeyedJaggedTensor(JaggedArrays):
    """Jagged features by key, TorchRec's layout (see the module docstring).

    ``KeyedJaggedTensor(keys, values, weights=None, lengths=None, offsets=None, stride=None,
    stride_per_key_per_rank=None, ...)`` as TorchRec's (the cached-metadata arguments
    ``stride_per_key``, ``length_per_key``, ``offset_per_key``, ``index_per_key``,
    ``lengths_offset_per_key``, ``jt_dict`` and ``inverse_indices`` are accepted: ``length_per_key``
    is checked against the lengths (eagerly), ``inverse_indices`` kept (it sets the stride of a
    variable batch, as TorchRec), the others recomputed from the arrays when needed, never
    trusted; a ``stride_per_key`` list without ``stride_per_key_per_rank`` means one rank per key).
    ``backend=`` (keyword) picks the embnum backend of every op. Rejected at construction:
    repeated keys, lengths that do not sum to ``len(values)``, negative lengths, offsets
    that are not a complete cumsum, a stride (or strides per key) that does not match
    ``len(lengths)``, weights of another length, arrays of different kinds or devices.
    """

    def __init__(
        self,
        keys,
        values,
        weights=None,
        lengths=None,
        offsets=None,
        stride=None,
        stride_per_key_per_rank=None,
        stride_per_key=None,
        length_per_key=None,
        lengths_offset_per_key=None,
        offset_per_key=None,
        index_per_key=None,
        jt_dict=None,
        inverse_indices=None,
        *,
        backend=None,
    ):
        keys = C.keys("keys", keys)
        C.array("values", values)
        n_bags = C.jagged_arrays("KeyedJaggedTensor", values, weights, lengths, offsets)
        stride, spkpr = C.strides(keys, n_bags, stride, stride_per_key_per_rank, stride_per_key, inverse_indices)
        self._init(keys, values, weights, lengths, offsets, stride, spkpr, backend)
        if length_per_key is not None:
            self._length_per_key = C.int_list("length_per_key", length_per_key)
            if len(self._length_per_key) != len(keys) or (not A.compiling() and self._length_per_key != self._lpk()):
                raise ValueError(f"length_per_key = {self._length_per_key} does not match the lengths")
        self._inverse_indices = inverse_indices

    def _init(self, keys, values, weights, lengths, offsets, stride, spkpr, backend, length_per_key=None):
        self._keys, self._values, self._weights = keys, values, weights
        self._lengths, self._offsets = lengths, offsets
        self._stride, self._spkpr = stride, spkpr
        self._backend = backend
        self._length_per_key = length_per_key
        self._offset_per_key = None
        self._index_per_key = None
        self._inverse_indices = None
        return self

    @classmethod
    def _make(cls, keys, values, weights, lengths, stride, spkpr, backend, length_per_key=None):
        """From arrays known to be consistent (results of methods: no checks, no host reads)."""
        return cls.__new__(cls)._init(keys, values, weights, lengths, None, stride, spkpr, backend, length_per_key)

    def _like(self, keys, values, weights, lengths, spkpr=_UNSET, length_per_key=None, stride=None):
        spkpr = self._spkpr if spkpr is _UNSET else spkpr
        stride = self._stride if stride is None else stride
        return KeyedJaggedTensor._make(keys, values, weights, lengths, stride, spkpr, self._backend, length_per_key)

    # -- constructors ----------------------------------------------------------------
    @staticmethod
    def from_lengths_sync(
        keys, values, lengths, weights=None, stride=None, stride_per_key_per_rank=None, inverse_indices=None, **kw
    ):
        """``KeyedJaggedTensor(...)`` from lengths, then :meth:`sync` (``backend=`` as a keyword)."""
        return KeyedJaggedTensor(
            keys, values, weights, lengths, None, stride, stride_per_key_per_rank, inverse_indices=inverse_indices, **kw
        ).sync()

    @staticmethod
    def from_offsets_sync(
        keys, values, offsets, weights=None, stride=None, stride_per_key_per_rank=None, inverse_indices=None, **kw
    ):
        """``KeyedJaggedTensor(...)`` from offsets, then :meth:`sync` (``backend=`` as a keyword)."""
        return KeyedJaggedTensor(
            keys, values, weights, None, offsets, stride, stride_per_key_per_rank, inverse_indices=inverse_indices, **kw
        ).sync()

    @staticmethod
    def from_jt_dict(jt_dict, force_variable_stride=False, *, backend=None):
        """Keys in dict order; a variable batch per key when the JaggedTensors have different batch sizes
        (or ``force_variable_stride``)."""
        if not isinstance(jt_dict, dict) or not jt_dict:
            raise ValueError("jt_dict must be a non-empty dict of JaggedTensors")
        jts = list(jt_dict.values())
        for k, jt in jt_dict.items():
            if not isinstance(jt, JaggedTensor):
                raise TypeError(f"jt_dict[{k!r}] must be an embnum JaggedTensor, got {type(jt).__name__}")
        weighted = [jt.weights_or_none() is not None for jt in jts]
        if any(weighted) and not all(weighted):
            raise ValueError("jt_dict mixes weighted and unweighted JaggedTensors")
        strides = [jt.lengths().shape[0] for jt in jts]
        variable = force_variable_stride or any(s != strides[0] for s in strides)
        kjt = KeyedJaggedTensor(
            list(jt_dict),
            A.cat([jt.values() for jt in jts]),
            A.cat([jt.weights() for jt in jts]) if all(weighted) else None,
            A.cat([jt.lengths() for jt in jts]),
            stride=None if variable else strides[0],
            stride_per_key_per_rank=[[s] for s in strides] if variable else None,
            backend=backend if backend is not None else jts[0].backend,
        )
        return kjt.sync()

    @staticmethod
    def concat(kjt_list):
        """The keys of every KJT in order (they must be distinct), values/lengths/weights concatenated.
        All fixed-batch with one stride, or all variable-batch."""
        if not isinstance(kjt_list, (list, tuple)) or not kjt_list:
            raise ValueError("kjt_list must be a non-empty list of KeyedJaggedTensors")
        first = kjt_list[0]
        weighted = first.weights_or_none() is not None
        vbe = first.variable_stride_per_key()
        for i, k in enumerate(kjt_list):
            if (k.weights_or_none() is not None) != weighted:
                raise ValueError(f"kjt_list[{i}] is {'un' if weighted else ''}weighted but kjt_list[0] is not")
            if k.variable_stride_per_key() != vbe:
                raise ValueError(f"kjt_list[{i}] and kjt_list[0] disagree on variable stride per key")
            if not vbe and k.stride() != first.stride() and k._keys and first._keys:
                raise ValueError(f"kjt_list[{i}] has stride {k.stride()} but kjt_list[0] has {first.stride()}")
            A.same_place(f"kjt_list[{i}].values()", k.values(), first.values(), "kjt_list[0].values()")
        keys = C.keys("keys of kjt_list", [key for k in kjt_list for key in k._keys])
        lpk = [k._length_per_key for k in kjt_list]
        stride = max([k.stride() for k in kjt_list])
        return KeyedJaggedTensor._make(
            keys,
            A.cat([k.values() for k in kjt_list]),
            A.cat([k.weights() for k in kjt_list]) if weighted else None,
            A.cat([k.lengths() for k in kjt_list]),
            stride,
            [r for k in kjt_list for r in k._spkpr] if vbe else None,
            first._backend,
            None if any(x is None for x in lpk) else [x for xs in lpk for x in xs],
        )

    @staticmethod
    def empty(is_weighted=False, device=None, values_dtype=None, weights_dtype=None, lengths_dtype=None, *, like=None):
        """No keys, no values, stride 0 (array kind as :meth:`JaggedTensor.empty`)."""
        v, w, l = empty_arrays(is_weighted, device, values_dtype, weights_dtype, lengths_dtype, like)
        return KeyedJaggedTensor._make([], v, w, l, 0, None, None, [])

    @staticmethod
    def empty_like(kjt):
        """No keys, the kinds, dtypes and device of ``kjt``'s arrays, stride 0."""
        w = kjt.weights_or_none()
        return KeyedJaggedTensor._make(
            [], kjt.values()[:0], None if w is None else w[:0], kjt.lengths()[:0], 0, None, kjt._backend, []
        )

    # -- accessors --------------------------------------------------------------------
    def keys(self) -> list[str]:
        return self._keys

    def stride(self) -> int:
        return self._stride

    def stride_per_key(self) -> list[int]:
        if self._spkpr is None:
            return [self._stride] * len(self._keys)
        return [sum(r) for r in self._spkpr]

    def stride_per_key_per_rank(self) -> list[list[int]]:
        """Per key, the batch size from each rank (``[]`` for a fixed batch, as TorchRec)."""
        return [] if self._spkpr is None else [list(r) for r in self._spkpr]

    def variable_stride_per_key(self) -> bool:
        return self._spkpr is not None

    def inverse_indices(self):
        if self._inverse_indices is None:
            raise ValueError("this KeyedJaggedTensor has no inverse_indices")
        return self._inverse_indices

    def inverse_indices_or_none(self):
        return self._inverse_indices

    def index_per_key(self) -> dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {k: i for i, k in enumerate(self._keys)}
        return self._index_per_key

    _key_indices = index_per_key

    def lengths_offset_per_key(self) -> list[int]:
        """Where each key's bags start in ``lengths`` (``T + 1`` ints)."""
        out = [0]
        for s in self.stride_per_key():
            out.append(out[-1] + s)
        return out

    def _lpk_array(self):
        """int64 ``[T]``: the number of values of each key, as an array (no host read)."""
        T = len(self._keys)
        if self._spkpr is None:
            return A.row_sums(self.lengths().reshape(T, self._stride))
        o = A.astype(self.offsets(), _int64_of(self._values))
        bounds = A.int64_like(self.lengths_offset_per_key(), o)
        return A.diff(o[bounds])

    def _lpk(self) -> list[int]:
        return A.to_list(self._lpk_array()) if self._keys else []

    def length_per_key(self) -> list[int]:
        """Number of values of each key (Python ints: read from the arrays once, then cached)."""
        if self._length_per_key is None:
            self._length_per_key = self._lpk()
        return self._length_per_key

    def length_per_key_or_none(self):
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        """Where each key's values start, plus the total (``T + 1`` Python ints)."""
        if self._offset_per_key is None:
            out = [0]
            for n in self.length_per_key():
                out.append(out[-1] + n)
            self._offset_per_key = out
        return self._offset_per_key

    def offset_per_key_or_none(self):
        return self._offset_per_key

    def sync(self):
        """Compute and cache ``length_per_key`` and ``offset_per_key`` (not while torch.compile traces)."""
        if not A.compiling():
            self.offset_per_key()
        return self

    def unsync(self):
        self._length_per_key = self._offset_per_key = None
        return self

    def flatten_lengths(self):
        return self

    # -- key ranges ---------------------------------------------------------------------
    def _key_range(self, start: int, end: int):
        """values, weights, lengths of keys ``start..end-1`` and their length_per_key (or None)."""
        lop = self.lengths_offset_per_key()
        lengths = self.lengths()[lop[start] : lop[end]]
        if A.compiling():  # no host read: gather the key range with a permute (dynamic size)
            perm = A.index_like(range(start, end), self._values, _int64_of(self._values))
            _, v, w = _op(self._values, "permute_1d_sparse_data")(
                perm, self._lpk_array(), self._values, self._weights, backend=self._backend
            )
            return v, w, lengths, None
        opk = self.offset_per_key()
        a, b = opk[start], opk[end]
        w = None if self._weights is None else self._weights[a:b]
        return self._values[a:b], w, lengths, self._length_per_key[start:end]

    def split(self, segments) -> list:
        """Consecutive groups of ``segments[i]`` keys (``sum(segments) == len(keys)``); views in eager mode."""
        segments = C.int_list("segments", segments)
        if sum(segments) != len(self._keys):
            raise ValueError(f"segments sum to {sum(segments)} but there are {len(self._keys)} keys")
        out, start = [], 0
        for seg in segments:
            end = start + seg
            v, w, l, lpk = self._key_range(start, end)
            spkpr = None if self._spkpr is None else self._spkpr[start:end]
            out.append(self._like(self._keys[start:end], v, w, l, spkpr, lpk))
            start = end
        return out

    def __getitem__(self, key: str) -> JaggedTensor:
        try:
            i = self.index_per_key()[key]
        except KeyError:
            raise KeyError(f"key {key!r} is not one of {self._keys}") from None
        v, w, l, _ = self._key_range(i, i + 1)
        return JaggedTensor._make(v, w, l, backend=self._backend)

    def to_dict(self) -> dict:
        """``{key: JaggedTensor}`` in key order."""
        return {k: self[k] for k in self._keys}

    # -- permute ----------------------------------------------------------------------------
    def permute(self, indices, indices_tensor=None):
        """Keys ``keys[indices[0]], keys[indices[1]], ...``: reorder, repeat or drop keys.

        Fixed batch: one ``permute_2d_sparse_data`` on ``lengths`` viewed ``[T, stride]``;
        variable batch: two ``permute_1d_sparse_data`` (lengths by ``stride_per_key``, values
        and weights by ``length_per_key``). ``indices_tensor`` (optional): ``indices`` as an
        int32/int64 array of the values' kind, to save building it; checked to hold ``indices``
        (ValueError otherwise; a host read, skipped while torch.compile traces).
        """
        T = len(self._keys)
        indices = C.int_list("indices", indices)
        for j, i in enumerate(indices):
            if i >= T:
                raise IndexError(f"indices[{j}] = {i} is out of range for {T} keys")
        if indices_tensor is None:
            perm = A.index_like(indices, self._values, _int64_of(self._values))
        else:
            perm = _agreeing("indices_tensor", indices_tensor, "indices", indices, self._values)
        keys = [self._keys[i] for i in indices]
        lpk = None if self._length_per_key is None else [self._length_per_key[i] for i in indices]
        ops = A.ops_for(self._values)
        if self._spkpr is None:
            lengths2d = self.lengths().reshape(T, self._stride)
            hint = None if lpk is None or A.compiling() else sum(lpk)
            l, v, w = ops.permute_2d_sparse_data(
                perm, lengths2d, self._values, self._weights, hint, backend=self._backend
            )
            return self._like(keys, v, w, l.reshape(-1), None, lpk)
        spk = A.int64_like(self.stride_per_key(), self._values)
        _, l, _ = ops.permute_1d_sparse_data(perm, spk, self.lengths(), None, backend=self._backend)
        _, v, w = ops.permute_1d_sparse_data(
            perm, self._lpk_array(), self._values, self._weights, backend=self._backend
        )
        return self._like(keys, v, w, l, [list(self._spkpr[i]) for i in indices], lpk)

    # -- batch ---------------------------------------------------------------------------------
    def index_select(self, indices):
        """Batch rows ``indices`` of every key (fixed batch only): ``keyed_jagged_index_select_dim1``.
        The result's stride is ``len(indices)``."""
        if self._spkpr is not None:
            raise ValueError("index_select needs a fixed batch size (this KeyedJaggedTensor has one per key)")
        C.array("indices", indices, integer=True)
        A.same_place("indices", indices, self._values, "values")
        n = indices.shape[0]
        if not self._keys or self._stride == 0:
            if n and not self._keys:
                return self._like(
                    [], self._values[:0], _cut(self._weights), self.lengths()[:0], stride=n, length_per_key=[]
                )
            if n:
                raise IndexError(f"indices selects {n} rows from a batch of 0")
            return self._like(self._keys, self._values, self._weights, self.lengths(), stride=0)
        out = _op(self._values, "keyed_jagged_index_select_dim1")(
            self._values, self.lengths(), self.offsets(), indices, self._stride, self._weights, backend=self._backend
        )
        w = out[2] if len(out) > 2 else None
        return self._like(self._keys, out[0], w, out[1], stride=n)

    def to_padded_dense(self, desired_length=None, padding_value=0.0):
        """``[T, stride, L]``: key ``t``'s bag ``b`` in ``[t, b]``, cut or padded to ``L`` (fixed batch only)."""
        if self._spkpr is not None:
            raise ValueError("to_padded_dense needs a fixed batch size (this KeyedJaggedTensor has one per key)")
        dense = padded_dense(self._values, self.offsets(), self.lengths(), desired_length, padding_value, self._backend)
        return dense.reshape(len(self._keys), self._stride, dense.shape[1])

    # -- row-wise sharding --------------------------------------------------------------------
    def bucketize(
        self,
        num_buckets,
        block_sizes,
        total_num_blocks=None,
        output_permute=False,
        bucketize_pos=False,
        block_bucketize_row_pos=None,
        keep_original_indices=False,
    ):
        """Split every bag's ids over ``num_buckets`` row-wise shards: ``block_bucketize_sparse_features``.

        Id ``x`` of key ``t`` goes to bucket ``x // block_sizes[t]`` with the local id ``x % block_sizes[t]``
        when ``x < block_sizes[t] * num_buckets``, else to bucket ``x % num_buckets`` with the local id
        ``x // num_buckets`` (fbgemm's rule; or by ``block_bucketize_row_pos[t]`` boundaries; ``x`` itself
        with ``keep_original_indices``); ``total_num_blocks[t]`` (a multiple of ``num_buckets``) spreads
        blocks over the buckets as fbgemm's ``total_num_blocks``. Returns ``(buckets, unbucketize_permute)``:
        ``num_buckets`` KeyedJaggedTensors with this one's keys and strides (bucket ``r`` holds what rank
        ``r`` looks up; with ``bucketize_pos`` its weights are the ids' positions in their bags, as
        TorchRec), and, with ``output_permute``, where each input id went in the buckets' values laid
        end to end (else ``None``). Values must be int32/int64 ids.
        """
        num_buckets = C.int_value("num_buckets", num_buckets, minimum=1)
        output_permute, bucketize_pos = C.flag("output_permute", output_permute), C.flag("bucketize_pos", bucketize_pos)
        keep_original_indices = C.flag("keep_original_indices", keep_original_indices)
        T = len(self._keys)
        bs = _index_arg("block_sizes", block_sizes, self._values)
        if bs.shape[0] != T:
            raise ValueError(f"block_sizes must have one entry per key ({T}), got {bs.shape[0]}")
        bpk = None if self._spkpr is None else A.int64_like(self.stride_per_key(), self._values)
        ops = A.ops_for(self._values)
        lengths = self.lengths()
        # the op has no gradient (as fbgemm's): weights that need one are moved by a differentiable scatter
        grad_w = A.is_tensor(self._weights) and self._weights.requires_grad and not bucketize_pos
        l, v, w, pos, unperm = ops.block_bucketize_sparse_features(
            lengths,
            self._values,
            bool(bucketize_pos),
            bool(output_permute) or grad_w,
            bs,
            num_buckets,
            None if grad_w else self._weights,
            bpk,
            -1,
            block_bucketize_row_pos,
            bool(keep_original_indices),
            _index_arg("total_num_blocks", total_num_blocks, self._values),
            backend=self._backend,
        )
        n_bags = lengths.shape[0]
        by_bucket = l.reshape(num_buckets, n_bags)
        w = pos if bucketize_pos else w
        if grad_w:
            w = self._weights.new_zeros(self._weights.shape).index_copy(
                0, A.astype(unperm, _int64_of(unperm)), self._weights
            )
            unperm = unperm if output_permute else None
        if A.compiling():
            totals = A.row_sums(by_bucket)
            ranges = [
                _op(v, "permute_1d_sparse_data")(A.int64_like([r], totals), totals, v, w, backend=self._backend)[1:]
                for r in range(num_buckets)
            ]
        else:
            o = [0]
            for n in A.to_list(A.row_sums(by_bucket)):
                o.append(o[-1] + n)
            ranges = [(v[a:b], None if w is None else w[a:b]) for a, b in zip(o[:-1], o[1:])]
        buckets = [self._like(self._keys, rv, rw, by_bucket[r]) for r, (rv, rw) in enumerate(ranges)]
        return buckets, unperm

    # -- interop -------------------------------------------------------------------------------
    def to_torchrec(self):
        """A ``torchrec.sparse.jagged_tensor.KeyedJaggedTensor`` sharing this one's memory."""
        return T.sparse().KeyedJaggedTensor(
            keys=list(self.keys()),
            values=T.tensor(self.values()),
            weights=T.tensor(self.weights_or_none()),
            lengths=T.tensor(self.lengths()),
            stride=self.stride(),
            stride_per_key_per_rank=self.stride_per_key_per_rank() if self.variable_stride_per_key() else None,
            inverse_indices=self.inverse_indices_or_none(),
        )

    @staticmethod
    def from_torchrec(obj, *, backend=None):
        """The KeyedJaggedTensor of a torchrec ``KeyedJaggedTensor`` (its tensors, not copies)."""
        T.checked(obj, "KeyedJaggedTensor")
        return KeyedJaggedTensor(
            list(obj.keys()),
            obj.values(),
            obj.weights_or_none(),
            lengths=obj.lengths(),
            stride=obj.stride(),
            stride_per_key_per_rank=obj.stride_per_key_per_rank() if obj.variable_stride_per_key() else None,
            inverse_indices=obj.inverse_indices_or_none(),
            backend=backend,
        )

    def to(self, device, non_blocking=False):
        """torch tensors only: a copy on ``device``."""
        if not A.is_tensor(self._values):
            raise TypeError("to(device) moves torch tensors; this KeyedJaggedTensor holds " + A.kind(self._values))
        mv = lambda a: None if a is None else a.to(device, non_blocking=non_blocking)  # noqa: E731
        return self._like(
            self._keys, mv(self._values), mv(self._weights), mv(self.lengths()), length_per_key=self._length_per_key
        )

    def __repr__(self) -> str:
        v = self._values
        return (
            f"KeyedJaggedTensor(keys={self._keys}, stride_per_key={self.stride_per_key()}, "
            f"values={A.kind(v)} {A.dtype_name(v)}{tuple(v.shape)}, weighted={self._weights is not None})"
        )


def _index_arg(name, x, like):
    """A list of ints or an int32/int64 array -> an array of ``like``'s kind and device (None stays
    None): the array as given, the list as int64. Never cast to the ids' dtype: a block size
    beyond it would wrap (the op judges it against the ids' range)."""
    if x is None:
        return None
    if A.is_supported(x):
        C.array(name, x, index=True)
        A.same_place(name, x, like, "values")
        return x
    xs = C.int_list(name, x)
    for i, v in enumerate(xs):
        if v > _INT64_MAX:
            raise ValueError(f"{name}[{i}] = {v} exceeds the int64 range")
    return A.int64_like(xs, like)


def _agreeing(name, a, list_name, xs, like):
    """``a``, a 1-D int32/int64 array of ``like``'s kind, that holds ``xs`` (host read; skipped
    while torch.compile traces)."""
    C.array(name, a, index=True)
    A.same_place(name, a, like, "values")
    if a.shape[0] != len(xs):
        raise ValueError(f"{name} has {a.shape[0]} entries but {list_name} has {len(xs)}: they must agree")
    if not A.compiling():
        got = A.to_list(a)
        if got != xs:
            j = next(j for j, (g, x) in enumerate(zip(got, xs)) if g != x)
            raise ValueError(f"{name}[{j}] = {got[j]} but {list_name}[{j}] = {xs[j]}: they must agree")
    return a


_INT64_MAX = 2**63 - 1


def _cut(a):
    return None if a is None else a[:0]


def _int64_of(like):
    if A.is_tensor(like):
        import torch

        return torch.int64
    import numpy as np

    return np.int64
