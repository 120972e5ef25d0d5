"""Why a fresh large output is slow on this VM: first touch of new pages.

    python benchmarks/investigations/fresh_pages.py [--mib 32] [--reps 12] [--sleep 3]

Fills a new ``np.empty`` of ``--mib`` MiB (float32) 2 MiB at a time, ``--reps`` times right
after the previous one was freed, then ``--reps`` times after sleeping ``--sleep`` seconds,
then again without sleeping, and prints per phase: total ms (min / median / max), how many
2 MiB pieces took more than 0.5 ms, and the guest kernel's counters per call
(``/proc/vmstat``: huge-page faults, fallbacks to 4 KiB pages, compaction and direct-reclaim
stalls; counters are system-wide, so other processes add to them). Last, the same fill into a
buffer that stays mapped (what ``embnum.cpu._pool`` gives a repeated call).

What it showed (2026-11-24; counters since boot: no compaction stall, no fallback, no direct
reclaim; 15 huge-page faults per call in every phase): at load ~1.5 (an earlier version of
this program) the median fresh call took 6-10 ms without a pause and 62 ms after a 3 s
pause, half of the 2 MiB pieces slow; at load ~3.5, 8.8-11.9 ms without and 20.1 ms after the
pause, against 1.9 ms into a kept buffer after the same pause. The guest
has free page reporting on (virtio-balloon, ``page_reporting_order`` 9): a free 2 MiB block is
handed to the host about 2 s after it is freed, and touching it again faults in the host,
which the guest's counters never see.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

COUNTERS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "allocstall_normal", "pgfault")


def vmstat() -> dict:
    try:
        with open("/proc/vmstat") as f:
            pairs = (line.split() for line in f)
            return {k: int(v) for k, v in pairs if k in COUNTERS}
    except OSError:
        return {}


def fill(a, piece) -> list[float]:
    """Seconds to fill each ``piece`` bytes of float32 array ``a``, in order."""
    times = []
    for k in range(0, a.shape[0], piece // 4):
        t = time.perf_counter()
        a[k : k + piece // 4].fill(1.0)
        times.append(time.perf_counter() - t)
    return times


def phase(label, reps, pause, fn):
    totals, slow, pieces = [], 0, 0
    before = vmstat()
    for _ in range(reps):
        time.sleep(pause)
        times = fn()
        totals.append(sum(times))
        slow += sum(t > 0.5e-3 for t in times)
        pieces += len(times)
    after = vmstat()
    totals.sort()
    per_call = {k: round((after[k] - before[k]) / reps, 1) for k in after}
    print(
        f"{label}: ms min {totals[0] * 1e3:.1f} median {totals[len(totals) // 2] * 1e3:.1f} "
        f"max {totals[-1] * 1e3:.1f}; 2 MiB pieces > 0.5 ms: {slow}/{pieces}; per call {per_call}",
        flush=True,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=3.0)
    args = parser.parse_args(argv)
    n, piece = args.mib << 20, 2 << 20
    try:
        with open("/sys/module/page_reporting/parameters/page_reporting_order") as f:
            print("free page reporting order:", f.read().strip())
    except OSError:
        print("free page reporting: not found")

    def fresh():
        return fill(np.empty(n // 4, np.float32), piece)  # freed on return

    phase("fresh, no pause", args.reps, 0.0, fresh)
    phase(f"fresh, {args.sleep:g} s pause", args.reps, args.sleep, fresh)
    phase("fresh, no pause", args.reps, 0.0, fresh)
    kept = np.empty(n // 4, np.float32)

    phase(f"kept buffer, {args.sleep:g} s pause", args.reps, args.sleep, lambda: fill(kept, piece))


if __name__ == "__main__":
    main()
