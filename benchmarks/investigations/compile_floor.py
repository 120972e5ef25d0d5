"""What any cold first call pays before its own kernels: Numba's import, its first compile in a
process (most of it registering Numba's typing and lowering tables), a one-line function's
compile after that, and a one-line ``prange`` kernel's.

    python benchmarks/investigations/compile_floor.py

Process CPU seconds, in a fresh process, no disk cache (nothing of embnum is imported).
"""

from __future__ import annotations

import time


def main() -> None:
    t = time.process_time()
    import numba
    import numpy as np

    print(f"import numba: {time.process_time() - t:.3f} s")

    @numba.njit
    def first(a):
        return a[0]

    for i, dt in enumerate((np.int64, np.float32, np.int32)):
        t = time.process_time()
        first(np.zeros(3, dt))
        what = "first compile in the process" if i == 0 else "a one-line function"
        print(f"{what} ({dt.__name__}): {time.process_time() - t:.3f} s")

    @numba.njit(parallel=True)
    def loop(a):
        for i in numba.prange(a.shape[0]):
            a[i] += 1

    for dt in (np.int64, np.float32):
        t = time.process_time()
        loop(np.zeros(3, dt))
        print(f"a one-line prange kernel ({dt.__name__}): {time.process_time() - t:.3f} s")


if __name__ == "__main__":
    main()
