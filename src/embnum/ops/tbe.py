"""Declarations of the TBE family: table-batched embedding bags (``docs/families/tbe.md``).

Every op takes the flat layout (``weights``, ``weights_offsets``, ``D_offsets``,
``hash_size_cumsum``), ``indices`` and ``offsets``. The declarations validate
the layout, and check the offsets and indices with ``embnum._tbe_bounds``
(``fatal``/``none``: raise; ``warning``/``ignore``: repair a copy), so every
implementation receives lookups it can read without further checks.

Implementations receive host int64 copies of the three layout arrays, the
rows of each feature's table (``rows``), the batch size ``B`` and ``pooling``
(0 sum, 1 mean, 2 none).
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import _tbe_bounds as bounds
from .. import _tbe_vbe as vbe_map
from .. import _validate as v
from .._cache import BoundedCache
from .._compare import differing, within
from .._registry import check, op
from .._tbe import MEAN, NONE, POOLING_CODES, TBELayout, TBEOptimizer, TBESparseGrad, tbe_layout  # noqa: F401 - re-exported (HELPERS)

HELPERS = ("tbe_layout", "TBELayout", "TBEOptimizer", "TBESparseGrad")

WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
F32 = (np.dtype(np.float32),)


# -- shared checks ---------------------------------------------------------
def pooling_code(value) -> int:
    """``"sum"``/``"mean"``/``"none"`` (any case) or fbgemm's ``PoolingMode`` 0/1/2 -> 0/1/2."""
    return v.choice("pooling_mode", value, POOLING_CODES)


def output_dtype_of(value) -> np.dtype:
    """``"float32"``/``"float16"`` (or the NumPy dtypes) -> np.dtype (``TypeError`` otherwise)."""
    return v.output_dtype(value, WEIGHT_DTYPES)


def _host(a) -> np.ndarray:
    if type(a) is np.ndarray:  # the per-call case
        return a.astype(np.int64)
    return v.to_host(a).astype(np.int64)


def layout(weights, weights_offsets, D_offsets, hash_size_cumsum):
    """Validate the flat layout (``docs/families/tbe.md``); return host int64 copies and the rows of each feature."""
    if type(weights) is not np.ndarray or weights.ndim != 1 or weights.dtype not in WEIGHT_DTYPES:
        v.array("weights", weights, ndim=1, dtypes=WEIGHT_DTYPES)
    key = None
    if type(weights_offsets) is not np.ndarray:  # device arrays: a layout a module trusted reads nothing
        found = _TRUSTED.get(_device_key(weights.shape[0], weights_offsets, D_offsets, hash_size_cumsum))
        if found is not None:
            return found[0].copy(), found[1].copy(), found[2].copy(), found[3].copy()
    if type(weights_offsets) is np.ndarray and type(D_offsets) is np.ndarray and type(hash_size_cumsum) is np.ndarray:
        # Every check below reads exactly these values: the three arrays' dtypes (compared by ==,
        # as index_array compares them: '>i8' is not int64), shapes and bytes (which fix their
        # contents), and len(weights). A cached result can never be stale (an array changed in
        # place has other bytes), and a hit skips the array checks too. The cached arrays are
        # read-only and each call gets copies (a device launch may write its host arguments back).
        key = (
            weights.shape[0],
            weights_offsets.dtype,
            weights_offsets.shape,
            weights_offsets.tobytes(),
            D_offsets.dtype,
            D_offsets.shape,
            D_offsets.tobytes(),
            hash_size_cumsum.dtype,
            hash_size_cumsum.shape,
            hash_size_cumsum.tobytes(),
        )
        found = _LAYOUTS.get(key)
        if found is not None:
            return found[0].copy(), found[1].copy(), found[2].copy(), found[3].copy()
    for name, a in (
        ("weights_offsets", weights_offsets),
        ("D_offsets", D_offsets),
        ("hash_size_cumsum", hash_size_cumsum),
    ):
        v.index_array(name, a)
    T = weights_offsets.shape[0]
    if T < 1:
        raise ValueError("weights_offsets must have at least 1 entry (T >= 1), got 0")
    for name, a in (("D_offsets", D_offsets), ("hash_size_cumsum", hash_size_cumsum)):
        if a.shape[0] != T + 1:
            raise ValueError(f"{name} must have len(weights_offsets) + 1 = {T + 1} entries, got {a.shape[0]}")
    found = _layout_rules(weights, weights_offsets, D_offsets, hash_size_cumsum, T)
    if key is not None:
        kept = tuple(a.copy() for a in found)
        for a in kept:
            a.flags.writeable = False
        _LAYOUTS.put(key, kept)
    return found


