"""Table-batched embedding bags as torch modules, on the bridge's TBE ops.

* :class:`TBE`: the plain autograd module. Its flat weights are an
  ``nn.Parameter`` that receives a dense gradient; use any torch optimizer.
* :class:`FusedTBE`: fbgemm's training semantics. The optimizer runs inside the
  backward pass (``tbe_backward_update``), updating the weights and its state in
  place; the weights never get a ``.grad``.
"""

from __future__ import annotations

import numpy as np
import torch

from .._tbe import TBEOptimizer, tbe_layout
from ..ops.tbe import ForwardPlan, UpdatePlan, output_dtype_of, pooling_code, trust_device_layout
from ..torch_bridge import tbe_backward_update, tbe_forward, tbe_grad_per_sample_weights, to_array
from ..torch_bridge._call import _bump_versions, _watched
from ..torch_bridge._convert import on_torch_stream
from . import _state

_POOLING_NAMES = ("sum", "mean", "none")


def _tensors(**named):
    """Each argument a tensor (or None): a TypeError naming it before autograd sees it."""
    for name, x in named.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def line_aligned_zeros(n: int) -> np.ndarray:
    """float32 zeros ``[n]`` starting on a 64-byte cache line (a module's weights and row state).
    NumPy starts large arrays 16 bytes past a line, so a row of 128 float32 spans nine lines
    instead of eight (the one-thread forward, T=26 x 100K x 128: 60-63 -> 56.5 ms); torch's
    allocator aligns but leaves the pages at 4 KiB, where NumPy's ask for huge pages on Linux
    (fewer TLB misses on random rows). Both wanted: a NumPy buffer, cut at a line."""
    buf = np.zeros(4 * n + 64, dtype=np.uint8)
    first = -buf.ctypes.data % 64
    return buf[first : first + 4 * n].view(np.float32)


def first_out_of_range(indices, offsets, rows, feature_table_map, *, pruned_ok=False):
    """``(feature position, sample, id)`` of the first id outside its table, or ``None`` (also
    when ``indices``/``offsets`` are not integer tensors of the layout, which the op's own error
    then describes). ``offsets``: ``len(feature_table_map) * B + 1`` bag boundaries, feature-major
    (bag ``f * B + sample``); ``rows[t]``: table ``t``'s rows; ``pruned_ok``: ``-1`` (a pruned row,
    which the quantized lookup reads as zeros) is not outside. The modules, the sharded collection
    and the fbgemm stand-in name a bad id with it, each in its own user's terms."""
    if not (isinstance(indices, torch.Tensor) and isinstance(offsets, torch.Tensor)):
        return None
    if indices.dtype not in (torch.int32, torch.int64) or offsets.dtype not in (torch.int32, torch.int64):
        return None
    ids, off = indices.detach().cpu().long().reshape(-1), offsets.detach().cpu().long().reshape(-1)
    n_features = len(feature_table_map)
    if off.numel() < 1 or (off.numel() - 1) % n_features:
        return None
    if off[0] < 0 or off[-1] > ids.numel() or bool((off[1:] < off[:-1]).any()):
        return None
    B = (off.numel() - 1) // n_features
    for f, t in enumerate(feature_table_map):
        bags = off[f * B : (f + 1) * B + 1]
        seg = ids[bags[0] : bags[-1]]
        bad = ((seg < 0) | (seg >= rows[t])) & ~((seg == -1) & pruned_ok)
        bad = bad.nonzero()
        if bad.numel():
            pos = int(bags[0]) + int(bad[0, 0])
            sample = int(torch.searchsorted(bags, pos, right=True)) - 1
            return f, sample, int(ids[pos])
    return None


def out_of_range_text(feature, table, value, sample, rows) -> str:
    """How the modules name an id outside its table: key, table, sample and range."""
    return f"feature {feature!r} (table {table!r}): id {value} at sample {sample} is outside [0, {rows})"


