"""The cuda kernels at the production block size (256 threads, 32-lane groups) in the simulator.

The other cuda tests run 8-thread blocks (every simulated thread is a Python thread). Kernels that
split a block into lane groups or size shared memory by the block behave differently at 256, so the
tour (every op's small example on the cuda backend, compared with the oracle) runs here once more
with ``EMBNUM_SIM_TPB=256``.
"""

import os
import subprocess
import sys


def test_every_op_matches_the_oracle_with_256_thread_blocks():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", EMBNUM_SIM_TPB="256")
    code = (
        "import sys; from embnum.cuda import _common; assert _common.TPB == 256 and _common.LANES == 32; "
        "from embnum.__main__ import main; sys.exit(main(['tour', '--backend', 'cuda', '--small']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "all ops match the oracle" in run.stdout