_LAYOUTS = BoundedCache(64)  # layouts already validated -> (woff, doff, hcs, rows), read-only
_TRUSTED = BoundedCache(64)  # device layouts -> (woff, doff, hcs, rows, the device arrays kept alive)


def _device_key(W, *arrays) -> tuple:
    """Where the three device arrays are and how they are laid out, and ``len(weights)``: no device read."""
    key = [W]
    for a in arrays:
        ptr = a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]
        key += [type(a), ptr, a.shape, a.strides, a.dtype]
    return tuple(key)


def trust_device_layout(weights, weights_offsets, D_offsets, hash_size_cumsum) -> None:
    """Validate a layout held in device arrays once (reading it back) and remember it by where
    the arrays are, so that the TBE ops called with these very arrays read nothing back: the
    layout stays on the device and its host copies come from here. For a module that owns its
    layout buffers (:class:`embnum.modules.FusedTBE` after ``.cuda()``): the entry keeps the arrays
    alive, so their memory cannot be reused by other data while it is trusted; the owner calls
    this again after writing the buffers (it replaces the entry), as the modules do when a
    buffer's version changes. Raises as the ops do for an invalid layout."""
    key = _device_key(weights.shape[0], weights_offsets, D_offsets, hash_size_cumsum)
    _TRUSTED.drop(key)
    found = layout(weights, weights_offsets, D_offsets, hash_size_cumsum)
    kept = tuple(a.copy() for a in found)
    for a in kept:
        a.flags.writeable = False
    _TRUSTED.put(key, (*kept, (weights_offsets, D_offsets, hash_size_cumsum)))


def _layout_rules(weights, weights_offsets, D_offsets, hash_size_cumsum, T):
    """The layout's rules on host int64 copies; returns ``(woff, doff, hcs, rows)``."""
    woff, doff, hcs = _host(weights_offsets), _host(D_offsets), _host(hash_size_cumsum)
    # comparisons only (a difference of two int64 entries may wrap); sizes below as Python ints
    if doff[0] != 0:
        raise ValueError(f"D_offsets[0] must be 0, got {doff[0]}")
    if (doff[1:] <= doff[:-1]).any():
        t = int(np.argmax(doff[1:] <= doff[:-1]))
        raise ValueError(
            f"D_offsets must grow by >= 1 per feature, but D_offsets[{t + 1}] = {doff[t + 1]}"
            f" <= D_offsets[{t}] = {doff[t]}"
        )
    if hcs[0] != 0:
        raise ValueError(f"hash_size_cumsum[0] must be 0, got {hcs[0]}")
    if (hcs[1:] < hcs[:-1]).any():
        t = int(np.argmax(hcs[1:] < hcs[:-1])) + 1
        raise ValueError(
            f"hash_size_cumsum must be non-decreasing, but hash_size_cumsum[{t}] = {hcs[t]}"
            f" < hash_size_cumsum[{t - 1}] = {hcs[t - 1]}"
        )
    if hcs[T] <= hcs[T - 1]:
        raise ValueError(
            f"hash_size_cumsum[{T}] = {hcs[T]} must exceed hash_size_cumsum[{T - 1}] = {hcs[T - 1]}"
            " (every table has >= 1 row)"
        )
    rows = bounds.rows_per_feature(hcs)  # differences of non-decreasing entries >= 0: no wrap
    W = weights.shape[0]
    wo, dl, rl = woff.tolist(), doff.tolist(), rows.tolist()
    dims = [b - a for a, b in zip(dl[:-1], dl[1:])]
    end = [wo[t] + rl[t] * dims[t] for t in range(T)]  # Python ints: exact
    spans = {}
    for t in range(T):
        if wo[t] < 0 or end[t] > W:
            raise ValueError(
                f"weights_offsets[{t}] = {wo[t]}: table of feature {t} ({rl[t]} rows x {dims[t]}) "
                f"does not fit in weights of length {W}"
            )
        key = int(hcs[t])
        if key in spans:
            t0 = spans[key]
            if wo[t] != wo[t0] or dims[t] != dims[t0]:
                raise ValueError(
                    f"features {t0} and {t} share a table (hash_size_cumsum {key}) but have different "
                    f"weights_offsets ({wo[t0]}, {wo[t]}) or dims ({dims[t0]}, {dims[t]})"
                )
        else:
            spans[key] = t
    firsts = sorted(spans.values(), key=lambda t: wo[t])
    for a, b in zip(firsts[:-1], firsts[1:]):
        if end[a] > wo[b]:
            raise ValueError(
                f"the tables of features {a} and {b} overlap in weights (weights_offsets {wo[a]}, {wo[b]})"
            )
    return woff, doff, hcs, rows


