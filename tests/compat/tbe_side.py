"""One side of the differential check of the training TBE: build fbgemm's class (``real``) or
embnum's stand-in (``embnum``) from a JSON configuration, run a forward pass and three training
steps, save every output, the split weights and the optimizer states with ``torch.save``.

``python tbe_side.py real|embnum CASES_JSON OUT_PT`` (each side in its own process: the two
cannot share one). Each case holds the tables, the optimizer and its hyper-parameters, the
initial weights and the batches, so both sides see the same numbers; the output is one record
per case.
"""

import json
import sys

import torch


def classes(side):
    if side == "real":
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            EmbeddingLocation,
            PoolingMode,
            SparseType,
            SplitTableBatchedEmbeddingBagsCodegen,
            WeightDecayMode,
        )
    else:
        from embnum.fbgemm_compat.configs import (
            ComputeDevice,
            EmbeddingLocation,
            EmbOptimType,
            PoolingMode,
            SparseType,
            WeightDecayMode,
        )
        from embnum.fbgemm_compat.training import SplitTableBatchedEmbeddingBagsCodegen
    return (
        SplitTableBatchedEmbeddingBagsCodegen,
        EmbOptimType,
        EmbeddingLocation,
        ComputeDevice,
        PoolingMode,
        WeightDecayMode,
        SparseType,
    )


def run(side, config):
    tbe_cls, opt, loc, dev, pooling, decay, sparse_type = classes(side)
    specs = [(r, d, loc.HOST, dev.CPU) for r, d in zip(config["rows"], config["dims"])]
    hyper = dict(config["hyper"])
    if "weight_decay_mode" in hyper:  # JSON holds its code; fbgemm reads the enum's .value
        hyper["weight_decay_mode"] = decay(hyper["weight_decay_mode"])
    if "weights_precision" in hyper:  # JSON holds the SparseType's name
        hyper["weights_precision"] = sparse_type[hyper["weights_precision"]]
    tbe = tbe_cls(
        specs,
        feature_table_map=config["feature_table_map"],
        optimizer=opt[config["optimizer"]],
        pooling_mode=pooling[config["pooling"]],
        **hyper,
    )
    with torch.no_grad():
        for w, init in zip(tbe.split_embedding_weights(), config["weights"]):
            w.copy_(torch.tensor(init, dtype=torch.float32))
    out = {"outputs": []}
    for batch in config["batches"]:
        indices = torch.tensor(batch["indices"], dtype=torch.int64)
        offsets = torch.tensor(batch["offsets"], dtype=torch.int64)
        psw = None if batch["psw"] is None else torch.tensor(batch["psw"], dtype=torch.float32)
        vbe = batch.get("vbe")  # batch_size_per_feature_per_rank (TorchRec's VBE), if the case has one
        y = (
            tbe(indices, offsets, psw)
            if vbe is None
            else tbe(indices, offsets, psw, batch_size_per_feature_per_rank=vbe)
        )
        out["outputs"].append(y.detach().clone())
        (y * torch.tensor(batch["grad_scale"], dtype=torch.float32).view(y.shape)).sum().backward()
    out["weights"] = [w.clone() for w in tbe.split_embedding_weights()]
    out["states"] = [{k: v.clone() for k, v in d.items()} for d in tbe.get_optimizer_state()]
    return out


if __name__ == "__main__":
    side, cases_path, out_path = sys.argv[1:4]
    with open(cases_path) as f:
        torch.save([run(side, case) for case in json.load(f)], out_path)
