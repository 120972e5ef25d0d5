"""``ShardedEmbeddingBagCollection``: the single-process EBC's forward, its tables sharded over ranks.

One forward on rank ``r`` (local batch ``B_r``; global batch = the ranks'
batches concatenated in rank order, ``B_g = sum B_r``):

1. **input distribution**: the batch sizes are all-gathered; the local KJT is
   cut into the slots of every destination rank (``permute_2d_sparse_data``
   for table-/column-wise and replicated tables, ``block_bucketize_sparse_features``
   for the row-wise types, one permute putting every slot in destination
   order); lengths go first (``all_to_all_single``), then values, then weights,
   and the received pieces are put key-major for the global batch
   (``permute_1d_sparse_data``);
2. **lookups**: each local :class:`~embnum.modules.FusedTBE` pools its
   shards for the global batch (replicated tables: for the local batch);
3. **output distribution** (one autograd node, so every rank runs the
   collectives in one order, forward and backward): the pooled all-to-all
   sends each source its rows (table-, column-, table-row-wise), the
   reduce-scatter adds the row-wise partial sums; backward sends the
   gradients back the same way (all-to-all, all-gather) and all-gathers the
   replicated tables' output gradient, so each replica applies the same fused
   update for the global batch;
4. the output columns are put in the EBC's order (partial sums of
   table-row-wise shards added, mean of row-wise types divided at the source).

Every rank must call forward and backward the same number of times (as with
any collective). The ranks agree before data moves (:mod:`.agree`): at
construction on the tables, plan, optimizer and codecs (a difference is a
``ValueError`` on every rank), and in each forward on the verdict of each
rank's batch validation (a bad batch is the same error on every rank, and the
group stays usable). A rank that raises later publishes its error and aborts
the group; a rank that dies or hangs is found through the store; either way the
peers raise :class:`~embnum.distributed.launch.RankFailedError` naming it.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from .. import _tbe_bounds, _validate
from .. import torch_bridge as tb
from .._tbe import TBEOptimizer
from .._validate import flag, integer
from ..modules import _state
from ..modules.tbe import FusedTBE, first_out_of_range, out_of_range_text
from . import comm
from .agree import check_settings, describe, gather_batch_sizes
from .launch import collective_error, failure_of, remember_store
from .plan import COLUMN_WISE, DATA_PARALLEL, ShardingPlan, plan_tables
from .sharding import GROUPS, Layout, build_layout


@dataclasses.dataclass
class TableShards:
    """A table as pieces: ``shape`` of the whole table and ``pieces``, a list of
    ``(rows (r0, r1), cols (c0, c1), tensor)``; a 1-D state (row-wise Adagrad) has cols ``(0, 1)``."""

    shape: tuple[int, ...]
    pieces: list


torch.serialization.add_safe_globals([TableShards])  # torch.load(weights_only=True) reads state_dict(gather=False)


def merge_state_dicts(state_dicts) -> dict:
    """One state dict from the sharded state dicts of several ranks (pieces of a table joined)."""
    out = {}
    for sd in state_dicts:
        for k, v in sd.items():
            if isinstance(v, TableShards):
                if k in out:
                    out[k].pieces.extend(v.pieces)
                else:
                    out[k] = TableShards(tuple(v.shape), list(v.pieces))
            else:
                out.setdefault(k, v)
    return out


def _unpack(kjt):
    """``(keys, lengths int64 [T, B], values int64, weights float32 or None, B)`` of a KJT."""
    for m in ("keys", "values", "lengths"):
        if not callable(getattr(kjt, m, None)):
            raise TypeError(f"features must be a KeyedJaggedTensor, got {type(kjt).__name__}")
    if callable(getattr(kjt, "variable_stride_per_key", None)) and kjt.variable_stride_per_key():
        raise ValueError("features: a variable batch per key inside one rank is not supported")
    keys = list(kjt.keys())
    lengths = kjt.lengths().to(torch.int64)
    T = len(keys)
    B = int(kjt.stride()) if T else 0
    if lengths.numel() != T * B:
        raise ValueError(f"features: {lengths.numel()} lengths for {T} keys x stride {B}")
    w = kjt.weights_or_none() if callable(getattr(kjt, "weights_or_none", None)) else None
    values = kjt.values()
    if values.dtype not in (torch.int32, torch.int64):  # a cast would read 1.7 as id 1
        raise TypeError(f"features.values() must hold int32 or int64 ids, got {values.dtype}") from _dtype_cause(values)
    if w is not None and not w.dtype.is_floating_point:
        raise TypeError(f"features.weights() must hold floats, got {w.dtype}")
    return keys, lengths.reshape(T, B), values.to(torch.int64), None if w is None else w.float(), B


def _dtype_cause(values):
    """The error the lookup op gives for these ids as its ``indices`` (its dtype rule on a host copy
    of them; torch's own where the dtype has no NumPy form, as bfloat16)."""
    try:
        _validate.index_array("indices", values.detach().cpu().numpy())
    except (TypeError, ValueError) as err:
        return err
    return None


def _raise_out_of_range(keys, lengths, values, tables):
    """The ``IndexError`` for the first id (in key order) outside its table, naming the key, the
    table and the sample of this rank's batch, raised from the TBE op's own bounds error on the
    batch as it stands (``indices`` = the values, feature ``k`` = ``keys[k]``). ``tables``: key ->
    ``(table name, rows)`` of the keys the collection reads (the others are not checked)."""
    T, B = lengths.shape
    rows = [tables[k][1] if k in tables else 2**62 for k in keys]
    ids, offsets = values.detach().cpu(), _cumsum0(lengths.reshape(-1)).cpu()
    k, sample, bad = first_out_of_range(ids, offsets, rows, list(range(T)))
    plain = IndexError(out_of_range_text(keys[k], tables[keys[k]][0], bad, sample, rows[k]))
    try:
        _tbe_bounds.check_indices(ids.numpy(), offsets.numpy(), B, np.array(rows, dtype=np.int64), "fatal")
    except IndexError as err:
        raise plain from err
    raise plain


def _cumsum0(x):
    c = torch.cumsum(x.to(torch.int64), 0)
    return torch.cat([c.new_zeros(1), c])


_ELEMENTWISE = ("sgd", "adagrad", "adam")  # optimizers without per-row state or norms


class _Holder:
    """Carries the gathered output gradient of replicated tables from the output node to their lookups."""

    grad = None


class _ReplicaLookup(torch.autograd.Function):
    """Forward: the local batch. Backward: the global batch's gradient (gathered by the output
    node) and ids, so every replica applies the same fused update; the per-id weights' gradient
    is computed for the global batch on every replica, and each keeps only its own samples' part."""

    @staticmethod
    def forward(ctx, weights, glob_psw, tbe, holder, cols, local, global_, mine):
        ctx.tbe, ctx.holder, ctx.cols, ctx.global_, ctx.mine = tbe, holder, cols, global_, mine
        ctx.glob_psw = None if glob_psw is None else glob_psw.detach()
        idx, off, psw = local
        with torch.no_grad():
            return tbe(idx, off, psw)

    @staticmethod
    def backward(ctx, grad):
        c0, c1 = ctx.cols
        idx, off = ctx.global_
        psw = ctx.glob_psw
        want = psw is not None and ctx.needs_input_grad[1]
        psw_grad = ctx.tbe.apply_gradient(ctx.holder.grad[:, c0:c1], idx, off, psw, want)
        if psw_grad is not None:
            psw_grad = torch.where(ctx.mine, psw_grad, torch.zeros_like(psw_grad))
        return None, psw_grad, None, None, None, None, None, None


class _WeightsRoute(torch.autograd.Function):
    """The local KJT's per-id weights -> this rank's slots' weights for the global batch (computed by
    the input distribution, passed in ``route``); backward sends each gradient back to the rank and
    position the weight came from (one all-to-all; ids looked up by several shards add up).
    ``anchor`` (requires grad) makes every rank run this backward, after the output node's."""

    @staticmethod
    def forward(ctx, weights, anchor, route):
        glob_w, ctx.route = route[0], route[1:]
        ctx.n = weights.numel()
        return glob_w

    @staticmethod
    def backward(ctx, grad):
        send_pos, glob_idx, sent, received, group = ctx.route
        g = grad.contiguous().float()
        back = torch.zeros(sum(received), dtype=torch.float32, device=g.device).index_put_((glob_idx,), g)
        got = torch.empty(sum(sent), dtype=torch.float32, device=g.device)
        dist.all_to_all_single(got, back, sent, received, group=group)
        comm.BYTES["weights_grad"] += back.numel() * 4
        local = torch.zeros(ctx.n, dtype=torch.float32, device=g.device).index_add_(0, send_pos, got)
        return (local if ctx.needs_input_grad[0] else None), None, None


class _OutputDist(torch.autograd.Function):
    """Pooled all-to-all, reduce-scatter and (backward) the replicas' gradient gather, in one node."""

    @staticmethod
    def forward(ctx, anchor, a2a, rs, dp, meta):
        group, Bs, rank, a2a_cols, codecs, holder, has_rs, has_dp, divide = meta
        ctx.meta = meta
        ctx.anchor = (anchor.shape, anchor.dtype, anchor.device)
        ctx.widths = (a2a.shape[1], rs.shape[1], dp.shape[1])
        fwd = codecs[0]
        blocks = comm.exchange_blocks(
            list(a2a.detach().split(Bs)), [(Bs[rank], c) for c in a2a_cols], group, fwd, "pooled_all_to_all"
        )
        parts = blocks
        if has_rs:
            parts = parts + [comm.reduce_scatter_rows(rs.detach(), Bs, group, fwd)]
        parts = parts + [dp.detach()]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        try:
            return _OutputDist._backward(ctx, grad)
        except Exception as e:
            err = failure_of(e, "backward")
            if err is e:
                raise
            raise err from e

    @staticmethod
    def _backward(ctx, grad):
        group, Bs, rank, a2a_cols, codecs, holder, has_rs, has_dp, divide = ctx.meta
        a2a_width, rs_cols, dp_cols = ctx.widths
        bwd = codecs[1]
        grad = grad.contiguous().float()
        widths = list(a2a_cols) + ([rs_cols] if has_rs else []) + [dp_cols]
        pieces = list(grad.split(widths, dim=1))
        back = comm.exchange_blocks(
            [p.contiguous() for p in pieces[: len(a2a_cols)]],
            [(b, a2a_width) for b in Bs],
            group,
            bwd,
            "pooled_all_to_all_backward",
        )
        g_a2a = torch.cat(back)
        g_rs = None
        if has_rs:
            g_rs = comm.all_gather_rows(pieces[len(a2a_cols)].contiguous(), Bs, group, bwd, "reduce_scatter_backward")
        if has_dp:
            holder.grad = comm.all_gather_rows(pieces[-1].contiguous(), Bs, group, None, "replica_grad_all_gather")
        if divide:  # TorchRec's convention: the tables see the global gradient over the world size
            W = len(Bs)
            g_a2a = g_a2a / W
            g_rs = None if g_rs is None else g_rs / W
            holder.grad = None if holder.grad is None else holder.grad / W
        shape, dtype, device = ctx.anchor  # zeros: the anchor only orders the weights' backward after this node
        anchor = torch.zeros(shape, dtype=dtype, device=device)
        return anchor, g_a2a, g_rs, pieces[-1], None  # the replicas read holder.grad, not this local slice


class ShardedEmbeddingBagCollection(torch.nn.Module):
    """The tables of an ``EmbeddingBagCollection`` sharded over a process group.

    tables: ``EmbeddingBagConfig``-like objects (``name``, ``num_embeddings``, ``embedding_dim``,
    ``feature_names``, ``pooling`` ``"sum"``/``"mean"``), in the EBC's order.
    plan: ``{table name: ParameterSharding}`` or ``None`` (:func:`plan_tables`, printed on rank 0
    when ``verbose``). optimizer: the fused :class:`embnum.TBEOptimizer` (default SGD, lr 0.01);
    column-wise sharding takes only the element-wise optimizers (SGD, Adagrad, Adam): with a per-row
    state or norm (row-wise Adagrad, LAMB, LARS, partial row-wise Adam) each column shard would keep
    its own, so training would differ from the unsharded EBC. qcomm: a
    :class:`~embnum.distributed.comm.QCommsConfig` for the pooled collectives. is_weighted: the
    KJTs carry per-id weights (every rank must agree); their gradient comes back through the module
    (one more all-to-all in backward, run on every rank whenever ``is_weighted``), so KJT weights
    that require grad get ``.grad`` as with the single-process EBC. ``gradient_division``: divide
    the tables' gradient by the world size (TorchRec's convention; default: the plain sum, see
    ``docs/distributed.md``). Initial weights: each table drawn whole from
    ``uniform(+-sqrt(1/rows))`` with a generator seeded by ``(seed, table index)`` and cut, so they do
    not depend on the plan or the world size.

    ``forward(kjt) -> KeyedTensor`` of the local batch: keys = the features in table order,
    values ``[B, sum of dims]``.
    """

    def __init__(
        self,
        tables,
        plan=None,
        process_group=None,
        optimizer: TBEOptimizer | None = None,
        qcomm: comm.QCommsConfig | None = None,
        *,
        is_weighted: bool = False,
        lookups=None,
        seed: int = 0,
        backend: str | None = None,
        verbose: bool = False,
        gradient_division: bool = False,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("ShardedEmbeddingBagCollection needs an initialised torch.distributed process group")
        remember_store()
        self.group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.tbes = torch.nn.ModuleDict()
        self._where = {}  # shard index -> (group, local table, element offset, row offset)
        error, entries = None, None
        try:  # local checks and shard storage; no collective until every rank has a verdict
            self._build(tables, plan, optimizer, qcomm, is_weighted, lookups, backend, verbose, gradient_division)
            entries = describe(
                tables,
                self.plan,
                self.world_size,
                self.optimizer,
                self.codecs,
                is_weighted=self.is_weighted,
                seed=int(seed),
                gradient_division=self.gradient_division,
            )
        except Exception as e:  # noqa: BLE001 - re-raised by check_settings once the peers know
            error = e
        try:
            check_settings(entries, error, process_group, self._collective_device())
        except Exception as e:
            if e is error or not collective_error(e):
                raise
            raise failure_of(e, "construction") from e
        self._init_weights(seed)
        self._holder = _Holder()
        self._anchor = torch.zeros((), requires_grad=True)
        self.timings = None  # a dict to collect seconds per forward phase (the benchmark sets it)

    def _build(self, tables, plan, optimizer, qcomm, is_weighted, lookups, backend, verbose, gradient_division):
        self.optimizer = optimizer if optimizer is not None else TBEOptimizer("sgd", learning_rate=0.01)
        if not isinstance(self.optimizer, TBEOptimizer):
            raise TypeError(f"optimizer must be an embnum.TBEOptimizer, got {type(self.optimizer).__name__}")
        if not isinstance(gradient_division, bool):
            raise TypeError(f"gradient_division must be True or False, got {gradient_division!r}")
        self.gradient_division = gradient_division
        if plan is None:
            plan = plan_tables(tables, self.world_size, lookups=lookups, optimizer=self.optimizer)
            if verbose and self.rank == 0:
                print(plan.table(tables))
        self.plan = plan if isinstance(plan, ShardingPlan) else ShardingPlan(plan, self.world_size)
        self.layout: Layout = build_layout(tables, self.plan, self.world_size)
        if self.optimizer.kind not in _ELEMENTWISE:
            cw = [t.name for t in tables if self.plan[t.name].sharding_type == COLUMN_WISE]
            if cw:
                raise ValueError(
                    f"table {cw[0]!r}: column_wise sharding with {self.optimizer.kind} would compute its per-row "
                    "state or norms per column shard (training would differ from the unsharded EBC); "
                    f"use one of {_ELEMENTWISE}"
                )
        if qcomm is not None and not isinstance(qcomm, comm.QCommsConfig):
            raise TypeError(f"qcomm must be a QCommsConfig or None, got {type(qcomm).__name__}")
        self.codecs = (qcomm or comm.QCommsConfig()).codecs()
        self.is_weighted = bool(is_weighted)
        means = [f.name for f in self.layout.features if f.pooling == "mean"]
        if self.is_weighted and means:
            raise ValueError(f"feature {means[0]!r}: mean pooling with per-id weights is not supported (as in TBE)")
        lay, me = self.layout, self.rank
        for g in GROUPS:
            slots = lay.group_slots(me, g)
            if not slots:
                continue
            order = list(dict.fromkeys(s.shard for s in slots))
            rows = [max(lay.shards[i].nrows, 1) for i in order]  # an empty row block keeps one unread row
            dims = [lay.shards[i].width for i in order]
            ftm = [order.index(s.shard) for s in slots]
            pooling = "mean" if g in ("mean", "dp_mean") else "sum"
            self.tbes[g] = FusedTBE(rows, dims, ftm, optimizer=self.optimizer, pooling_mode=pooling, backend=backend)
            eoff, roff = 0, 0
            for k, si in enumerate(order):
                self._where[si] = (g, k, eoff, roff)
                eoff += rows[k] * dims[k]
                roff += rows[k]

    def _collective_device(self):
        """Where this group's small agreement tensors live (NCCL: the current CUDA device)."""
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _tick(self, name, t0):
        if self.timings is not None:
            t = time.perf_counter()
            self.timings[name] = self.timings.get(name, 0.0) + t - t0
            return t
        return t0

    @property
    def device(self) -> torch.device:
        """Where the shards live (``module.to(device)`` moves them; inputs must be there too)."""
        return next(iter(self.tbes.values())).weights.device if len(self.tbes) else torch.device("cpu")

    # -- shard storage ----------------------------------------------------------------------
    def _views(self, si):
        """``{"weight": [nrows, width], "momentum1": ..., "momentum2": ...}`` views of shard ``si``."""
        g, k, eoff, roff = self._where[si]
        sh = self.layout.shards[si]
        tbe = self.tbes[g]
        R, D = sh.nrows, sh.width
        out = {"weight": tbe.weights.detach()[eoff : eoff + R * D].view(R, D)}
        for name, kind in self.optimizer.state_layout.items():
            state = getattr(tbe, name)
            out[name] = state[roff : roff + R].view(R, 1) if kind == "row" else state[eoff : eoff + R * D].view(R, D)
        return out

    def _my_shards(self):
        return [si for si in self._where]

    def _init_weights(self, seed):
        with torch.no_grad():
            for ti, t in enumerate(self.layout.tables):
                mine = [si for si in self.layout.table_shards(ti) if si in self._where]
                if not mine:
                    continue
                R, D = int(t.num_embeddings), int(t.embedding_dim)
                bound = float(np.sqrt(1.0 / R))
                lo, hi = t.init_range() if callable(getattr(t, "init_range", None)) else (-bound, bound)
                whole = np.random.default_rng([seed, ti]).uniform(lo, hi, (R, D)).astype(np.float32)
                for si in mine:
                    sh = self.layout.shards[si]
                    block = whole[sh.rows[0] : sh.rows[1], sh.cols[0] : sh.cols[1]]
                    self._views(si)["weight"].copy_(torch.from_numpy(np.ascontiguousarray(block)))

    # -- forward ------------------------------------------------------------------------------
    def forward(self, features):
        """``features``: this rank's KJT. Every rank validates its own batch first; the verdicts travel
        with the batch sizes, so a bad batch on any rank raises the same error on every rank (naming
        that rank, the key and the value) before any data moves, and the next good batch trains on all
        ranks. A failure after that point (a peer that died, a local error) ends the step on every
        rank with :class:`~embnum.distributed.launch.RankFailedError` naming the rank."""
        try:
            parsed, error = self._validate(features), None
        except Exception as e:  # noqa: BLE001 - every rank raises it, below
            parsed, error = None, e
        verdict = None
        try:
            Bs, verdict = gather_batch_sizes(
                0 if parsed is None else parsed[-1], error, self.group, self._collective_device()
            )
            if verdict is not None:
                raise verdict
            return self._forward(parsed, Bs)
        except Exception as e:
            if e is verdict:
                raise
            err = failure_of(e, "forward")
            if err is e:
                raise
            raise err from e

    def _validate(self, features):
        """``(pos, lengths, values, weights, B)`` of a valid local batch; else the error naming the key and value."""
        keys, lengths, values, weights, B = _unpack(features)
        if values.device != self.device:
            raise ValueError(f"features are on {values.device}, the shards on {self.device}")
        pos = self._check(keys, lengths, values, weights)
        return pos, lengths, values, weights, B

    def _check(self, keys, lengths, values, weights):
        lay = self.layout
        pos = {k: i for i, k in enumerate(keys)}
        missing = [f.name for f in lay.features if f.name not in pos]
        if missing:
            raise ValueError(f"features lacks key {missing[0]!r}")
        if (weights is not None) != self.is_weighted:
            raise ValueError(
                f"features {'has' if weights is not None else 'lacks'} weights but the "
                f"module was built with is_weighted={self.is_weighted}"
            )
        if lengths.numel() and int(lengths.min()) < 0:
            k, b = (int(i) for i in torch.nonzero(lengths < 0)[0])
            raise ValueError(f"features: key {keys[k]!r} has length {int(lengths[k, b])} at sample {b}")
        if values.numel() != int(lengths.sum()):
            raise ValueError(f"features: {values.numel()} values for lengths summing to {int(lengths.sum())}")
        if weights is not None and weights.numel() != values.numel():
            raise ValueError(f"features: {weights.numel()} weights for {values.numel()} values")
        key_off = _cumsum0(lengths.sum(1)).tolist()
        tables = {f.name: (lay.tables[f.table].name, int(lay.tables[f.table].num_embeddings)) for f in lay.features}
        for f in lay.features:
            i = pos[f.name]
            v = values[key_off[i] : key_off[i + 1]]
            if v.numel() and (int(v.min()) < 0 or int(v.max()) >= tables[f.name][1]):
                _raise_out_of_range(keys, lengths, values, tables)
        return pos

    def _send_buffers(self, pos, lengths, values, weights, B):
        """The local KJT cut into every destination's slots, destination-major."""
        lay, dev = self.layout, values.device
        T = lengths.shape[0]
        parts_l, parts_v, parts_w = [lengths.reshape(-1)], [values], [weights]
        base, call_base = T, []
        for call in lay.calls:
            perm = torch.tensor([pos[lay.features[f].name] for f in call.features], dtype=torch.int64, device=dev)
            l, v, w = tb.permute_2d_sparse_data(perm, lengths, values, weights)
            nl, nv, nw, _, _ = tb.block_bucketize_sparse_features(
                l.reshape(-1),
                v,
                False,
                False,
                torch.tensor(call.block_sizes, dtype=torch.int64, device=dev),
                len(call.ranks),
                weights=w,
            )
            parts_l.append(nl.to(torch.int64))
            parts_v.append(nv.to(torch.int64))
            parts_w.append(nw)
            call_base.append(base)
            base += len(call.ranks) * len(call.features)
        perm = []
        for d in range(self.world_size):
            for s in lay.slots[d]:
                if s.call < 0:
                    perm.append(pos[lay.features[s.feature].name])
                else:
                    call = lay.calls[s.call]
                    j = lay.shards[s.shard].bucket
                    perm.append(call_base[s.call] + j * len(call.features) + call.features.index(s.feature))
        all_l = torch.cat(parts_l).reshape(base, B)
        all_v = torch.cat(parts_v)
        all_w = torch.cat(parts_w) if weights is not None else None
        return tb.permute_2d_sparse_data(torch.tensor(perm, dtype=torch.int64, device=dev), all_l, all_v, all_w)

    def _input_dist(self, pos, lengths, values, weights, B, Bs):
        """-> key-major ``(lengths [S*B_g], values, weights)`` of this rank's slots, global batch."""
        lay, W, me, g, dev = self.layout, self.world_size, self.rank, self.group, values.device
        tracked, weights = weights, None if weights is None else weights.detach()
        send_l, send_v, send_w = self._send_buffers(pos, lengths, values, weights, B)
        S = [len(lay.slots[d]) for d in range(W)]
        Sme = S[me]
        slot_sums = send_l.sum(1)
        slot_off = np.cumsum([0] + S)
        vals_per_dest = [int(slot_sums[slot_off[d] : slot_off[d + 1]].sum()) for d in range(W)]
        recv_l = torch.empty(Sme * sum(Bs), dtype=torch.int64, device=dev)
        dist.all_to_all_single(recv_l, send_l.reshape(-1), [Sme * b for b in Bs], [s * B for s in S], group=g)
        comm.BYTES["input_lengths"] += send_l.numel() * 8
        seg = torch.tensor([b for b in Bs for _ in range(Sme)], dtype=torch.int64, device=dev)
        seg_off = _cumsum0(seg)
        csum = _cumsum0(recv_l)
        vsz = csum[seg_off[1:]] - csum[seg_off[:-1]]
        recv_counts = [int(x) for x in vsz.reshape(W, Sme).sum(1).tolist()] if Sme else [0] * W
        recv_v = torch.empty(sum(recv_counts), dtype=torch.int64, device=dev)
        dist.all_to_all_single(recv_v, send_v, recv_counts, vals_per_dest, group=g)
        comm.BYTES["input_values"] += send_v.numel() * 8
        recv_w = None
        if weights is not None:
            recv_w = torch.empty(sum(recv_counts), dtype=torch.float32, device=dev)
            dist.all_to_all_single(recv_w, send_w.float(), recv_counts, vals_per_dest, group=g)
            comm.BYTES["input_weights"] += send_w.numel() * 4
        perm = torch.tensor([s * Sme + j for j in range(Sme) for s in range(W)], dtype=torch.int64, device=dev)
        _, glob_l, _ = tb.permute_1d_sparse_data(perm, seg, recv_l)
        _, glob_v, glob_w = tb.permute_1d_sparse_data(perm, vsz, recv_v, recv_w)
        if weights is None:
            return glob_l, glob_v, None
        # where each weight went (positions ride through the same permutes as float64 weights: exact
        # below 2**53) and where each global weight was received, for the gradient's way back
        positions = torch.arange(values.numel(), dtype=torch.float64, device=dev)
        send_pos = self._send_buffers(pos, lengths, values, positions, B)[2].to(torch.int64)
        arrived = torch.arange(recv_v.numel(), dtype=torch.int64, device=dev)
        _, glob_idx, _ = tb.permute_1d_sparse_data(perm, vsz, arrived)
        route = (glob_w, send_pos, glob_idx, vals_per_dest, recv_counts, g)
        return glob_l, glob_v, _WeightsRoute.apply(tracked, self._anchor, route)

    def _own_samples(self, offsets, Bs):
        """bool per value of a slot-major KJT of the global batch: whether its sample is this rank's."""
        Bg = sum(Bs)
        bags = offsets.numel() - 1
        sample = torch.arange(bags, device=offsets.device) % max(Bg, 1)
        start = sum(Bs[: self.rank])
        own = (sample >= start) & (sample < start + Bs[self.rank])
        return torch.repeat_interleave(own, offsets[1:] - offsets[:-1])

    def _group_kjt(self, group, lengths, values, weights, B):
        """``(indices, offsets, per_sample_weights)`` of ``group``'s slots in a slot-major KJT."""
        slots = self.layout.slots[self.rank]
        idx = [i for i, s in enumerate(slots) if s.group == group]
        a, b = idx[0], idx[-1] + 1
        off = _cumsum0(lengths)
        v0, v1 = int(off[a * B]), int(off[b * B])
        offs = off[a * B : b * B + 1] - v0
        return values[v0:v1], offs, None if weights is None else weights[v0:v1]

    def _forward(self, parsed, Bs):
        lay, me, W = self.layout, self.rank, self.world_size
        pos, lengths, values, weights, B = parsed
        dev = values.device
        t0 = time.perf_counter()
        Bg = sum(Bs)
        glob_l, glob_v, glob_w = self._input_dist(pos, lengths, values, weights, B, Bs)
        t0 = self._tick("input_dist", t0)
        outs = {}
        for g in ("sum", "mean"):
            if g in self.tbes:
                outs[g] = self.tbes[g](*self._group_kjt(g, glob_l, glob_v, glob_w, Bg))
        dp_parts, col = [], 0
        for g in ("dp_sum", "dp_mean"):
            if g not in self.tbes:
                continue
            slots = lay.group_slots(me, g)
            perm = torch.tensor([pos[lay.features[s.feature].name] for s in slots], dtype=torch.int64, device=dev)
            ll, lv, lw = tb.permute_2d_sparse_data(perm, lengths, values, None if weights is None else weights.detach())
            local = (lv, _cumsum0(ll.reshape(-1)), lw)
            width = sum(lay.slot_width(s) for s in slots)
            tbe = self.tbes[g]
            gidx, goff, gpsw = self._group_kjt(g, glob_l, glob_v, glob_w, Bg)
            mine = None if gpsw is None else self._own_samples(goff, Bs)
            cols = (col, col + width)
            dp_parts.append(_ReplicaLookup.apply(tbe.weights, gpsw, tbe, self._holder, cols, local, (gidx, goff), mine))
            col += width
        t0 = self._tick("lookup", t0)
        a2a_sum = sum(lay.slot_width(s) for s in lay.group_slots(me, "sum") if s.route == "a2a")
        a2a = [outs["sum"][:, :a2a_sum]] if "sum" in outs else []
        if "mean" in outs:
            a2a.append(outs["mean"])
        a2a = torch.cat(a2a, dim=1) if a2a else torch.zeros(Bg, 0, device=dev)
        rs = outs["sum"][:, a2a_sum:] if "sum" in outs else torch.zeros(Bg, 0, device=dev)
        dp = torch.cat(dp_parts, dim=1) if dp_parts else torch.zeros(B, 0, device=dev)
        meta = (
            self.group,
            Bs,
            me,
            [lay.a2a_cols(d) for d in range(W)],
            self.codecs,
            self._holder,
            lay.has("rs"),
            lay.has("dp"),
            self.gradient_division,
        )
        full = _OutputDist.apply(self._anchor if glob_w is None else glob_w, a2a, rs, dp, meta)
        colmap = torch.tensor(lay.column_map(me), dtype=torch.int64, device=dev)
        out = torch.zeros(B, lay.total_dim, dtype=full.dtype, device=dev).index_add(1, colmap, full)
        means = lay.mean_after_sum()
        if means:
            div = torch.ones(B, lay.total_dim, device=dev)
            for fi in means:
                f = lay.features[fi]
                div[:, f.col : f.col + f.dim] = lengths[pos[f.name]].clamp(min=1).to(torch.float32)[:, None]
            out = out / div
        self._tick("output_dist", t0)
        return _keyed_tensor([f.name for f in lay.features], [f.dim for f in lay.features], out)

    # -- checkpoints ----------------------------------------------------------------------------
    def _state_names(self):
        return ["weight"] + list(self.optimizer.states)

    def _key(self, table, name):
        return f"embedding_bags.{table}.weight" if name == "weight" else f"embedding_bags.{table}.{name}"

    def _state_shape(self, t, name):
        R, D = int(t.num_embeddings), int(t.embedding_dim)
        return (R,) if self.optimizer.state_layout.get(name) == "row" else (R, D)

    def _owns(self, si):
        """Whether this rank writes shard ``si`` (a replica is written by its first rank only)."""
        sh = self.layout.shards[si]
        if sh.kind != DATA_PARALLEL:
            return True
        return sh.rank == min(s.rank for s in self.layout.shards if s.table == sh.table)

    def state_dict(self, *, gather: bool = True):
        """Tables and optimizer state under the single-process EBC's names (``embedding_bags.<table>.weight``,
        ``embedding_bags.<table>.momentum1`` / ``momentum2``, ``embedding_bags.<table>.step``), so a
        gathered state dict loads into :class:`embnum.modules.EmbeddingBagCollection` and back.

        ``gather=True`` (a collective: every rank calls it): whole tensors on every rank.
        ``gather=False``: this rank's pieces as :class:`TableShards` (no communication); join the
        ranks' dicts with :func:`merge_state_dicts`.
        """
        lay = self.layout
        step = max((tbe.step for tbe in self.tbes.values()), default=0)
        out = {}
        for ti, t in enumerate(lay.tables):
            mine = [si for si in lay.table_shards(ti) if si in self._where and self._owns(si)]
            for name in self._state_names():
                shape = self._state_shape(t, name)
                pieces = []
                for si in mine:
                    sh = lay.shards[si]
                    v = self._views(si)[name]
                    cols = (0, 1) if len(shape) == 1 else sh.cols
                    pieces.append((sh.rows, cols, v.clone() if len(shape) == 2 else v.reshape(-1).clone()))
                if gather:
                    whole = torch.zeros(shape, device=self.device)
                    for rows, cols, v in pieces:
                        if len(shape) == 1:
                            whole[rows[0] : rows[1]] = v
                        else:
                            whole[rows[0] : rows[1], cols[0] : cols[1]] = v
                    dist.all_reduce(whole, group=self.group)  # each element has one writer: a sum with zeros
                    out[self._key(t.name, name)] = whole
                else:
                    out[self._key(t.name, name)] = TableShards(shape, pieces)
        if gather:
            s = torch.tensor([step], dtype=torch.int64, device=self.device)
            dist.all_reduce(s, op=dist.ReduceOp.MAX, group=self.group)
            step = int(s[0])
        for t in lay.tables:
            out[f"embedding_bags.{t.name}.step"] = torch.tensor(step, dtype=torch.int64)
        return out

    def manifest(self) -> list[tuple[str, int, tuple[int, int], tuple[int, int]]]:
        """Every piece that ``state_dict(gather=False)`` writes on every rank: ``(key, rank, rows, cols)``
        (a 1-D state has cols ``(0, 1)``); the same list on every rank, without communication."""
        lay, out = self.layout, []
        for ti, t in enumerate(lay.tables):
            for si in lay.table_shards(ti):
                if not self._owns(si):
                    continue
                sh = lay.shards[si]
                for name in self._state_names():
                    one_d = len(self._state_shape(t, name)) == 1
                    out.append((self._key(t.name, name), sh.rank, sh.rows, (0, 1) if one_d else sh.cols))
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False) -> LoadReport:
        """Load whole tensors or :class:`TableShards` written under any plan and world size (each
        shard of this rank takes the intersection of every piece). ``strict``: every table, every
        optimizer state and full coverage of each shard are required (``ValueError`` naming the
        state and rows otherwise). ``strict=False`` loads what is there and returns a
        :class:`LoadReport`: the missing keys and, per state, the row ranges of this rank that kept
        their previous values (also a ``UserWarning`` when any).

        Every entry is checked before anything is copied (a ``TypeError``/``ValueError`` naming it,
        the module unchanged): shapes, floating weights and state finite in float32, sums of squares
        (Adagrad's, the second moments) ``>= 0``, steps integers in ``[0, 2**62]``, pieces inside
        their table. ``assign=True`` copies as ``assign=False`` (the shards are views of the flat
        buffers the lookups read)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a Mapping of names to tensors, got {type(state_dict).__name__}")
        strict, _ = flag("strict", strict), flag("assign", assign)
        lay = self.layout
        for ti, t in enumerate(lay.tables):  # every check first: a rejected checkpoint copies nothing
            for name in self._state_names():
                key = self._key(t.name, name)
                if key in state_dict:
                    self._check_entry(key, name, state_dict[key], self._state_shape(t, name))
                elif strict:
                    raise ValueError(f"state_dict lacks {key!r}")
        steps = []
        for t in lay.tables:
            key = f"embedding_bags.{t.name}.step"
            if key in state_dict:
                _state.check_entry(key, "step", state_dict[key], torch.zeros((), dtype=torch.int64), "step")
                steps.append(int(state_dict[key].reshape(-1)[0]))
        missing, unrestored = [], {}
        with torch.no_grad():
            if strict:  # coverage of every shard of this rank, before any copy
                for ti, t in enumerate(lay.tables):
                    for name in self._state_names():
                        key = self._key(t.name, name)
                        one_d = len(self._state_shape(t, name)) == 1
                        for si in lay.table_shards(ti):
                            if si in self._where:
                                self._load_shard(key, si, name, self._as_shards(state_dict[key]), True, one_d, False)
            for ti, t in enumerate(lay.tables):
                for name in self._state_names():
                    key = self._key(t.name, name)
                    if key not in state_dict:
                        missing.append(key)
                        continue
                    value = self._as_shards(state_dict[key])
                    one_d = len(self._state_shape(t, name)) == 1
                    for si in lay.table_shards(ti):
                        if si in self._where:
                            rows = self._load_shard(key, si, name, value, strict, one_d)
                            if rows:
                                unrestored.setdefault(key, []).extend(rows)
            if steps:  # one step for every shard (tables trained together step together)
                for tbe in self.tbes.values():
                    tbe.step = max(steps)
        report = LoadReport(missing, unrestored)
        if missing or unrestored:
            warnings.warn(f"rank {self.rank}: strict=False left state unrestored: {report}", stacklevel=2)
        return report

    def _state_kind(self, name):
        if name == "weight":
            return "weights"
        squares = name == "momentum2" or self.optimizer.kind in ("adagrad", "rowwise_adagrad")
        return "nonneg" if squares else "signed"

    def _check_entry(self, key, name, value, shape):
        """A whole tensor of ``shape``, or :class:`TableShards` of it whose pieces lie inside the table."""
        kind = self._state_kind(name)
        if not isinstance(value, TableShards):
            _state.check_entry(key, name, value, torch.empty(shape), kind)
            return
        if tuple(value.shape) != shape:
            raise ValueError(f"state_dict[{key!r}]: shape {tuple(value.shape)} in the checkpoint, {shape} here")
        if not isinstance(value.pieces, (list, tuple)):
            raise TypeError(f"state_dict[{key!r}].pieces must be a list, got {type(value.pieces).__name__}")
        bounds = (shape[0], 1 if len(shape) == 1 else shape[1])
        for n, piece in enumerate(value.pieces):
            where = f"state_dict[{key!r}].pieces[{n}]"
            if not (isinstance(piece, (list, tuple)) and len(piece) == 3):
                raise TypeError(f"{where} must be ((r0, r1), (c0, c1), tensor), got {piece!r:.100}")
            spans = []
            for axis, (span, top) in enumerate(zip(piece[:2], bounds)):
                what = ("rows", "cols")[axis]
                if not (isinstance(span, (list, tuple)) and len(span) == 2):
                    raise TypeError(f"{where} {what} must be a pair (start, stop), got {span!r}")
                lo = integer(f"{where} {what} start", span[0], min=0, max=top)
                hi = integer(f"{where} {what} stop", span[1], min=lo, max=top)
                spans.append(hi - lo)
            like = torch.empty(spans[0]) if len(shape) == 1 else torch.empty(spans[0], spans[1])
            _state.check_entry(f"{key}.pieces[{n}]", name, piece[2], like, kind)

    @staticmethod
    def _as_shards(value):
        if isinstance(value, torch.Tensor):
            cols = (0, 1) if value.dim() == 1 else (0, value.shape[1])
            return TableShards(tuple(value.shape), [((0, value.shape[0]), cols, value)])
        return value

    def _load_shard(self, key, si, name, value, strict, one_d, copy=True):
        """Copy the pieces' intersection with shard ``si``; returns the global row ranges left uncovered
        (``copy=False``: only find them; with ``strict``, raise naming them)."""
        sh = self.layout.shards[si]
        dst = self._views(si)[name]
        r0, r1 = sh.rows
        c0, c1 = (0, 1) if one_d else sh.cols
        covered = torch.zeros(r1 - r0, c1 - c0, dtype=torch.bool)
        for (pr0, pr1), (pc0, pc1), t in value.pieces:
            a0, a1, b0, b1 = max(r0, pr0), min(r1, pr1), max(c0, pc0), min(c1, pc1)
            if a0 >= a1 or b0 >= b1:
                continue
            if copy:
                src = t.reshape(pr1 - pr0, pc1 - pc0)[a0 - pr0 : a1 - pr0, b0 - pc0 : b1 - pc0]
                dst[a0 - r0 : a1 - r0, b0 - c0 : b1 - c0] = src.to(dst.device, dst.dtype)
            covered[a0 - r0 : a1 - r0, b0 - c0 : b1 - c0] = True
        short = (~covered).any(1).nonzero().reshape(-1).tolist()
        ranges: list[tuple[int, int]] = []
        for i in short:
            if ranges and ranges[-1][1] == r0 + i:
                ranges[-1] = (ranges[-1][0], r0 + i + 1)
            else:
                ranges.append((r0 + i, r0 + i + 1))
        if strict and ranges:
            raise ValueError(
                f"{key}: the checkpoint does not restore rows {_ranges(ranges)} (cols [{c0}, {c1})) of rank {self.rank}"
            )
        return ranges


def _ranges(ranges) -> str:
    return ", ".join(f"[{a}, {b})" for a, b in ranges)


class LoadReport(NamedTuple):
    """What ``load_state_dict(strict=False)`` left as it was: ``missing_keys`` (absent from the
    state dict) and ``unrestored`` (key -> global row ranges ``(r0, r1)`` of this rank's shards
    that no piece covered)."""

    missing_keys: list
    unrestored: dict

    def __str__(self):
        parts = [f"missing {k}" for k in self.missing_keys]
        parts += [f"{k} rows {_ranges(v)}" for k, v in self.unrestored.items()]
        return "; ".join(parts) if parts else "everything restored"


def _keyed_tensor(keys, dims, values):
    from .. import KeyedTensor

    return KeyedTensor(keys=keys, length_per_key=dims, values=values)