def lookups(indices, offsets, per_sample_weights, rows, pooling, doff, bounds_check_mode, batch_sizes=None):
    """Validate ``indices``/``offsets``/``per_sample_weights`` and the pooling rules; check (or
    repair a copy of) the offsets and the indices. Returns ``(indices, offsets, B, mode, vbe)``:
    with ``batch_sizes`` (``batch_size_per_feature_per_rank``) the offsets come back padded to
    ``B = B_max`` bags per feature and ``vbe`` is their :class:`embnum._tbe_vbe.VBELayout`, else None."""
    T = rows.shape[0]
    v.index_array("indices", indices)
    v.index_array("offsets", offsets)
    mode = bounds.bounds_mode(bounds_check_mode)
    n_bags = offsets.shape[0] - 1
    vbe = None
    if batch_sizes is None:
        if offsets.shape[0] < 1 or n_bags % T:
            raise ValueError(f"len(offsets) - 1 = {n_bags} must be a non-negative multiple of T = {T}")
        B = n_bags // T
    else:
        if offsets.shape[0] < 1:
            raise ValueError("offsets must have at least 1 entry")
        if pooling == NONE:
            raise ValueError(f"{vbe_map.NAME} needs pooling_mode 'sum' or 'mean' (fbgemm has no VBE for 'none')")
        vbe = vbe_map.vbe_layout(batch_sizes, T, n_bags, doff)
        B = vbe.B_max
        if T * B > v.INT32_MAX:
            raise ValueError(
                f"{vbe_map.NAME}: the kernels pad every feature to the largest batch B_max = {B}, and "
                f"T * B_max = {T * B} must be at most 2**31 - 1"
            )
    N = indices.shape[0]
    if N > v.INT32_MAX or n_bags > v.INT32_MAX:  # the fast paths count positions and bags in int32
        raise ValueError(f"len(indices) = {N} and len(offsets) - 1 = {n_bags} must be at most 2**31 - 1")
    if per_sample_weights is not None:
        v.array("per_sample_weights", per_sample_weights, ndim=1, dtypes=F32)
        if per_sample_weights.shape[0] != N:
            raise ValueError(
                f"per_sample_weights must have len(indices) = {N} entries, got {per_sample_weights.shape[0]}"
            )
        if pooling == MEAN:
            raise ValueError(
                "pooling_mode 'mean' with per_sample_weights is not supported (fbgemm has no consistent meaning for it)"
            )
        if pooling == NONE:
            raise ValueError("pooling_mode 'none' takes no per_sample_weights")
    if pooling == NONE and (np.diff(doff) != doff[1]).any():
        raise ValueError(
            f"pooling_mode 'none' needs one embedding dim for every feature, got dims {np.diff(doff).tolist()}"
        )
    if vbe is not None:
        offsets = _pad_offsets(offsets, vbe, N, mode)
    indices, offsets = bounds.check(indices, offsets, B, rows, mode)
    return indices, offsets, B, mode, vbe


def _pad_offsets(offsets, vbe, N, mode):
    """The VBE offsets padded to ``B_max`` bags per feature (a new array of the offsets' module
    and dtype). Where a bad offset raises, the caller's own offsets are checked first, so the
    error names their positions; the repair modes repair the padded copy, which equals padding
    the repaired offsets (every entry is kept, only repeats are added)."""
    if mode == "fatal" or (mode == "none" and type(offsets) is np.ndarray):
        bounds.check_offsets(offsets, N, "fatal")
    index = vbe_map.pad_index(vbe)
    if type(offsets) is not np.ndarray:
        index = v.xp_of(offsets).asarray(index)
    return offsets[index]


def _plan_args(weights, woff, doff, hcs, rows, indices, offsets, B, pooling, psw, vbe=None):
    """The implementations' arguments; ``vbe`` (a ``VBELayout``) only where the call has one."""
    args = dict(
        weights=weights,
        weights_offsets=woff,
        D_offsets=doff,
        hash_size_cumsum=hcs,
        rows=rows,
        indices=indices,
        offsets=offsets,
        B=B,
        pooling=pooling,
        per_sample_weights=psw,
    )
    if vbe is not None:
        args["vbe"] = vbe
    return args


def _grad_output(grad_output, pooling, B, N, doff, vbe=None):
    if vbe is not None:
        v.array("grad_output", grad_output, ndim=1, dtypes=WEIGHT_DTYPES)
        if grad_output.shape[0] != vbe.output_size:
            raise ValueError(
                f"grad_output must have shape ({vbe.output_size},) (the flat VBE output), "
                f"got {tuple(grad_output.shape)}"
            )
        return
    v.array("grad_output", grad_output, ndim=2, dtypes=WEIGHT_DTYPES)
    want = (N, int(doff[1])) if pooling == NONE else (B, int(doff[-1]))
    if tuple(grad_output.shape) != want:
        raise ValueError(f"grad_output must have shape {want}, got {tuple(grad_output.shape)}")