class _Tables(torch.nn.Module):
    """Shared set-up: the layout of ``rows``/``dims``/``feature_table_map`` and the flat weights."""

    weights_offsets: torch.Tensor
    D_offsets: torch.Tensor
    hash_size_cumsum: torch.Tensor

    def __init__(
        self,
        rows,
        dims,
        feature_table_map=None,
        *,
        pooling_mode="sum",
        weights_dtype=torch.float32,
        output_dtype="float32",
        bounds_check_mode="fatal",
        init_scale=None,
        seed=0,
        backend=None,
    ):
        super().__init__()
        lay = tbe_layout(rows, dims, feature_table_map)
        self.rows, self.dims = [int(r) for r in rows], [int(d) for d in dims]
        n_features = lay.D_offsets.shape[0] - 1
        self.feature_table_map = (
            list(range(n_features)) if feature_table_map is None else [int(t) for t in feature_table_map]
        )
        for name, a in zip(("weights_offsets", "D_offsets", "hash_size_cumsum"), lay.arrays()):
            self.register_buffer(name, torch.from_numpy(a.copy()))
        rng = np.random.default_rng(seed)
        flat = line_aligned_zeros(lay.num_weights)
        start = 0
        for r, d in zip(rows, dims):  # fbgemm's default init: uniform(+-sqrt(1/rows)) per table
            bound = init_scale if init_scale is not None else float(np.sqrt(1.0 / r))
            flat[start : start + r * d] = rng.uniform(-bound, bound, r * d)
            start += r * d
        self.weights = torch.nn.Parameter(torch.from_numpy(flat).to(weights_dtype))
        self.pooling_mode = _POOLING_NAMES[pooling_code(pooling_mode)]
        self.output_dtype = str(output_dtype_of(output_dtype))
        self.bounds_check_mode = bounds_check_mode
        self.backend = backend
        self._trusted = None  # (the layout buffers, len(weights), their versions) last trusted on a GPU
        self._call = None  # (what the forward's call was prepared for, its parts, the buffers): see forward_call

    def layout(self):
        """The three layout buffers. On a GPU they stay there: the first call (and the first after a
        buffer is replaced or written, which its version shows) validates them once and has the ops
        trust them (``embnum.ops.tbe.trust_device_layout``), so no call reads them back."""
        bufs = (self.weights_offsets, self.D_offsets, self.hash_size_cumsum)
        if not bufs[0].is_cpu:
            seen = (*bufs, self.weights.shape[0], *(b._version for b in bufs))
            last = self._trusted
            if (
                last is None
                or len(last) != len(seen)
                or any(a is not b for a, b in zip(last[:3], bufs))
                or last[3:] != seen[3:]
            ):
                w = to_array(self.weights.detach())
                trust_device_layout(w, *(to_array(b) for b in bufs))
                self._trusted = seen
        return bufs

    def forward_call(self, weights):
        """What a planned forward on ``weights`` needs: ``(plan, the weights' array view, the
        output's torch dtype)``, or ``None`` where the call takes the op's generic path (the
        ``"ref"`` backend, or weights on a device the backend does not take). ``plan``: the forward
        prepared for this module's layout and settings (``embnum.ops.tbe.ForwardPlan``: layout
        validated and, on a GPU, trusted once; kernel chosen; the backend's launch prepared); the
        view: ``torch_bridge.to_array`` of the weights (on a GPU a DLPack export per call saved).
        One key, tested once per call: the layout buffers and their versions, where and how the
        weights are stored (pointer, shape, strides, dtype, device) and the settings; on a miss all
        three are made again. (A plan kept apart from the weights' pointer would only be reused when
        the weights move to other memory of the same length and dtype with the layout unchanged,
        which training in place never does.)"""
        b = self._buffers  # the three layout buffers, read past nn.Module's attribute lookup
        wo, do, hc = b["weights_offsets"], b["D_offsets"], b["hash_size_cumsum"]
        seen = (
            id(wo),
            id(do),
            id(hc),
            wo._version,
            do._version,
            hc._version,
            weights.data_ptr(),
            weights.shape,
            weights.stride(),
            weights.dtype,
            weights.is_cuda,
            self.backend,
            self.pooling_mode,
            self.output_dtype,
            self.bounds_check_mode,
        )
        kept = self._call
        if kept is not None and kept[0] == seen:
            return kept[1]
        found = self._prepare_call(weights)
        self._call = (seen, found, (wo, do, hc))  # (the entry holds the buffers: their ids stay theirs)
        return found

    def _prepare_call(self, weights):
        """:meth:`forward_call`'s parts made afresh (on its cache miss)."""
        backend = self.backend if self.backend is not None else ("cuda" if weights.is_cuda else "cpu")
        if backend == "ref" or (weights.is_cuda != (backend == "cuda") and not _cuda_takes_host_arrays()):
            return None
        bufs = self.layout()  # on a GPU: trusted once here, so the plan reads nothing back
        w = to_array(weights.detach())
        layout = (to_array(x) for x in bufs)
        plan = ForwardPlan(w, *layout, self.pooling_mode, self.output_dtype, self.bounds_check_mode, backend)
        return plan, w, _OUT_DTYPES[plan.output_dtype]

    def out_of_range_error(self, err, indices, offsets, features=None, tables=None):
        """The error to raise in the user's terms when the lookup of ``(indices, offsets)`` failed
        with ``err`` because an id lies outside its table: an ``IndexError`` naming the feature, its
        table, the sample and the table's range (``features``, ``tables``: the caller's names for the
        feature positions and the tables, the positions themselves by default). ``None`` when no id
        is out of range (``err`` then stands as it is). The caller raises it ``from err``."""
        where = first_out_of_range(indices, offsets, self.rows, self.feature_table_map)
        if where is None:
            return None
        f, sample, value = where
        t = self.feature_table_map[f]
        feature = f if features is None else features[f]
        table = t if tables is None else tables[t]
        return IndexError(out_of_range_text(feature, table, value, sample, self.rows[t]))

    # -- checkpoints: checked before anything is copied (embnum.modules._state) ----------
    def _state_rules(self) -> dict:
        rules = {"weights": (self.weights, "weights")}
        rules.update({n: (getattr(self, n), "layout") for n in ("weights_offsets", "D_offsets", "hash_size_cumsum")})
        return rules

    def _load_from_state_dict(self, state_dict, prefix, *args):
        _state.check(state_dict, prefix, self._state_rules())
        _state.load_without_assign(_Tables, self, state_dict, prefix, *args)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """torch's, after checking every entry (shape, dtype, finite values, state in its domain,
        the layout unchanged): ``TypeError``/``ValueError`` naming the entry, nothing copied.
        ``assign=True`` copies too (the module keeps its own tensors)."""
        _state.check_keys(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def extra_repr(self) -> str:
        """One line per table (rows x dim, the features that read it), then the settings."""
        lines = [
            f"table {i}: {r} x {d}, features {[t for t, m in enumerate(self.feature_table_map) if m == i]}"
            for i, (r, d) in enumerate(zip(self.rows, self.dims))
        ]
        settings = (
            f"pooling_mode={self.pooling_mode!r}, weights_dtype={self.weights.dtype}, "
            f"output_dtype={self.output_dtype!r}, bounds_check_mode={self.bounds_check_mode!r}"
        )
        if self.backend is not None:
            settings += f", backend={self.backend!r}"
        return "\n".join([*lines, settings])


class TBE(_Tables):
    """Table-batched embedding bags with plain autograd: ``forward(indices, offsets,
    per_sample_weights=None) -> [B, total_D]`` (``[N, D]`` for ``"none"``); ``weights.grad``
    is the dense float gradient, for any torch optimizer."""

    def forward(self, indices, offsets, per_sample_weights=None):

        try:
            return tbe_forward(
                self.weights,
                *self.layout(),
                indices,
                offsets,
                self.pooling_mode,
                per_sample_weights,
                output_dtype=self.output_dtype,
                bounds_check_mode=self.bounds_check_mode,
                backend=self.backend,
            )
        except IndexError as err:
            plain = self.out_of_range_error(err, indices, offsets)
            if plain is None:
                raise
            raise plain from err


class _FusedLookup(torch.autograd.Function):
    # ``call``: ``(module, indices, offsets)`` as one argument. Only ``weights`` and
    # ``per_sample_weights`` take a gradient, and each further argument costs ``apply`` a check
    # per call (a tuple is one).
    @staticmethod
    def forward(ctx, weights, per_sample_weights, call):
        module, indices, offsets = call
        ctx.module = module
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        planned = _planned_forward(module, weights, indices, offsets, per_sample_weights)
        ctx.checked = None if planned is None else planned[1]
        if planned is not None:
            return planned[0]
        return tbe_forward(
            weights.detach(),
            *module.layout(),
            indices,
            offsets,
            module.pooling_mode,
            None if per_sample_weights is None else per_sample_weights.detach(),
            output_dtype=module.output_dtype,
            bounds_check_mode=module.bounds_check_mode,
            backend=module.backend,
        )

    @staticmethod
    def backward(ctx, grad):
        indices, offsets, psw = ctx.saved_tensors  # (torch checks that none was written since)
        want = psw is not None and ctx.needs_input_grad[1]
        if ctx.checked is not None and not want and ctx.module.planned_update(grad, ctx.checked):
            return None, None, None
        psw_grad = ctx.module.apply_gradient(grad, indices, offsets, psw, want)
        return None, psw_grad, None


_transforms_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_apply_fused = torch._C._FunctionBase.__dict__["apply"].__get__(None, _FusedLookup)


def fused_lookup(weights, per_sample_weights, module, indices, offsets):
    """``_FusedLookup.apply(...)`` (the module's autograd lookup) without torch's generic Python
    wrapper of ``Function.apply`` (its default-argument binding test and the tuple it rebuilds
    around each argument): what that wrapper then calls, with each tensor unwrapped as it unwraps
    it. Under a functorch transform, the wrapper itself."""
    if _transforms_active():
        return _FusedLookup.apply(weights, per_sample_weights, (module, indices, offsets))
    psw = None if per_sample_weights is None else _unwrap_if_dead(per_sample_weights)
    return _apply_fused(_unwrap_if_dead(weights), psw, (module, _unwrap_if_dead(indices), _unwrap_if_dead(offsets)))


def _cuda_takes_host_arrays() -> bool:
    """Whether the cuda backend runs on host arrays here (Numba's CUDA simulator)."""
    from .._backend import cuda_simulated

    return cuda_simulated()


_INDEX_DTYPES = (torch.int32, torch.int64)
_OUT_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}


