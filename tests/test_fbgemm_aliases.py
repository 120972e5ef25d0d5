"""embnum.torch_bridge.register_fbgemm_aliases(): torch.ops.fbgemm.<name> with fbgemm's schemas, on embnum.

Each check runs in a fresh subprocess: one that never imports fbgemm_gpu (the aliases are
registered there and compared with embnum's own ops, gradients and torch.compile included),
and (fbgemm tier) one that loads fbgemm_gpu first: its real schemas must equal the table,
and registering must be refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=_ENV, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_aliases_without_fbgemm():
    out = _run(
        """
        import sys, json, torch
        from embnum import torch_bridge as tb
        from embnum.torch_bridge.fbgemm_aliases import ALIASES
        names = tb.register_fbgemm_aliases()
        assert tb.register_fbgemm_aliases() == names  # idempotent
        f = torch.ops.fbgemm
        schemas = {n: str(getattr(f, n).default._schema) for n in names}
        bad = {n: s for n, s in schemas.items() if s != "fbgemm::" + n + ALIASES[n][0]}
        assert not bad, bad

        g = torch.Generator().manual_seed(0)
        perm = torch.tensor([2, 0, 0], dtype=torch.int32)
        lengths = torch.randint(0, 3, (3, 4), generator=g)
        n = int(lengths.sum())
        v = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.rand(n, dtype=torch.float64, generator=g)
        got = f.permute_2D_sparse_data(perm, lengths, v, w)
        want = tb.permute_2d_sparse_data(perm, lengths, v, w)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert torch.equal(f.permute_sparse_data(perm, lengths, v, w)[1], want[1])
        got1d = f.permute_2D_sparse_data_input1D(perm, lengths.view(-1), v, 4, w)
        assert torch.equal(got1d[0], want[0].view(-1)) and torch.equal(got1d[1], want[1])
        (gv,) = torch.autograd.grad(got[1].sum(), v)
        (wv,) = torch.autograd.grad(want[1].sum(), v)
        assert torch.equal(gv, wv)
        seg = torch.tensor([3, 0, 1, 2])
        l4 = lengths.view(-1)[:4]
        v4 = v[: int(l4.sum())]
        assert torch.equal(f.permute_1D_sparse_data(seg, l4, v4)[1], tb.permute_1d_sparse_data(seg, l4, v4)[1])

        ids = torch.randint(0, 40, (n,), generator=g)
        args = (lengths.view(-1), ids, True, True, torch.tensor([5, 7, 9]), 3, w)
        assert all((a is None and b is None) or torch.equal(a, b)
                   for a, b in zip(f.block_bucketize_sparse_features(*args), tb.block_bucketize_sparse_features(*args)))
        offs = f.asynchronous_complete_cumsum(lengths.view(-1))
        assert torch.equal(offs, tb.complete_cumsum(lengths.view(-1)))
        dense = f.jagged_to_padded_dense(v, [offs], [3], -1.0)
        assert torch.equal(dense, tb.jagged_to_padded_dense(v, [offs], [3], -1.0))
        back, back_offs = f.dense_to_jagged(dense.unsqueeze(-1), [offs])
        assert torch.equal(back_offs[0], offs) and back.shape == (n, 1)
        x = torch.randn(4, 16, generator=g)
        assert torch.equal(f.FloatToFused8BitRowwiseQuantized(x), tb.float_to_fused_8bit_rowwise(x))
        embs = [torch.randn(2, 3, generator=g), torch.randn(2, 2, generator=g)]
        keys, widths, groups = [["a", "b"], ["c"]], [[1, 2], [2]], [["c", "a"], ["a"]]
        assert all(torch.equal(a, b) for a, b in zip(f.regroup_keyed_tensor(embs, keys, widths, groups),
                                                     tb.regroup_keyed_tensor(embs, keys, widths, groups)))
        flat, picks = torch.randn(12, generator=g, requires_grad=True), torch.tensor([2, 0, 1, 1])
        got = f.batch_index_select_dim0(  # keywords, as TorchRec calls it
            inputs=flat, indices=picks, input_num_indices=[2, 2], input_rows=[3, 2], input_columns=[2, 3],
            permute_output_dim_0_1=True,
        )
        assert torch.equal(got, tb.batch_index_select_dim0(flat, picks, [2, 2], [3, 2], [2, 3], True))
        (gf,) = torch.autograd.grad(got.sum(), flat)
        assert gf.tolist() == [1, 1, 0, 0, 1, 1, 0, 0, 0, 2, 2, 2]
        grouped = f.group_index_select_dim0([flat.view(4, 3), embs[0]], [picks, picks[2:]])
        assert torch.equal(grouped[0], flat.view(4, 3)[picks]) and torch.equal(grouped[1], embs[0][[1, 1]])
        step = torch.compile(lambda v: f.permute_2D_sparse_data(perm, lengths, v)[1].sum(), fullgraph=True)
        assert torch.allclose(step(v.detach()), want[1].sum())
        print(json.dumps({"n": len(names), "fbgemm_gpu_loaded": "fbgemm_gpu" in sys.modules}))
        """
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"n": result["n"], "fbgemm_gpu_loaded": False} and result["n"] >= 30


@pytest.mark.fbgemm
def test_schemas_are_fbgemms_and_registering_beside_fbgemm_is_refused():
    pytest.importorskip("fbgemm_gpu")
    out = _run(
        """
        import json, torch, fbgemm_gpu  # noqa: F401
        from embnum import torch_bridge as tb
        from embnum.torch_bridge.fbgemm_aliases import ALIASES
        from embnum.fbgemm_compat.unavailable import OPERATORS
        from embnum.fbgemm_compat.operators import NAME
        names = [*ALIASES, *OPERATORS, NAME]
        schemas = {n: str(getattr(torch.ops.fbgemm, n).default._schema) for n in names}
        try:
            tb.register_fbgemm_aliases()
            refused = None
        except RuntimeError as e:
            refused = str(e)
        print(json.dumps({"schemas": schemas, "refused": refused}))
        """
    )
    result = json.loads(out.strip().splitlines()[-1])
    from embnum.fbgemm_compat.unavailable import OPERATORS
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    for name, (schema, *_) in [*ALIASES.items(), *OPERATORS.items()]:
        assert result["schemas"][name] == f"fbgemm::{name}{schema}"
    assert result["refused"] and "fbgemm_gpu is loaded" in result["refused"]


# -- the aliases with no embnum op behind them (docs/coming-from-fbgemm.md, bridge-only aliases) ----------
_BRIDGE_ONLY_CASES = """
import torch
f, cpu = torch.ops.fbgemm, torch.device("cpu")
g = torch.Generator().manual_seed(SEED)
B, dims = int(torch.randint(0, 5, (1,), generator=g)), torch.randint(1, 6, (4,), generator=g).tolist()
dtype = [torch.float32, torch.float16, torch.float64][SEED % 3]
embs = [torch.randn(B, d, generator=g).to(dtype) for d in dims]
x = torch.randn(1 + SEED % 7, 8 * (1 + SEED % 3), generator=g)
results = {
    "merge_dim1": f.merge_pooled_embeddings(embs, B, cpu, 1),
    "merge_dim0": f.merge_pooled_embeddings([e.t().contiguous() for e in embs], B, cpu, 0),
    "merge_dim_neg1": f.merge_pooled_embeddings(embs, B, cpu, -1),
    "sum_reduce": f.sum_reduce_to_one([e[:, :1] * (i + 1) for i, e in enumerate(embs)], cpu),
    "sum_reduce_one": f.sum_reduce_to_one(embs[:1], cpu),
    "all_to_one": f.all_to_one_device(embs, cpu),
    "is_uvm": torch.tensor(f.is_uvm_tensor(embs[0])),
    "nbit4": f.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x, 4),
    "nbit2_half": f.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x.half(), 2),
    "nbit8": f.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x, 8),
    "q8": f.FloatOrHalfToFused8BitRowwiseQuantized(x),
    "q8_half": f.FloatOrHalfToFused8BitRowwiseQuantized(x.half()),
}
offs = torch.tensor([0] + dims).cumsum(0)
perm = torch.randperm(len(dims), generator=g)
inv = torch.argsort(perm)
inv_offs = torch.tensor([0] + [dims[p] for p in perm.tolist()]).cumsum(0)
pooled = torch.cat(embs, dim=1).float()
for name in ("permute_pooled_embs_split", "permute_pooled_embs_auto_grad_split", "permute_pooled_embs_auto_grad"):
    results[name] = getattr(f, name)(pooled, offs, perm, inv_offs, inv)