# -- forward ---------------------------------------------------------------
@op("tbe", differentiable=("weights", "per_sample_weights"))
def tbe_forward(
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    *,
    output_dtype="float32",
    bounds_check_mode="fatal",
    batch_size_per_feature_per_rank=None,
):
    """Look up and pool ``T`` features at once from the flat ``weights`` buffer.

    weights: float32/float16 ``[W]``; weights_offsets ``[T]``, D_offsets ``[T+1]``,
    hash_size_cumsum ``[T+1]``: the layout (see :func:`embnum.tbe_layout`);
    indices ``[N]`` and offsets ``[T*B+1]`` int32/int64 (bag ``(t, b)`` is
    ``indices[offsets[t*B+b]:offsets[t*B+b+1]]``); per_sample_weights float32 ``[N]``
    (``"sum"`` only). Output ``[B, total_D]`` (``"sum"``/``"mean"``, an empty bag gives
    0) or ``[N, D]`` (``"none"``; positions outside every bag give 0), in
    ``output_dtype`` (float32 or float16), accumulated in float32.

    batch_size_per_feature_per_rank: variable batch per feature (TorchRec's VBE; ``"sum"`` and
    ``"mean"``): ints ``[T][R]`` >= 0, feature ``t``'s batch on rank ``r``. Feature ``t`` then has
    ``B_t = sum_r B[t][r]`` bags (offsets ``[sum_t B_t + 1]``, feature-major, rank 0's samples
    first) and the output is flat ``[sum_{r,t} B[t][r] * D_t]``: for each rank, for each feature,
    its ``B[t][r] x D_t`` rows (fbgemm's layout).

    Examples
    --------
    >>> lay = embnum.tbe_layout(rows=[3, 2], dims=[2, 3])
    >>> weights = np.arange(lay.num_weights, dtype=np.float32)
    >>> indices, offsets = np.array([0, 2, 1, 1]), np.array([0, 2, 2, 3, 4])  # 2 features x batch of 2
    >>> embnum.tbe_forward(weights, *lay.arrays(), indices, offsets, 'sum')
    array([[ 4.,  6.,  9., 10., 11.],
           [ 0.,  0.,  9., 10., 11.]], dtype=float32)
    >>> # the same bags as VBE on 2 ranks: feature 0 has 1 sample on each, feature 1 both on rank 1
    >>> vbe = [[1, 1], [0, 2]]
    >>> embnum.tbe_forward(weights, *lay.arrays(), indices, offsets, 'sum', batch_size_per_feature_per_rank=vbe)
    array([ 4.,  6.,  0.,  0.,  9., 10., 11.,  9., 10., 11.], dtype=float32)
    """
    woff, doff, hcs, rows = layout(weights, weights_offsets, D_offsets, hash_size_cumsum)
    pooling = pooling_code(pooling_mode)
    indices, offsets, B, mode, vbe = lookups(
        indices, offsets, per_sample_weights, rows, pooling, doff, bounds_check_mode, batch_size_per_feature_per_rank
    )
    dt = output_dtype_of(output_dtype)
    if vbe is not None:
        shape = (vbe.output_size,)
    else:
        shape = (indices.shape[0], int(doff[1])) if pooling == NONE else (B, int(doff[-1]))
    args = _plan_args(weights, woff, doff, hcs, rows, indices, offsets, B, pooling, per_sample_weights, vbe)
    args["output_dtype"] = dt
    return (args, (shape, dt))


