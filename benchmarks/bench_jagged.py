"""Jagged family: embnum's backends beside fbgemm_gpu's CPU ops and torch, in one run.

    python benchmarks/bench_jagged.py [--backend ref] [--backend cpu] [--backend cuda]

Prints the machine, then a markdown table (milliseconds, median of >= 7 runs
after 2 warm-ups). The headline case is the issue's: B=4096 bags, lengths
uniform in [0, 64], D=128, float32. "copy floor" is a plain NumPy copy of the
bytes the op must read and write. The ratio columns use the cpu backend
(or the last one asked for). On a GPU (``--backend cuda`` with CuPy
available) that column runs on CuPy arrays.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import embnum  # noqa: E402
from _bench import (  # noqa: E402
    add_ratios,
    copy_floor,
    default_backends,
    embnum_runner,
    machine,
    median_time,
    optional_fbgemm,
    optional_torch,
    print_ms_table,
)


def cases(rng):
    """(op, label, embnum args, fbgemm call or None, torch call or None, bytes read, bytes written)."""
    torch = optional_torch()
    fb = optional_fbgemm(torch)
    T = torch.from_numpy if torch else None
    B, L, D = 4096, 64, 128
    lengths = rng.integers(0, L + 1, size=B)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    N = int(offsets[-1])
    values = rng.standard_normal((N, D)).astype(np.float32)
    dense = rng.standard_normal((B, L, D)).astype(np.float32)
    ids = rng.integers(0, 10**6, size=N)
    many = rng.integers(0, 64, size=26 * B)
    many32 = many.astype(np.int32)
    many_offsets = np.concatenate([[0], np.cumsum(many)])
    bs = B
    csr = np.concatenate([[0], np.cumsum(rng.integers(0, 9, size=26))])
    sums_in = rng.standard_normal(int(csr[-1]) * bs).astype(np.float32)

    t = {}
    if torch:
        t = dict(
            values=T(values),
            offsets=T(offsets),
            dense=T(dense),
            ids=T(ids),
            many=T(many),
            many32=T(many32),
            many_offsets=T(many_offsets),
            csr=T(csr),
            sums_in=T(sums_in),
            csr_elems=T(csr * bs),
        )
    yield (
        "jagged_to_padded_dense",
        f"B={B}, len U[0,{L}], D={D} f32",
        dict(values=values, offsets=[offsets], max_lengths=[L]),
        fb and (lambda: fb.jagged_to_padded_dense(t["values"], [t["offsets"]], [L], 0.0)),
        torch and (lambda: torch.ops.aten._jagged_to_padded_dense_forward(t["values"], [t["offsets"]], [L], 0.0)),
        values.nbytes,
        B * L * D * 4,
    )
    yield (
        "dense_to_jagged",
        f"B={B}, len U[0,{L}], D={D} f32",
        dict(dense=dense, offsets=[offsets]),
        fb and (lambda: fb.dense_to_jagged(t["dense"], [t["offsets"]])),
        torch and (lambda: torch.ops.aten._padded_dense_to_jagged_forward(t["dense"], [t["offsets"]], N)),
        values.nbytes,
        values.nbytes,
    )
    yield (
        "jagged_1d_to_dense",
        f"B={B}, len U[0,{L}], int64 ids",
        dict(values=ids, offsets=offsets, max_sequence_length=L),
        fb and (lambda: fb.jagged_1d_to_dense(t["ids"], t["offsets"], L, 0)),
        None,
        ids.nbytes,
        B * L * 8,
    )
    yield (
        "complete_cumsum",
        f"[{many.size}] int64",
        dict(lengths=many),
        fb and (lambda: fb.asynchronous_complete_cumsum(t["many"])),
        torch and (lambda: torch.cat([t["many"].new_zeros(1), torch.cumsum(t["many"], 0)])),
        many.nbytes,
        many.nbytes + 8,
    )
    yield (
        "exclusive_cumsum",
        f"[{many.size}] int32",
        dict(lengths=many32),
        fb and (lambda: fb.asynchronous_exclusive_cumsum(t["many32"])),
        None,
        many32.nbytes,
        many32.nbytes,
    )
    yield (
        "inclusive_cumsum",
        f"[{many.size}] int64",
        dict(lengths=many),
        fb and (lambda: fb.asynchronous_inclusive_cumsum(t["many"])),
        torch and (lambda: torch.cumsum(t["many"], 0)),
        many.nbytes,
        many.nbytes,
    )
    yield (
        "offsets_range",
        f"{many.size} segments, {int(many_offsets[-1])} elements",
        dict(offsets=many_offsets, range_size=int(many_offsets[-1])),
        fb and (lambda: fb.offsets_range(t["many_offsets"], int(many_offsets[-1]))),
        None,
        many_offsets.nbytes,
        int(many_offsets[-1]) * 8,
    )
    yield (
        "segment_sum_csr",
        f"26 runs x {bs}, {sums_in.size} f32",
        dict(batch_size=bs, csr_seg=csr, values=sums_in),
        fb and (lambda: fb.segment_sum_csr(bs, t["csr"], t["sums_in"])),
        torch and (lambda: torch.segment_reduce(t["sums_in"], "sum", offsets=t["csr_elems"])),
        sums_in.nbytes,
        26 * 4,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", action="append", help="embnum backends to time (default: ref, cpu, and cuda on a GPU)"
    )
    args = parser.parse_args(argv)
    backends = default_backends(args.backend, host=("ref", "cpu"))
    print(machine())
    print(f"- command: python benchmarks/bench_jagged.py {' '.join(sys.argv[1:])}".rstrip())
    rows = []
    for op, label, op_args, fb_call, torch_call, nread, nwritten in cases(np.random.default_rng(0)):
        row = {"op": op, "input": label}
        fn = getattr(embnum, op)
        for backend in backends:
            row[f"embnum {backend}"] = median_time(embnum_runner(fn, backend, op_args))
        row["fbgemm cpu"] = median_time(fb_call) if fb_call else None
        row["torch"] = median_time(torch_call) if torch_call else None
        row["copy floor"] = copy_floor(nread, nwritten)
        add_ratios(row, backends)
        rows.append(row)
    print_ms_table(rows, backends)


if __name__ == "__main__":
    main()
