"""KJT family: embnum's backends beside fbgemm_gpu's CPU ops (and torch), in one run.

    python benchmarks/bench_kjt.py [--backend ref] [--backend cpu] [--backend cuda]

Prints the machine, then a markdown table (milliseconds). The machine these
numbers come from is shared, so the contenders of one row are timed in
interleaved rounds (embnum, fbgemm, torch, embnum, ...;
at least 30 rounds and 1.5 s, after 3 warm-up rounds) and each column is the median of its rounds:
a burst of load from other processes hits every column alike. The headline cases are the issue's: a KJT with T=26 keys,
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
import statistics  # noqa: E402
import time  # noqa: E402

import embnum  # noqa: E402
from _bench import (  # noqa: E402
    add_ratios,
    copy_floor,
    default_backends,
    embnum_runner,
    machine,
    optional_fbgemm,
    optional_torch,
    print_ms_table,
)


def cases(rng):
    """(op, label, embnum args, fbgemm call or None, torch call or None, bytes read, bytes written)."""
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
    yield (
        "block_bucketize_sparse_features",
        label + " my_size=8 seq",
        bb,
        fb
        and (
            lambda: fb.block_bucketize_sparse_features(
                t["lengths"], t["ids"], False, True, t["block_sizes"], my_size, None
            )
        ),
        None,
        lengths.nbytes + idx_bytes,
        my_size * lengths.nbytes + 2 * idx_bytes,
    )
    yield (
        "block_bucketize_sparse_features",
        label + " my_size=8 seq pos w",
        dict(bb, bucketize_pos=True, weights=weights),
        fb
        and (
            lambda: fb.block_bucketize_sparse_features(
                t["lengths"], t["ids"], True, True, t["block_sizes"], my_size, t["weights"]
            )
        ),
        None,
        lengths.nbytes + idx_bytes + weights.nbytes,
        my_size * lengths.nbytes + 3 * idx_bytes + weights.nbytes,
    )

    def torch_permute(with_w):
        vs = torch.split(t["ids"], key_sizes)
        out = (t["lengths2d"][t["perm"]], torch.cat([vs[p] for p in perm]))
        if with_w:
            ws = torch.split(t["weights"], key_sizes)
            out += (torch.cat([ws[p] for p in perm]),)
        return out

    yield (
        "permute_2d_sparse_data",
        label + " random perm",
        dict(permute=perm, lengths=lengths2d, values=ids),
        fb and (lambda: fb.permute_2D_sparse_data(t["perm32"], t["lengths2d"], t["ids"], None, N)),
        torch and (lambda: torch_permute(False)),
        lengths.nbytes + idx_bytes,
        lengths.nbytes + idx_bytes,
    )
    yield (
        "permute_2d_sparse_data",
        label + " random perm, weights",
        dict(permute=perm, lengths=lengths2d, values=ids, weights=weights, permuted_lengths_sum=N),
        fb and (lambda: fb.permute_2D_sparse_data(t["perm32"], t["lengths2d"], t["ids"], t["weights"], N)),
        torch and (lambda: torch_permute(True)),
        lengths.nbytes + idx_bytes + weights.nbytes,
        lengths.nbytes + idx_bytes + weights.nbytes,
    )
    yield (
        "permute_1d_sparse_data",
        f"{T * B} bags, random bag perm, weights",
        dict(permute=bag_perm, lengths=lengths, values=ids, weights=weights),
        fb and (lambda: fb.permute_1D_sparse_data(t["bag_perm32"], t["lengths"], t["ids"], t["weights"], N)),
        None,
        lengths.nbytes + idx_bytes + weights.nbytes,
        lengths.nbytes + idx_bytes + weights.nbytes,
    )
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    sel = rng.integers(0, B, B // 2)
    yield (
        "keyed_jagged_index_select_dim1",
        f"T={T} B={B}, select {B // 2} rows",
        dict(values=ids, lengths=lengths, offsets=offsets, indices=sel, batch_size=B, weights=weights),
        None,
        None,
        (idx_bytes + weights.nbytes) // 2,
        (idx_bytes + weights.nbytes) // 2,
    )
    in_off = offsets
    out_off = np.concatenate([[0], np.cumsum(lengths[bag_perm], dtype=np.int64)])
    if torch:
        t.update(in_off=torch.from_numpy(in_off), out_off=torch.from_numpy(out_off))
    yield (
        "expand_into_jagged_permute",
        f"{T * B} segments, {N} elements",
        dict(permute=bag_perm, input_offset=in_off, output_offset=out_off, output_size=N),
        fb and (lambda: fb.expand_into_jagged_permute(t["bag_perm"], t["in_off"], t["out_off"], N)),
        None,
        3 * in_off.nbytes,
        idx_bytes,
    )
    yield (
        "invert_permute",
        f"[{T * B}] int64",
        dict(permute=bag_perm),
        fb and (lambda: fb.invert_permute(t["bag_perm"])),
        torch and (lambda: torch.argsort(t["bag_perm"])),
        bag_perm.nbytes,
        bag_perm.nbytes,
    )
    hsc = np.arange(T + 1, dtype=np.int64) * H
    yield (
        "jagged_unique_indices",
        label + " (one table per key)",
        dict(hash_size_cumsum=hsc, hash_size_offsets=np.arange(T + 1), offsets=offsets, indices=ids),
        None,
        torch
        and (
            lambda: torch.unique(
                t["ids"] + torch.repeat_interleave(torch.arange(T) * H, torch.from_numpy(lengths2d.sum(1))),
                return_inverse=True,
            )
        ),
        idx_bytes,
        2 * idx_bytes,
    )


def interleaved_medians(fns: dict, *, rounds: int = 30, min_seconds: float = 1.5, warmup: int = 3) -> dict:
    """Median seconds of each callable, timed one after the other in rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    start = time.perf_counter()
    while len(next(iter(times.values()))) < rounds or time.perf_counter() - start < min_seconds:
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="embnum backends to time (default: cpu, and cuda on a GPU)")
    args = parser.parse_args(argv)
    backends = default_backends(args.backend)
    print(machine())
    print(f"- command: python benchmarks/bench_kjt.py {' '.join(sys.argv[1:])}".rstrip())
    rows = []
    for op, label, op_args, fb_call, torch_call, nread, nwritten in cases(np.random.default_rng(0)):
        row = {"op": op, "input": label}
        fn = getattr(embnum, op)
        contenders = {}
        for backend in backends:
            contenders[f"embnum {backend}"] = embnum_runner(fn, backend, op_args)
        if fb_call:
            contenders["fbgemm cpu"] = fb_call
        if torch_call:
            contenders["torch"] = torch_call
        row.update({"fbgemm cpu": None, "torch": None})
        row.update(interleaved_medians(contenders))
        row["copy floor"] = copy_floor(nread, nwritten)
        add_ratios(row, backends)
        rows.append(row)
        print(f"  {op}: done", file=sys.stderr, flush=True)
    print_ms_table(rows, backends)


if __name__ == "__main__":
    main()