class ForwardPlan:
    """:func:`tbe_forward` prepared once for one layout, pooling, output dtype, bounds mode and
    backend, for a module that owns its layout and calls the forward many times: the layout is
    validated here (as every call of the op validates it), and the kernel and the layout's
    arrays are kept, so a call only validates and checks its lookups (:func:`lookups`, as the op)
    and runs the kernel into ``out``. No VBE. ``weights`` at call time must be the array the plan
    was made for (its length and dtype) or one of the same length and dtype."""

    def __init__(
        self,
        weights,
        weights_offsets,
        D_offsets,
        hash_size_cumsum,
        pooling_mode,
        output_dtype,
        bounds_check_mode,
        backend: str,
    ):
        from .._backend import get_backend

        self.woff, self.doff, self.hcs, self.rows = layout(weights, weights_offsets, D_offsets, hash_size_cumsum)
        self.pooling = pooling_code(pooling_mode)
        self.output_dtype = output_dtype_of(output_dtype)
        self.mode = bounds.bounds_mode(bounds_check_mode)
        self.backend = get_backend(backend)
        self.kernel = tbe_forward._load(self.backend)[0]
        self.weights_len, self.weights_dtype = weights.shape[0], weights.dtype
        self.total_D, self.D = int(self.doff[-1]), int(self.doff[1])
        self.T = int(self.rows.shape[0])
        self._array_type = type(self.backend.empty((0,), np.int64))
        # "none" pooling takes one dim for every feature (else every call raises, from lookups())
        self._plain = self.pooling != NONE or bool((np.diff(self.doff) == self.D).all())
        self._args = _plan_args(None, self.woff, self.doff, self.hcs, self.rows, None, None, 0, self.pooling, None)
        self._args["output_dtype"] = self.output_dtype
        self._launch = _prepared_launch(self.backend, self.woff, self.doff, self.rows, self.pooling)
        checks = bounds.compiled_checks()  # (None where Numba is not, or where a test stubs it)
        self._verdict = None if checks is None else checks.tbe_lookups_ok

    def lookups(self, indices, offsets, per_sample_weights):
        """The call's lookups validated and checked as :func:`tbe_forward` does: ``(indices,
        offsets, B)``. Lookups that pass :func:`lookups`' argument rules at a glance (the backend's
        own 1-D index arrays, ``T * B + 1`` offsets, sizes within int32, no per-sample weights, a
        pooling the layout takes) go straight to the bounds check (host arrays to its compiled
        verdict first, looked up once per plan); any other call takes :func:`lookups` whole, which
        names what is wrong."""
        a = self._array_type
        if per_sample_weights is None and type(indices) is a and type(offsets) is a and self._plain:
            n_bags = offsets.shape[0] - 1
            B = n_bags // self.T
            if (
                indices.ndim == 1
                and offsets.ndim == 1
                and n_bags >= 0
                and B * self.T == n_bags
                and indices.dtype in v.INDEX_DTYPES
                and offsets.dtype in v.INDEX_DTYPES
                and indices.shape[0] <= v.INT32_MAX
                and n_bags <= v.INT32_MAX
            ):
                verdict = self._verdict if a is np.ndarray else None  # (bounds.check's, on host lookups)
                if verdict is not None and verdict(indices, offsets, B, self.rows, False):
                    return indices, offsets, B
                indices, offsets = bounds.check(indices, offsets, B, self.rows, self.mode)
                return indices, offsets, B
        indices, offsets, B, _, _ = lookups(
            indices, offsets, per_sample_weights, self.rows, self.pooling, self.doff, self.mode
        )
        return indices, offsets, B

    def shape(self, n_indices: int, B: int) -> tuple[int, int]:
        """The output's shape: ``[B, total_D]`` pooled, ``[N, D]`` for ``"none"``."""
        return (n_indices, self.D) if self.pooling == NONE else (B, self.total_D)

    def run(self, weights, indices, offsets, B, per_sample_weights, out) -> None:
        """The kernel on checked lookups (:meth:`lookups`), writing ``out`` (``shape``, ``output_dtype``)."""
        if self._launch is not None:
            self._launch(weights, indices, offsets, B, per_sample_weights, out)
            return
        args = self._args.copy()
        args["weights"], args["indices"], args["offsets"] = weights, indices, offsets
        args["B"], args["per_sample_weights"] = B, per_sample_weights
        self.backend.run(self.kernel, args, out)


def _prepared_launch(backend, woff, doff, rows, pooling, name="ForwardLaunch", hcs=None):
    """The backend's launch prepared for one layout (its ``ForwardLaunch`` / ``UpdateLaunch``: layout
    tables on the device once), or None where the backend has none (the plan then calls its kernel)."""
    try:
        prepare = backend.kernel("tbe", name)
    except NotImplementedError:
        return None
    return prepare(woff, doff, rows, pooling) if hcs is None else prepare(woff, doff, hcs, rows, pooling)


