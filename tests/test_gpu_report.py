"""The one-command GPU report (``benchmarks/gpu_report.py``) runs end to end: here in the simulator
on tiny inputs (its times mean nothing there), on a GPU machine unchanged at the benchmark sizes."""

import os
import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_report.py"


def test_gpu_report_runs_every_op_in_the_simulator(tmp_path):
    out = tmp_path / "report.md"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run(
        [sys.executable, str(REPORT), "--tiny", "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = out.read_text()
    import embnum

    for op in embnum.ops():
        assert f"| {op.name} |" in text, op.name
    assert "headline step" in text and "ERROR" not in text
