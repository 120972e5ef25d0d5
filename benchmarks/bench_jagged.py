"""Jagged family: embnum's backends beside fbgemm_gpu's CPU ops and torch, in one run.

    python benchmarks/bench_jagged.py [--backend ref] [--backend cpu] [--backend cuda]

Prints the machine, the load before and after, then a markdown table: milliseconds per
call, median [IQR] over ``--rounds`` rounds in which every contender of a row runs in turn
in this process (``_bench.interleaved``, torch.utils.benchmark). The headline case is the issue's: B=4096 bags, lengths
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
from _bench import Case, default_backends, optional_fbgemm, optional_torch, report, run_cases  # noqa: E402


def cases(rng):
    """The headline cases (:class:`_bench.Case`), fbgemm's op and torch's beside them."""
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
    yield Case(
        "jagged_to_padded_dense",
        f"B={B}, len U[0,{L}], D={D} f32",
        dict(values=values, offsets=[offsets], max_lengths=[L]),
        values.nbytes,
        B * L * D * 4,
        fb and (lambda: fb.jagged_to_padded_dense(t["values"], [t["offsets"]], [L], 0.0)),
        torch and (lambda: torch.ops.aten._jagged_to_padded_dense_forward(t["values"], [t["offsets"]], [L], 0.0)),
    )
    yield Case(
        "dense_to_jagged",
        f"B={B}, len U[0,{L}], D={D} f32",
        dict(dense=dense, offsets=[offsets]),
        values.nbytes,
        values.nbytes,
        fb and (lambda: fb.dense_to_jagged(t["dense"], [t["offsets"]])),
        torch and (lambda: torch.ops.aten._padded_dense_to_jagged_forward(t["dense"], [t["offsets"]], N)),
    )
    yield Case(
        "jagged_1d_to_dense",
        f"B={B}, len U[0,{L}], int64 ids",
        dict(values=ids, offsets=offsets, max_sequence_length=L),
        ids.nbytes,
        B * L * 8,
        fb and (lambda: fb.jagged_1d_to_dense(t["ids"], t["offsets"], L, 0)),
        None,
    )
    torch_cumsums = {
        "complete": torch and (lambda: torch.cat([t["many"].new_zeros(1), torch.cumsum(t["many"], 0)])),
        "inclusive": torch and (lambda: torch.cumsum(t["many"], 0)),
    }
    for kind, a, key in (("complete", many, "many"), ("exclusive", many32, "many32"), ("inclusive", many, "many")):
        peer = fb and getattr(fb, f"asynchronous_{kind}_cumsum")
        fb_call = peer and (lambda peer=peer, key=key: peer(t[key]))
        extra = 8 if kind == "complete" else 0
        label = f"[{a.size}] {a.dtype}"
        yield Case(
            f"{kind}_cumsum", label, dict(lengths=a), a.nbytes, a.nbytes + extra, fb_call, torch_cumsums.get(kind)
        )
    yield Case(
        "offsets_range",
        f"{many.size} segments, {int(many_offsets[-1])} elements",
        dict(offsets=many_offsets, range_size=int(many_offsets[-1])),
        many_offsets.nbytes,
        int(many_offsets[-1]) * 8,
        fb and (lambda: fb.offsets_range(t["many_offsets"], int(many_offsets[-1]))),
        None,
    )
    yield Case(
        "segment_sum_csr",
        f"26 runs x {bs}, {sums_in.size} f32",
        dict(batch_size=bs, csr_seg=csr, values=sums_in),
        sums_in.nbytes,
        26 * 4,
        fb and (lambda: fb.segment_sum_csr(bs, t["csr"], t["sums_in"])),
        torch and (lambda: torch.segment_reduce(t["sums_in"], "sum", offsets=t["csr_elems"])),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", action="append", help="embnum backends to time (default: ref, cpu, and cuda on a GPU)"
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row")
    args = parser.parse_args(argv)
    backends = default_backends(args.backend, host=("ref", "cpu"))
    rng = np.random.default_rng(0)
    report("bench_jagged.py", lambda: run_cases(cases(rng), backends, rounds=args.rounds))


if __name__ == "__main__":
    main()