class UpdatePlan:
    """:func:`tbe_backward_update` prepared once for a :class:`ForwardPlan`'s layout and settings, one
    optimizer and the weights and state arrays a module owns (validated here, as every call of the op
    validates them), for a module whose backward updates the lookups its forward checked: a call
    takes those checked lookups (:meth:`ForwardPlan.lookups`), checks only the gradient, the step and
    that no argument shares memory with an array it writes, and runs the kernel. No VBE."""

    def __init__(self, forward: ForwardPlan, optimizer, weights, momentum1, momentum2):
        if not isinstance(optimizer, TBEOptimizer):
            raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(optimizer).__name__}")
        if weights.shape[0] != forward.weights_len or weights.dtype != forward.weights_dtype:
            raise ValueError("weights must have the length and dtype the forward plan was made for")
        _writable("weights", weights)
        sizes = optimizer.state_sizes(weights.shape[0], int(forward.hcs[-1]))
        _state("momentum1", momentum1, "momentum1" in sizes, weights, sizes.get("momentum1"))
        _state("momentum2", momentum2, "momentum2" in sizes, weights, sizes.get("momentum2"))
        self.written = {"weights": weights, "momentum1": momentum1, "momentum2": momentum2}
        v.no_alias(self.written, tuple(self.written))
        self.forward, self.optimizer, self.backend = forward, optimizer, forward.backend
        self.kernel = tbe_backward_update._load(self.backend)[0]
        f = forward
        self._launch = _prepared_launch(self.backend, f.woff, f.doff, f.rows, f.pooling, "UpdateLaunch", f.hcs)
        self._args = _plan_args(weights, f.woff, f.doff, f.hcs, f.rows, None, None, 0, f.pooling, None)
        self._args.update(optimizer=optimizer, momentum1=momentum1, momentum2=momentum2)

    def run(self, grad_output, indices, offsets, B, per_sample_weights, step) -> None:
        """The update of the checked lookups ``(indices, offsets, B, per_sample_weights)`` from
        ``grad_output`` at ``step`` (as the op: an int >= 1 for the Adam and LAMB kinds, else None),
        in place on the plan's weights and state."""
        f, opt = self.forward, self.optimizer
        _grad_output(grad_output, f.pooling, B, indices.shape[0], f.doff)
        step = _step(opt, step)
        read = {
            "grad_output": grad_output,
            "indices": indices,
            "offsets": offsets,
            "per_sample_weights": per_sample_weights,
        }
        v.no_alias({**read, **self.written}, tuple(self.written))
        w = self.written
        if self._launch is not None:
            args = (grad_output, w["weights"], indices, offsets, B, per_sample_weights, opt)
            self._launch(*args, w["momentum1"], w["momentum2"], step)
            return
        args = self._args.copy()
        args.update(grad_output=grad_output, indices=indices, offsets=offsets, B=B, step=step)
        args["per_sample_weights"] = per_sample_weights
        self.backend.run(self.kernel, args, None)


# -- backward --------------------------------------------------------------
def _backward_plan(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    bounds_check_mode="fatal",
    batch_size_per_feature_per_rank=None,
    **_,
):
    """The plan arguments of every backward op, from the declaration's arguments by name:
    each calls it first, as ``_backward_plan(**locals())`` (its parameters are its only
    locals then); the ones it does not name (an optimizer's) are left to the caller."""
    woff, doff, hcs, rows = layout(weights, weights_offsets, D_offsets, hash_size_cumsum)
    pooling = pooling_code(pooling_mode)
    indices, offsets, B, mode, vbe = lookups(
        indices, offsets, per_sample_weights, rows, pooling, doff, bounds_check_mode, batch_size_per_feature_per_rank
    )
    _grad_output(
        grad_output, pooling, B, indices.shape[0], doff, vbe
    )  # after the bounds check: B may come from offsets
    args = _plan_args(weights, woff, doff, hcs, rows, indices, offsets, B, pooling, per_sample_weights, vbe)
    args["grad_output"] = grad_output
    return args


@op("tbe")
def tbe_backward(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    *,
    bounds_check_mode="fatal",
    batch_size_per_feature_per_rank=None,
):
    """Dense gradient of ``sum(grad_output * tbe_forward(...))`` with respect to ``weights``.

    grad_output: float32/float16 ``[B, total_D]`` (pooled) or ``[N, D]`` (``"none"``); with
    ``batch_size_per_feature_per_rank`` (as in :func:`embnum.tbe_forward`, every backward op takes
    it) the flat VBE output's ``[sum_{r,t} B[t][r] * D_t]``.
    Output float32 ``[W]``, zero outside looked-up rows; every contribution to a
    physical row is summed (duplicates, bags, features sharing the table).

    Examples
    --------
    >>> lay = embnum.tbe_layout(rows=[3, 2], dims=[2, 3])
    >>> weights = np.zeros(lay.num_weights, dtype=np.float32)
    >>> indices, offsets = np.array([0, 2, 1, 1]), np.array([0, 2, 2, 3, 4])
    >>> embnum.tbe_backward(np.ones((2, 5), np.float32), weights, *lay.arrays(), indices, offsets)
    array([1., 1., 0., 0., 1., 1., 0., 0., 0., 2., 2., 2.], dtype=float32)
    """
    args = _backward_plan(**locals())
    return (args, ((weights.shape[0],), np.float32))