# as TorchRec's KeyedJaggedTensorPool calls it: [n, 1] values, int64 inclusive offsets, spare rows after the segments
seg = torch.randint(0, 4, (2 + SEED % 5,), generator=g)
ends = seg.cumsum(0)
pick = torch.randint(0, len(seg), (1 + SEED % 6,), generator=g)
out_ends = seg[pick].cumsum(0)
stored = torch.randint(-(2**40), 2**40, (int(ends[-1]) + SEED % 3, 1 + SEED % 2), generator=g)
stored = stored.to([torch.int64, torch.float32, torch.float16, torch.int32][SEED % 4])
results["jagged_select"] = f.jagged_index_select_2d_forward_v2(stored, pick, ends, out_ends)
results["jagged_select_int32_indices"] = f.jagged_index_select_2d_forward_v2(stored, pick.int(), ends, out_ends)
half = int(out_ends[-1]) // 2
results["jagged_select_rows"] = f.jagged_index_select_2d_forward_v2(stored, pick, ends, out_ends, half)
"""


def _bridge_only_results(tmp_path, with_fbgemm: bool, seeds):
    path = tmp_path / f"results_{int(with_fbgemm)}.pt"
    setup = (
        "import fbgemm_gpu  # noqa: F401"
        if with_fbgemm
        else "from embnum import torch_bridge as tb\ntb.register_fbgemm_aliases()"
    )
    body = "\n".join(
        ["import torch", setup, "out = {}"]
        + [f"SEED = {s}\n{_BRIDGE_ONLY_CASES}\nout[{s}] = results" for s in seeds]
        + [f"torch.save(out, {str(path)!r})"]
    )
    _run(body)
    import torch

    return torch.load(path)


def _same(a, b):
    import torch

    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.fbgemm
def test_bridge_only_and_quant_aliases_equal_fbgemm(tmp_path):
    """merge_pooled_embeddings, sum_reduce_to_one, all_to_one_device, is_uvm_tensor, the FloatOrHalf
    quantizers, the permute_pooled_embs variants and jagged_index_select_2d_forward_v2: fbgemm's CPU
    operators in one process, the aliases in another, on seeded inputs, equal bit for bit (the sum is
    added left to right in both)."""
    pytest.importorskip("fbgemm_gpu")
    seeds = range(12)
    want = _bridge_only_results(tmp_path, True, seeds)
    got = _bridge_only_results(tmp_path, False, seeds)
    for s in seeds:
        for case, w in want[s].items():
            assert _same(got[s][case], w), (s, case)


def test_bridge_only_aliases_check_their_arguments():
    out = _run(
        """
        import json, torch
        from embnum import torch_bridge as tb
        tb.register_fbgemm_aliases()
        f, cpu = torch.ops.fbgemm, torch.device("cpu")
        a, b = torch.randn(3, 2, requires_grad=True), torch.randn(3, 4)
        before = (a.detach().clone(), b.clone())
        errors = []
        for call in (
            lambda: f.merge_pooled_embeddings([], 3, cpu),
            lambda: f.merge_pooled_embeddings([a, b.t()], 3, cpu, 1),
            lambda: f.merge_pooled_embeddings([a, b.double()], 3, cpu, 1),
            lambda: f.merge_pooled_embeddings([a, b], 3, cpu, 2),
            lambda: f.merge_pooled_embeddings([a.view(-1)], 6, cpu, 0),
            lambda: f.sum_reduce_to_one([], cpu),
            lambda: f.sum_reduce_to_one([a, b], cpu),
            lambda: f.sum_reduce_to_one([b, b.half()], cpu),
        ):
            try:
                call()
                errors.append(None)
            except (ValueError, TypeError) as e:
                errors.append([type(e).__name__, str(e)])
        unchanged = torch.equal(a.detach(), before[0]) and torch.equal(b, before[1])
        merged = f.merge_pooled_embeddings([a, b], 3, cpu, 1)
        (ga,) = torch.autograd.grad(merged.sum() + f.sum_reduce_to_one([a, a], cpu).sum(), a)
        moved = f.all_to_one_device([a, b], cpu)
        print(json.dumps({
            "errors": errors, "unchanged": unchanged, "grad": ga.tolist(),
            "same_object": moved[1].data_ptr() == b.data_ptr(), "uvm": f.is_uvm_tensor(a),
        }))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["unchanged"] and r["same_object"] and r["uvm"] is False
    assert r["grad"] == [[3.0, 3.0]] * 3
    want = [
        ("ValueError", "pooled_embeddings must hold at least one tensor"),
        ("ValueError", "pooled_embeddings[1] has 4 in dimension 0, not uncat_dim_size = 3"),
        ("TypeError", "pooled_embeddings[1] is torch.float64"),
        ("ValueError", "cat_dim must be 0 or 1"),
        ("ValueError", "pooled_embeddings[0] must be 2-D"),
        ("ValueError", "input_tensors must hold at least one tensor"),
        ("ValueError", "input_tensors[1] has shape (3, 4)"),
        ("TypeError", "input_tensors[1] is torch.float16"),
    ]
    for got, (kind, words) in zip(r["errors"], want):
        assert got is not None and got[0] == kind and words in got[1], (got, kind, words)
