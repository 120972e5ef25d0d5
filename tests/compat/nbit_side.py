"""One side of the differential check of the quantized inference TBE: fbgemm's
``IntNBitTableBatchedEmbeddingBagsCodegen`` (``real``) or embnum's stand-in (``embnum``), built
from the same quantized rows (``weight_lists``), looks up the same batches; every output is saved.

``python nbit_side.py real|embnum CASES_PT OUT_PT`` (each side in its own process).
"""

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
    return [tbe(b["indices"], b["offsets"], b["psw"]).float() for b in case["batches"]]


if __name__ == "__main__":
    side, cases_path, out_path = sys.argv[1:4]
    torch.save([run(side, case) for case in torch.load(cases_path)], out_path)