@op("tbe", returns="computed")
def tbe_backward_sparse(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    *,
    bounds_check_mode="fatal",
    max_rows=None,
    batch_size_per_feature_per_rank=None,
):
    """Row-wise gradient of the touched rows: ``TBESparseGrad(linear_ids int64 [U] strictly
    increasing, values float32 [value_offsets[U]], value_offsets int64 [U+1])``.

    ``linear_ids[u] = hash_size_cumsum[t] + row``; row ``u``'s summed gradient is
    ``values[value_offsets[u]:value_offsets[u+1]]``. Deterministic (fixed summation order).

    ``max_rows=R`` (an int >= 0; like fbgemm's ``total_unique_indices`` / max sizes) fixes the
    output sizes, so the cuda backend reads nothing back from the device (the number of
    touched rows ``U`` is data-dependent): ``linear_ids [R]`` (the first ``min(U, R)`` rows,
    then ``-1``), ``value_offsets [R+1]`` (after the kept rows it repeats their end, so padded
    rows are empty), ``values [R * max_D]`` (zero past the kept values). Rows beyond ``R``
    (the largest ids) are dropped: pass a bound, e.g. ``len(indices)``.

    Examples
    --------
    >>> lay = embnum.tbe_layout(rows=[3, 2], dims=[2, 3])
    >>> weights = np.zeros(lay.num_weights, dtype=np.float32)
    >>> indices, offsets = np.array([0, 2, 1, 1]), np.array([0, 2, 2, 3, 4])
    >>> g = embnum.tbe_backward_sparse(np.ones((2, 5), np.float32), weights, *lay.arrays(), indices, offsets)
    >>> g.linear_ids, g.value_offsets
    (array([0, 2, 4]), array([0, 2, 4, 7]))
    >>> g.values
    array([1., 1., 1., 1., 2., 2., 2.], dtype=float32)
    """
    return (
        _backward_plan(**locals()) | ({} if max_rows is None else {"max_rows": v.size("max_rows", max_rows)}),
        None,
    )


@op("tbe")
def tbe_grad_per_sample_weights(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    *,
    bounds_check_mode="fatal",
    batch_size_per_feature_per_rank=None,
):
    """Gradient of the ``"sum"``-pooled forward w.r.t. ``per_sample_weights``: float32 ``[N]``,
    ``grad[p] = dot(grad_output[b, cols of t], row(t, indices[p]))``; 0 outside every bag.

    Examples
    --------
    >>> lay = embnum.tbe_layout(rows=[3], dims=[2])
    >>> weights = np.arange(6, dtype=np.float32)
    >>> indices, offsets = np.array([0, 2, 1]), np.array([0, 2, 3])
    >>> embnum.tbe_grad_per_sample_weights(np.ones((2, 2), np.float32), weights, *lay.arrays(), indices, offsets)
    array([1., 9., 5.], dtype=float32)
    """
    args = _backward_plan(**locals())
    return (args, ((indices.shape[0],), np.float32))


# -- fused optimizers --------------------------------------------------------
def _state(name, a, kind_uses, weights, numel):
    if not kind_uses:
        if a is not None:
            raise ValueError(f"{name} must be None for this optimizer kind, got an array")
        return
    if a is None:
        raise ValueError(f"{name} is required for this optimizer kind")
    v.array(name, a, ndim=1)
    if a.shape[0] != numel:
        raise ValueError(f"{name} must have {numel} entries, got {a.shape[0]}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {a.dtype}")
    _writable(name, a)  # memory shared with any other argument: v.no_alias (the registry, for every in-place op)


def _step(optimizer, step):
    """``step`` as the update takes it: an int >= 1 for the kinds that use one, else None."""
    if optimizer.uses_step:
        if step is None:
            raise ValueError(f"step is required for {optimizer.kind} (an int >= 1)")
        return v.integer("step", step, min=1, max=v.INT64_MAX, what=f"an int >= 1 for {optimizer.kind}")
    if step is not None:
        raise ValueError(f"step must be None for {optimizer.kind}, got {step!r}")
    return None


def _writable(name, a):
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (it is updated in place)")
    if not v.writable(a):
        raise ValueError(f"{name} is read-only (it is updated in place)")