def _planned_forward(module, weights, indices, offsets, psw):
    """The forward through the module's :meth:`_Tables.forward_call`: the lookups validated and
    checked as the op does, the output from torch's allocator, one array view of each per-call
    tensor, the kernel called directly (no argument binding, backend choice or layout check per
    call). Returns the output and the checked lookups ``(plan, indices, offsets, B,
    per_sample_weights)`` (arrays) for the backward's update (:meth:`FusedTBE.planned_update`);
    ``None`` where the op's generic path must take the call: something watches the dispatcher
    (tracing, a mode, the profiler), a tensor is not a plain tensor on the weights' device, or of a
    dtype the op rejects (its error then names it)."""

    cpu = weights.is_cpu
    if (
        type(indices) is not torch.Tensor
        or type(offsets) is not torch.Tensor
        or indices.dtype not in _INDEX_DTYPES
        or offsets.dtype not in _INDEX_DTYPES
        or not (indices.is_cpu and offsets.is_cpu if cpu else indices.device == offsets.device == weights.device)
        or (
            psw is not None
            and (type(psw) is not torch.Tensor or psw.device != weights.device or psw.dtype != torch.float32)
        )
        or _watched()
    ):
        return None
    if cpu:
        return _run_planned(module, weights, indices, offsets, psw)
    with on_torch_stream((weights,)):  # (a plan made here holds its device tables in torch's memory)
        return _run_planned(module, weights, indices, offsets, psw)


