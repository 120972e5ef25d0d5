"""One side of the differential check of the quantized inference TBE: fbgemm's
``IntNBitTableBatchedEmbeddingBagsCodegen`` (``real``) or embnum's stand-in (``embnum``), built
from the same quantized rows (``weight_lists``), looks up the same batches; every output is saved.
On embnum's side each batch is also looked up by the module's torch.fx trace and by its TorchScript
(saved and loaded), which must give the module's own output bit for bit. On both sides each batch
is then looked up by ``torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function`` called
with the module's buffers as fbgemm's forward calls it (fbgemm's operator, or the stand-in's).

``python nbit_side.py real|embnum CASES_PT OUT_PT`` (each side in its own process).
"""

import io
import sys

import torch


def classes(side):
    if side == "real":
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import EmbeddingLocation, PoolingMode, SparseType
    else:
        from embnum.fbgemm_compat.configs import EmbeddingLocation, PoolingMode, SparseType
        from embnum.fbgemm_compat.inference import IntNBitTableBatchedEmbeddingBagsCodegen
    return IntNBitTableBatchedEmbeddingBagsCodegen, EmbeddingLocation, PoolingMode, SparseType


def run(side, case):
    tbe_cls, loc, pooling, sparse = classes(side)
    specs = [(f"t{i}", r, d, sparse(ty), loc.HOST) for i, (r, d, ty) in enumerate(case["tables"])]
    tbe = tbe_cls(
        specs,
        feature_table_map=case["feature_table_map"],
        pooling_mode=pooling[case["pooling"]],
        device="cpu",
        weight_lists=case["weight_lists"],
        output_dtype=sparse(case["output"]),
        row_alignment=case["row_alignment"],
    )
    outs = [tbe(b["indices"], b["offsets"], b["psw"]) for b in case["batches"]]
    if side == "embnum":
        for other in compiled_forms(tbe):
            for b, out in zip(case["batches"], outs):
                got = other(b["indices"], b["offsets"], b["psw"])
                assert got.dtype == out.dtype and torch.equal(got, out), type(other).__name__
    operator = [lookup_operator(tbe, case, b) for b in case["batches"]]
    return [out.float() for out in outs] + [out.float() for out in operator]


_CODES = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "int2": 4}


def lookup_operator(tbe, case, batch):
    """fbgemm's lookup operator on the module's buffers, with the arguments fbgemm's forward passes."""
    features = [case["tables"][t] for t in case["feature_table_map"]]

    def max_dim(ty):
        return max([d for _, d, t in features if t == ty], default=0)

    return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
        dev_weights=tbe.weights_host,
        uvm_weights=torch.empty(0, dtype=torch.uint8),
        weights_placements=torch.full((len(features),), 3, dtype=torch.int32),  # HOST
        weights_offsets=tbe.weights_offsets,
        weights_tys=tbe.weights_tys,
        D_offsets=tbe.D_offsets,
        total_D=tbe.total_D,
        max_int2_D=max_dim("int2"),
        max_int4_D=max_dim("int4"),
        max_int8_D=max_dim("int8"),
        max_float16_D=max_dim("fp16"),
        max_float32_D=max_dim("fp32"),
        indices=batch["indices"],
        offsets=batch["offsets"],
        pooling_mode={"SUM": 0, "MEAN": 1, "NONE": 2}[case["pooling"]],
        indice_weights=batch["psw"],
        output_dtype=_CODES[case["output"]],
        lxu_cache_weights=torch.empty(0, dtype=torch.uint8),
        lxu_cache_locations=torch.empty(0, dtype=torch.int32),
        row_alignment=case["row_alignment"],
    )


def compiled_forms(tbe):
    """The stand-in's torch.fx trace (one call of embnum's lookup operator) and its TorchScript,
    saved and loaded."""
    traced = torch.fx.symbolic_trace(tbe)
    calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.embnum.tbe_forward_quantized], calls
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(tbe), buffer)
    buffer.seek(0)
    return [traced, torch.jit.load(buffer)]


if __name__ == "__main__":
    side, cases_path, out_path = sys.argv[1:4]
    if side == "embnum":
        from embnum.fbgemm_compat import operators

        operators.register_operators()
    torch.save([run(side, case) for case in torch.load(cases_path)], out_path)