@op("tbe", mutates=("weights", "momentum1", "momentum2"))
def tbe_backward_update(
    grad_output,
    weights,
    weights_offsets,
    D_offsets,
    hash_size_cumsum,
    indices,
    offsets,
    pooling_mode="sum",
    per_sample_weights=None,
    *,
    optimizer,
    momentum1=None,
    momentum2=None,
    step=None,
    bounds_check_mode="fatal",
    batch_size_per_feature_per_rank=None,
):
    """Fused backward + optimizer step: update ``weights`` (and the state) in place; returns None.

    optimizer: a :class:`embnum.TBEOptimizer`. State (float32, ``optimizer.state_layout``):
    ``"adagrad"`` momentum1 ``[W]``; ``"rowwise_adagrad"`` momentum1 ``[hash_size_cumsum[T]]``
    (one per physical row, at its linear id); ``"adam"``, ``"lamb"`` momentum1 and momentum2
    ``[W]``; ``"partial_rowwise_adam"``, ``"partial_rowwise_lamb"`` momentum1 ``[W]`` and
    momentum2 ``[hash_size_cumsum[T]]``; ``"lars_sgd"`` momentum1 ``[W]``. The Adam and LAMB
    kinds take ``step`` (int >= 1, this step's 1-based number). Each touched row is
    updated once from its summed gradient; untouched rows are not read or written.
    Everything is validated before anything is written.

    Examples
    --------
    >>> lay = embnum.tbe_layout(rows=[3], dims=[2])
    >>> weights = np.ones(lay.num_weights, dtype=np.float32)
    >>> indices, offsets = np.array([0, 2, 2]), np.array([0, 2, 3])
    >>> grad, sgd = np.ones((2, 2), np.float32), embnum.TBEOptimizer('sgd', 0.5)
    >>> embnum.tbe_backward_update(grad, weights, *lay.arrays(), indices, offsets, optimizer=sgd)
    >>> weights  # rows 0 and 2 stepped by 0.5 per lookup
    array([0.5, 0.5, 1. , 1. , 0. , 0. ], dtype=float32)
    """
    if not isinstance(optimizer, TBEOptimizer):
        raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(optimizer).__name__}")
    args = _backward_plan(**locals())
    _writable("weights", weights)
    sizes = optimizer.state_sizes(weights.shape[0], int(args["hash_size_cumsum"][-1]))
    _state("momentum1", momentum1, "momentum1" in sizes, weights, sizes.get("momentum1"))
    _state("momentum2", momentum2, "momentum2" in sizes, weights, sizes.get("momentum2"))
    step = _step(optimizer, step)
    args.update(optimizer=optimizer, momentum1=momentum1, momentum2=momentum2, step=step)
    return (args, None)


# -- oracle comparisons ----------------------------------------------------
def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def _abs_args(args, *names):
    return {k: (np.abs(a) if k in names and isinstance(a, np.ndarray) else a) for k, a in args.items()}


@check(tbe_forward)
def _forward_close(got, want, args):
    """float32: ``1e-5 * sum_p |w_p| |row_p|`` per element; float16: plus one float16 ulp."""
    bound = _quiet(tbe_forward, **_abs_args(args, "weights", "per_sample_weights"), backend="ref")
    tol = 1e-5 * bound.astype(np.float64) + 1e-30
    if want.dtype == np.float16:
        tol = tol + np.spacing(np.abs(want)).astype(np.float64)
    return within(got, want, tol)


def _grad_bound(args, op_public):
    a = _abs_args(args, "grad_output", "per_sample_weights", "weights")
    return _quiet(op_public, **a, backend="ref")


@check(tbe_backward)
def _backward_close(got, want, args):
    return within(got, want, 1e-5 * _grad_bound(args, tbe_backward).astype(np.float64) + 1e-30)


@check(tbe_grad_per_sample_weights)
def _psw_close(got, want, args):
    return within(got, want, 1e-5 * _grad_bound(args, tbe_grad_per_sample_weights).astype(np.float64) + 1e-30)


@check(tbe_backward_sparse)
def _sparse_close(got, want, args):
    g_ids, g_vals, g_offs = (np.asarray(x) for x in got)
    w_ids, w_vals, w_offs = (np.asarray(x) for x in want)
    for g, w in ((g_ids, w_ids), (g_offs, w_offs)):
        if g.dtype != w.dtype or not np.array_equal(g, w):
            return float("inf"), False
    bound = _grad_bound(args, tbe_backward_sparse).values
    return within(g_vals, w_vals, 1e-5 * bound.astype(np.float64) + 1e-30)


@check(tbe_backward_update)
def _update_close(got, want, args):
    """Weights and state after one step: relative 2e-5 (float32) plus 1e-6 of
    ``max(1, largest value)``; float16 weights: one float16 ulp more."""
    err, ok = 0.0, True
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        floor = 1e-6 * max(1.0, float(np.abs(w).max(initial=0.0)))
        if g.shape == w.shape and g.dtype == w.dtype and w.dtype.kind == "f":
            d = differing(g, w)  # equal bytes match under any tolerance
            g, w = g[d], w[d]
        w64 = w.astype(np.float64)
        tol = 2e-5 * np.abs(w64) + floor
        if w.dtype == np.float16:
            with np.errstate(invalid="ignore"):  # no ulp at inf (NaN tolerance): inf and NaN must match exactly
                tol = tol + np.spacing(np.abs(w)).astype(np.float64)
        e, o = within(g, w, tol)
        err, ok = max(err, e), ok and o
    return err, ok