def _run_planned(module, weights, indices, offsets, psw):
    """:func:`_planned_forward` once its tensors passed (on torch's stream on a GPU)."""
    call = module.forward_call(weights)
    if call is None:
        return None
    plan, w, out_dtype = call
    p = None if psw is None else to_array(psw)
    # (integer tensors never need a gradient: to_array's detach is not needed for them)
    ids, off, B = plan.lookups(
        indices.numpy() if indices.is_cpu else to_array(indices),
        offsets.numpy() if offsets.is_cpu else to_array(offsets),
        p,
    )
    # (the sizes apart, not as a tuple: torch parses them faster)
    out = torch.empty(*plan.shape(ids.shape[0], B), dtype=out_dtype, device=weights.device)
    plan.run(w, ids, off, B, p, out.numpy() if out.is_cpu else to_array(out))
    return out, (plan, ids, off, B, p)


class FusedTBE(_Tables):
    """Table-batched embedding bags trained as fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen``:
    the backward pass applies ``optimizer`` (a :class:`embnum.TBEOptimizer`) to the touched rows
    in place. State: ``momentum1``/``momentum2`` buffers laid out as ``optimizer.state_layout``
    says, and the step counter, the int64 buffer ``iter`` (fbgemm's name; :attr:`step` reads it
    as an int): an update runs with ``step + 1`` (Adam's first step is 1), and the counter
    moves once the update is done (a rejected call leaves it). Every piece of state
    is in ``state_dict()``, so a module restored with ``load_state_dict`` resumes training
    exactly where the saved one stopped.
    """

    momentum1: torch.Tensor | None
    momentum2: torch.Tensor | None
    iter: torch.Tensor

    def __init__(self, rows, dims, feature_table_map=None, *, optimizer: TBEOptimizer, **kw):
        super().__init__(rows, dims, feature_table_map, **kw)
        if not isinstance(optimizer, TBEOptimizer):
            raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        sizes = optimizer.state_sizes(self.weights.shape[0], int(self.hash_size_cumsum[-1]))
        for name in ("momentum1", "momentum2"):
            self.register_buffer(name, torch.from_numpy(line_aligned_zeros(sizes[name])) if name in sizes else None)
        self.register_buffer("iter", torch.zeros((), dtype=torch.int64))
        self._steps = StepCount(self.iter, 0)
        self._update = None  # (what the update plan was made for, the plan): see update_plan

    def _state_rules(self) -> dict:
        rules = super()._state_rules()
        for name in ("momentum1", "momentum2"):
            buf = getattr(self, name)
            if buf is not None:
                squares = name == "momentum2" or self.optimizer.kind in ("adagrad", "rowwise_adagrad")
                rules[name] = (buf, "nonneg" if squares else "signed")
        rules["iter"] = (self.iter, "step")
        return rules

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (the ``iter`` buffer; see :class:`StepCount`)."""
        return self._steps.read(self.iter)

    @step.setter
    def step(self, value: int):
        self._steps.write(self.iter, value)

    def _count_step(self) -> None:
        self._steps.advance(self.iter)

    def forward(self, indices, offsets, per_sample_weights=None):
        if type(indices) is not torch.Tensor or type(offsets) is not torch.Tensor or per_sample_weights is not None:
            _tensors(indices=indices, offsets=offsets, per_sample_weights=per_sample_weights)
        try:  # (the weights read past nn.Module's __getattr__, which a failed attribute lookup costs)
            return fused_lookup(self._parameters["weights"], per_sample_weights, self, indices, offsets)
        except IndexError as err:
            plain = self.out_of_range_error(err, indices, offsets)
            if plain is None:
                raise
            raise plain from err

    def update_plan(self, forward):
        """The fused update prepared for the forward plan ``forward`` (``embnum.ops.tbe.UpdatePlan``:
        optimizer, weights and state validated once, their array views kept), made again when the
        forward plan, the optimizer, or where and how the weights or a state buffer is stored changed;
        ``None`` unless ``forward`` is the module's current forward plan."""
        kept = self._call
        if kept is None or kept[1] is None or kept[1][0] is not forward:
            return None
        tensors = (self.weights, self.momentum1, self.momentum2)
        seen = [forward, self.optimizer]
        for x in tensors:  # where and how each is stored (its device: the forward plan's, or another pointer)
            seen += (None,) if x is None else (x.data_ptr(), x.shape, x.stride(), x.dtype)
        found = self._update
        if found is None or found[0] != seen:
            arrays = [None if x is None else to_array(x.detach()) for x in tensors]
            found = self._update = (seen, UpdatePlan(forward, self.optimizer, *arrays))
        return found[1]

    def planned_update(self, grad, checked) -> bool:
        """The backward's optimizer step through :meth:`update_plan`, on the lookups the planned
        forward checked (``checked``: what ``_planned_forward`` returned beside its output), as
        :meth:`apply_gradient` without a ``per_sample_weights`` gradient; False (nothing done) where
        it cannot take the call (the generic path then does)."""
        plan_f, ids, off, B, p = checked
        w = self.weights
        if type(grad) is not torch.Tensor or grad.device != w.device or _watched():
            return False
        g = grad if grad.dtype == torch.float32 and grad.is_contiguous() else grad.contiguous().float()
        opt = self.optimizer
        if opt.max_gradient is not None:
            g = g.clamp(-opt.max_gradient, opt.max_gradient)
        step = self.step + 1 if opt.uses_step else None
        with on_torch_stream((w,)):  # (a plan made here holds its device tables in torch's memory)
            plan = self.update_plan(plan_f)
            if plan is None:
                return False
            plan.run(to_array(g), ids, off, B, p, step)
        _bump_versions(tuple(x for x in (w, self.momentum1, self.momentum2) if x is not None))
        self._count_step()
        return True

    def apply_gradient(self, grad, indices, offsets, per_sample_weights=None, want_psw_grad=False):
        """The backward pass's optimizer step for the output gradient ``grad`` ``[B, total_D]`` of the
        lookups ``(indices, offsets, per_sample_weights)``: clip, ``step += 1``, update the weights and
        state in place. Returns the gradient of ``per_sample_weights`` when ``want_psw_grad`` (computed
        before the update, from the clipped gradient, as fbgemm), else ``None``. Sharded modules call it
        with gradients gathered from other ranks."""
        psw_grad = fused_update(
            grad,
            self.weights,
            self.layout(),
            indices,
            offsets,
            self.pooling_mode,
            per_sample_weights,
            want_psw_grad,
            self.optimizer,
            (self.momentum1, self.momentum2),
            self.step + 1,
            self.bounds_check_mode,
            self.backend,
        )
        self._count_step()  # once the update is done: a rejected call changes nothing
        return psw_grad

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}\noptimizer={self.optimizer!r}, step={self.step}"


