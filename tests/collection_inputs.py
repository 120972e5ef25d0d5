"""Inputs the EmbeddingBagCollection tests share (torch): a small collection of tables and KJTs
for it. Imported by ``tests/test_embedding_bag_collection.py`` and ``tests/test_tbe_host_reads.py``."""

from __future__ import annotations

import numpy as np
import torch

import embnum
from embnum.modules import EmbeddingBagConfig


def small_tables():
    """Three tables, two poolings and two dtypes (three TBE calls, one table in the middle
    pooled differently from its neighbours), a table read by two features."""
    return [
        EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t0", feature_names=["f0", "f1"]),
        EmbeddingBagConfig(num_embeddings=7, embedding_dim=3, name="t1", feature_names=["f2"], pooling="mean"),
        EmbeddingBagConfig(num_embeddings=5, embedding_dim=2, name="t2", feature_names=["f3"]),
        EmbeddingBagConfig(num_embeddings=6, embedding_dim=2, name="t3", feature_names=["f4"], data_type="fp16"),
    ]


def random_kjt(rng, tables, B, *, keys=None, weighted=False, extra=True):
    """A KJT for ``tables`` (keys shuffled, plus an unused key) with ids in range."""
    rows = {f: t.num_embeddings for t in tables for f in t.feature_names}
    keys = keys or list(rng.permutation(list(rows))) + (["unused"] if extra else [])
    lengths = rng.integers(0, 4, len(keys) * B)
    vals = [rng.integers(0, rows.get(k, 3), int(lengths[i * B : (i + 1) * B].sum())) for i, k in enumerate(keys)]
    values = torch.from_numpy(np.concatenate(vals).astype(np.int64))
    w = torch.from_numpy(rng.integers(-4, 5, values.shape[0]).astype(np.float32) / 4) if weighted else None
    return embnum.KeyedJaggedTensor.from_lengths_sync(keys, values, torch.from_numpy(lengths), w)
