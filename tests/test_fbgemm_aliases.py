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
        schemas = {n: str(getattr(torch.ops.fbgemm, n).default._schema) for n in ALIASES}
        try:
            tb.register_fbgemm_aliases()
            refused = None
        except RuntimeError as e:
            refused = str(e)
        print(json.dumps({"schemas": schemas, "refused": refused}))
        """
    )
    result = json.loads(out.strip().splitlines()[-1])
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    for name, (schema, _, _) in ALIASES.items():
        assert result["schemas"][name] == f"fbgemm::{name}{schema}"
    assert result["refused"] and "fbgemm_gpu is loaded" in result["refused"]