class StepCount:
    """The host copy of a one-element int64 step counter that lives on a device buffer, so that
    reading the step costs no device-to-host copy: the copy follows the owner's own increments
    (:meth:`advance`) and is read again from the buffer only the first time after the buffer
    was replaced or written from elsewhere (``load_state_dict``, ``.to()``, an in-place write),
    which the buffer's identity and version show."""

    def __init__(self, buf: torch.Tensor, count: int):
        self._seen: tuple | None = (buf, buf._version, count)

    def read(self, buf: torch.Tensor) -> int:
        seen = self._seen
        if seen is None or seen[0] is not buf or seen[1] != buf._version:
            seen = self._seen = (buf, buf._version, int(buf.reshape(())))
        return seen[2]

    def write(self, buf: torch.Tensor, value: int) -> None:
        buf.fill_(int(value))
        self._seen = (buf, buf._version, int(value))

    def advance(self, buf: torch.Tensor) -> None:
        """``buf += 1`` on its device (nothing read back)."""
        seen = self._seen
        current = seen is not None and seen[0] is buf and seen[1] == buf._version
        if (
            buf.is_cpu and buf.dtype == torch.int64 and not (buf.requires_grad or buf.is_inference())
        ):  # add_ minus dispatch
            count = buf.numpy()
            count += 1
            _bump_versions((buf,))
        else:
            buf.add_(1)
        self._seen = (buf, buf._version, seen[2] + 1) if current and seen is not None else None


