"""KJT family: embnum's backends beside fbgemm_gpu's CPU ops (and torch), in one run.

    python benchmarks/bench_kjt.py [--backend ref] [--backend cpu] [--backend cuda]

Prints the machine, the load before and after, then a markdown table: milliseconds per
call, median [IQR] over ``--rounds`` rounds in which every contender of a row runs in turn
in this process (``_bench.interleaved``, torch.utils.benchmark): a burst of load from other
processes hits every column alike. The headline cases are the issue's: a KJT with T=26 keys,
B=4096, bag lengths Poisson(20) (about 2.1M int64 ids, int32 lengths), hash
size 1e6 per key; ``block_bucketize_sparse_features`` with my_size=8 and
sequence=True, and ``permute_2d_sparse_data`` with a random key permutation
on the same data. "copy floor" is a plain NumPy copy of the bytes the op must
read and write. Ratios use the cpu backend (or the last one asked for).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _bench import Case, default_backends, optional_fbgemm, optional_torch, report, run_cases  # noqa: E402


def cases(rng):
    """The headline cases (:class:`_bench.Case`), fbgemm's op and a torch composition beside them."""
    torch = optional_torch()
    fb = optional_fbgemm(torch)
    T, B, my_size, H = 26, 4096, 8, 1_000_000
    lengths = rng.poisson(20, T * B).astype(np.int32)
    N = int(lengths.sum())
    ids = rng.integers(0, H, N)
    weights = rng.random(N, dtype=np.float32)
    block_sizes = np.full(T, -(-H // my_size), np.int64)
    perm = rng.permutation(T)
    lengths2d = lengths.reshape(T, B)
    bag_perm = rng.permutation(T * B)
    t = {}
    if torch:
        t = {
            k: torch.from_numpy(v)
            for k, v in dict(
                lengths=lengths,
                ids=ids,
                weights=weights,
                block_sizes=block_sizes,
                perm32=perm.astype(np.int32),
                lengths2d=lengths2d,
                bag_perm32=bag_perm.astype(np.int32),
                perm=perm,
                bag_perm=bag_perm,
            ).items()
        }
        key_sizes = lengths2d.sum(axis=1).tolist()
    label = f"T={T} B={B} len~P(20) N={N}"
    bb = dict(
        lengths=lengths, indices=ids, bucketize_pos=False, sequence=True, block_sizes=block_sizes, my_size=my_size
    )
    idx_bytes = ids.nbytes
    yield Case(
        "block_bucketize_sparse_features",
        label + " my_size=8 seq",
        bb,
        lengths.nbytes + idx_bytes,
        my_size * lengths.nbytes + 2 * idx_bytes,
        fb
        and (
            lambda: fb.block_bucketize_sparse_features(
                t["lengths"], t["ids"], False, True, t["block_sizes"], my_size, None
            )
        ),
        None,
    )
    yield Case(
        "block_bucketize_sparse_features",
        label + " my_size=8 seq pos w",
        dict(bb, bucketize_pos=True, weights=weights),
        lengths.nbytes + idx_bytes + weights.nbytes,
        my_size * lengths.nbytes + 3 * idx_bytes + weights.nbytes,
        fb
        and (
            lambda: fb.block_bucketize_sparse_features(
                t["lengths"], t["ids"], True, True, t["block_sizes"], my_size, t["weights"]
            )
        ),
        None,
    )

    def torch_permute(with_w):
        vs = torch.split(t["ids"], key_sizes)
        out = (t["lengths2d"][t["perm"]], torch.cat([vs[p] for p in perm]))
        if with_w:
            ws = torch.split(t["weights"], key_sizes)
            out += (torch.cat([ws[p] for p in perm]),)
        return out

    yield Case(
        "permute_2d_sparse_data",
        label + " random perm",
        dict(permute=perm, lengths=lengths2d, values=ids),
        lengths.nbytes + idx_bytes,
        lengths.nbytes + idx_bytes,
        fb and (lambda: fb.permute_2D_sparse_data(t["perm32"], t["lengths2d"], t["ids"], None, N)),
        torch and (lambda: torch_permute(False)),
    )
    yield Case(
        "permute_2d_sparse_data",
        label + " random perm, weights",
        dict(permute=perm, lengths=lengths2d, values=ids, weights=weights, permuted_lengths_sum=N),
        lengths.nbytes + idx_bytes + weights.nbytes,
        lengths.nbytes + idx_bytes + weights.nbytes,
        fb and (lambda: fb.permute_2D_sparse_data(t["perm32"], t["lengths2d"], t["ids"], t["weights"], N)),
        torch and (lambda: torch_permute(True)),
    )
    yield Case(
        "permute_1d_sparse_data",
        f"{T * B} bags, random bag perm, weights",
        dict(permute=bag_perm, lengths=lengths, values=ids, weights=weights),
        lengths.nbytes + idx_bytes + weights.nbytes,
        lengths.nbytes + idx_bytes + weights.nbytes,
        fb and (lambda: fb.permute_1D_sparse_data(t["bag_perm32"], t["lengths"], t["ids"], t["weights"], N)),
        None,
    )
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    sel = rng.integers(0, B, B // 2)
    yield Case(
        "keyed_jagged_index_select_dim1",
        f"T={T} B={B}, select {B // 2} rows",
        dict(values=ids, lengths=lengths, offsets=offsets, indices=sel, batch_size=B, weights=weights),
        (idx_bytes + weights.nbytes) // 2,
        (idx_bytes + weights.nbytes) // 2,
        None,
        None,
    )
    in_off = offsets
    out_off = np.concatenate([[0], np.cumsum(lengths[bag_perm], dtype=np.int64)])
    if torch:
        t.update(in_off=torch.from_numpy(in_off), out_off=torch.from_numpy(out_off))
    yield Case(
        "expand_into_jagged_permute",
        f"{T * B} segments, {N} elements",
        dict(permute=bag_perm, input_offset=in_off, output_offset=out_off, output_size=N),
        3 * in_off.nbytes,
        idx_bytes,
        fb and (lambda: fb.expand_into_jagged_permute(t["bag_perm"], t["in_off"], t["out_off"], N)),
        None,
    )
    yield Case(
        "invert_permute",
        f"[{T * B}] int64",
        dict(permute=bag_perm),
        bag_perm.nbytes,
        bag_perm.nbytes,
        fb and (lambda: fb.invert_permute(t["bag_perm"])),
        torch and (lambda: torch.argsort(t["bag_perm"])),
    )
    hsc = np.arange(T + 1, dtype=np.int64) * H
    yield Case(
        "jagged_unique_indices",
        label + " (one table per key)",
        dict(hash_size_cumsum=hsc, hash_size_offsets=np.arange(T + 1), offsets=offsets, indices=ids),
        idx_bytes,
        2 * idx_bytes,
        None,
        torch
        and (
            lambda: torch.unique(
                t["ids"] + torch.repeat_interleave(torch.arange(T) * H, torch.from_numpy(lengths2d.sum(1))),
                return_inverse=True,
            )
        ),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="embnum backends to time (default: cpu, and cuda on a GPU)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row")
    parser.add_argument("--op", action="append", help="ops to time (default: every case)")
    args = parser.parse_args(argv)
    backends = default_backends(args.backend)
    rng = np.random.default_rng(0)
    chosen = (c for c in cases(rng) if not args.op or c.op in args.op)  # same inputs whichever are chosen
    report("bench_kjt.py", lambda: run_cases(chosen, backends, rounds=args.rounds))


if __name__ == "__main__":
    main()
