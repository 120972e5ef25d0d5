"""permute_multi_embedding forward + backward through torch autograd, beside fbgemm and the raw ops.

    python benchmarks/bench_autograd.py [--B 2048 16384] [--rounds 11] [--phases]

The classic keyed-tensor case (``embnum.examples.keyed_tensor.classic_case``, float32).
Contenders, interleaved round by round in one process (``_bench.interleaved``):

* ``bridge``: ``embnum.torch_bridge.permute_multi_embedding`` on tensors that
  require grad, then ``torch.autograd.backward(outputs, grads)``;
* ``fbgemm``: the same with ``torch.ops.fbgemm.permute_multi_embedding``;
* ``raw``: ``embnum.permute_multi_embedding`` + ``embnum.permute_multi_embedding_backward``
  on the NumPy arrays (the floor the bridge adds to), with autograd's lifetimes: the
  forward's outputs live until the backward has run, the gradients until the next call
  begins (as ``x.grad`` does);
* ``raw, freed early``: the same two calls, each result dropped at once (the forward's
  outputs are freed before the backward allocates, so at B=2048 the backward writes into
  memory that is still in cache: a floor no training step has, shown for comparison).

Every contender has its own leaf tensors: a call's ``x.grad = None`` then frees its own
previous gradients, never a peer's (fbgemm's are torch allocations on 4 KiB pages, whose
unmapping would otherwise be timed in the next contender's call). Outputs are fresh
arrays/tensors on every side (no ``out=``).

Targets: bridge at least 5x faster than fbgemm, within 1.5x of raw.

``--phases`` (no fbgemm): where the bridge's time goes, per step of the call path, all
with autograd's lifetimes: ``raw``; ``direct`` (the bridge's two ops without grad: tensor
conversion, no dispatcher); ``dispatcher`` (the same through ``torch.ops.embnum``);
``eager autograd`` (``embnum.torch_bridge.permute_multi_embedding`` + ``torch.autograd.backward``:
the bridge's own autograd.Function); ``registered autograd`` (``torch.ops.embnum`` +
``torch.autograd.backward``: torch.library's autograd, what torch.compile and modes see).
A B below 100 takes the classic case's small widths (the per-call cost without the kernels).
Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _bench  # noqa: E402
import embnum  # noqa: E402
from embnum.examples.keyed_tensor import classic_case  # noqa: E402


def case(B, torch, tb, fb):
    rng = np.random.default_rng(B)
    embs, keys, lengths, groups = classic_case(rng, B)
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    in_lengths = ins.tolist()
    grads = [rng.standard_normal((B, w)).astype(np.float32) for w in ol]
    gt = [torch.from_numpy(g) for g in grads]
    pt, it, ot = (torch.from_numpy(a) for a in (perm, ins, outs))

    def through_autograd(forward):
        xt = [torch.from_numpy(e.copy()).requires_grad_() for e in embs]  # this contender's own leaves

        def run():
            for x in xt:
                x.grad = None
            torch.autograd.backward(forward(xt, pt, it, ot, ol), gt)

        return run

    held = []

    def raw():
        held.clear()  # the previous call's gradients, as ``x.grad = None``
        outputs = embnum.permute_multi_embedding(embs, perm, ins, outs, ol)
        held.append(embnum.permute_multi_embedding_backward(grads, perm, ins, outs, in_lengths))
        del outputs

    def raw_freed_early():
        embnum.permute_multi_embedding(embs, perm, ins, outs, ol)
        embnum.permute_multi_embedding_backward(grads, perm, ins, outs, in_lengths)

    fns = {"bridge": through_autograd(tb.permute_multi_embedding), "raw": raw, "raw, freed early": raw_freed_early}
    if fb is not None:
        fns["fbgemm"] = through_autograd(fb.permute_multi_embedding)
    return fns


def phases(B, torch, tb):
    rng = np.random.default_rng(B)
    embs, keys, lengths, groups = classic_case(rng, B, small=B < 100)
    perm, ins, outs, ol = embnum.kt_regroup_arguments(None, keys, lengths, groups)
    in_lengths = ins.tolist()
    grads = [rng.standard_normal((B, w)).astype(np.float32) for w in ol]
    gt = [torch.from_numpy(g) for g in grads]
    xn = [torch.from_numpy(e) for e in embs]
    pt, it, ot = (torch.from_numpy(a) for a in (perm, ins, outs))
    held = []

    def pair(forward, backward, *args):
        def run():
            held.clear()
            outputs = forward(*args[0])
            held.append(backward(*args[1]))
            del outputs

        return run

    def through_autograd(forward):
        xt = [torch.from_numpy(e.copy()).requires_grad_() for e in embs]

        def run():
            for x in xt:
                x.grad = None
            torch.autograd.backward(forward(xt, pt, it, ot, ol), gt)

        return run

    ops = torch.ops.embnum
    tensors = ((xn, pt, it, ot, ol), (gt, pt, it, ot, in_lengths))
    return {
        "raw": pair(
            embnum.permute_multi_embedding,
            embnum.permute_multi_embedding_backward,
            (embs, perm, ins, outs, ol),
            (grads, perm, ins, outs, in_lengths),
        ),
        "direct": pair(tb.permute_multi_embedding, tb.permute_multi_embedding_backward, *tensors),
        "dispatcher": pair(ops.permute_multi_embedding, ops.permute_multi_embedding_backward, *tensors),
        "eager autograd": through_autograd(tb.permute_multi_embedding),
        "registered autograd": through_autograd(ops.permute_multi_embedding),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, nargs="+", default=[2048, 16384])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--phases", action="store_true", help="time the bridge's call path step by step (no fbgemm)")
    a = p.parse_args()
    torch = _bench.optional_torch()
    if torch is None:
        sys.exit("needs torch")
    from embnum import torch_bridge as tb

    fb = _bench.optional_fbgemm(torch)
    print(_bench.machine())
    print(f"- before: {_bench.load()}")
    rows = []
    if a.phases:
        names = ["raw", "direct", "dispatcher", "eager autograd", "registered autograd"]
        for B in a.B:
            ms = _bench.interleaved(phases(B, torch, tb), rounds=a.rounds, block_s=0.05)
            row = {"B": B, **{k: f"{m.median * 1e3:.3f} [{m.iqr * 1e3:.3f}]" for k, m in ms.items()}}
            row.update({f"{k} / raw": f"{ms[k].median / ms['raw'].median:.2f}" for k in names[1:]})
            rows.append(row)
        print(f"- after: {_bench.load()}")
        print("\nforward + backward, ms: median [IQR]\n")
        print(_bench.table(rows, ["B", *names, *(f"{k} / raw" for k in names[1:])]))
        return
    for B in a.B:
        ms = _bench.interleaved(case(B, torch, tb, fb), rounds=a.rounds, block_s=0.05)
        row = {"B": B, **{k: f"{m.median * 1e3:.3f} [{m.iqr * 1e3:.3f}]" for k, m in ms.items()}}
        row["bridge / raw"] = f"{ms['bridge'].median / ms['raw'].median:.2f}"
        row["bridge / raw, freed early"] = f"{ms['bridge'].median / ms['raw, freed early'].median:.2f}"
        if "fbgemm" in ms:
            row["fbgemm / bridge"] = f"{ms['fbgemm'].median / ms['bridge'].median:.2f}x"
        rows.append(row)
    print(f"- after: {_bench.load()}")
    print("\nforward + backward, ms: median [IQR]\n")
    print(
        _bench.table(
            rows,
            [
                "B",
                "bridge",
                "fbgemm",
                "raw",
                "raw, freed early",
                "fbgemm / bridge",
                "bridge / raw",
                "bridge / raw, freed early",
            ],
        )
    )


if __name__ == "__main__":
    main()