def fused_update(
    grad,
    weights,
    layout,
    indices,
    offsets,
    pooling,
    psw,
    want_psw_grad,
    optimizer,
    state,
    step,
    bounds,
    backend=None,
    batch_sizes=None,
):
    """One fused optimizer step of the lookups ``(indices, offsets, psw)`` from the output gradient
    ``grad`` ``[B, total_D]`` (flat with ``batch_sizes``, VBE's ``batch_size_per_feature_per_rank``):
    clip to ``optimizer.max_gradient``, the gradient of ``psw`` when ``want_psw_grad`` (from the
    clipped gradient, before the update, as fbgemm), then
    ``tbe_backward_update`` in place on ``weights`` and ``state = (momentum1, momentum2)`` at ``step``
    (the step being taken). Returns the ``psw`` gradient or ``None``. :class:`FusedTBE` and the
    fbgemm stand-in's training module share it; each keeps its own step counter."""

    g = grad.contiguous().float()
    if optimizer.max_gradient is not None:
        g = g.clamp(-optimizer.max_gradient, optimizer.max_gradient)
    psw_grad = None
    if psw is not None and want_psw_grad:
        psw_grad = tbe_grad_per_sample_weights(
            g,
            weights.detach(),
            *layout,
            indices,
            offsets,
            bounds_check_mode=bounds,
            batch_size_per_feature_per_rank=batch_sizes,
            backend=backend,
        )
    with torch.no_grad():
        tbe_backward_update(
            g,
            weights.detach(),
            *layout,
            indices,
            offsets,
            pooling,
            None if psw is None else psw.detach(),
            optimizer=optimizer,
            momentum1=state[0],
            momentum2=state[1],
            step=step if optimizer.uses_step else None,
            bounds_check_mode=bounds,
            batch_size_per_feature_per_rank=batch_sizes,
            backend=backend,
        )
    return psw_grad
