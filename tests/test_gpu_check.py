"""``python -m embnum gpu-check``: every stage runs in the simulator (``--sim``, as CI runs it), the
results fit the promised files, and a failing stage fails the command without stopping the others."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from embnum import __main__ as cli
from embnum import gpucheck

ROOT = Path(__file__).resolve().parents[1]


def test_every_stage_runs_in_the_simulator(tmp_path):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("torch")
    out = tmp_path / "check"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "embnum", "gpu-check", "--sim", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files[0] == "0-summary.md" and len(files) <= 8, files
    assert files == sorted(gpucheck.FILES.values())
    summary = (out / "0-summary.md").read_text()
    for stage in gpucheck.LIMITS:
        assert f"| {stage} | ok |" in summary, summary
    assert "every stage passed" in summary
    smoke = json.loads((out / "3-smoke.json").read_text())
    assert {n for n, r in smoke.items() if r["ok"] is None} == {"stream_torch", "stream_cupy"}
    assert all(r["ok"] for n, r in smoke.items() if not n.startswith("stream"))
    assert smoke["fused_tbe_step"]["steps"] == 2 and smoke["wide_grid"]["cumsum_ok"]
    compiled = json.loads((out / "2-compile.json").read_text())
    assert len(compiled["rows"]) > 90 and not any(r["error"] for r in compiled["rows"])
    assert "| tbe_forward | headline" in (out / "5-gpu-report.md").read_text()


def test_a_failing_stage_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    from embnum.gpucheck import _env

    def broken(ctx, limit):
        raise RuntimeError("no device")

    monkeypatch.setattr(_env, "stage", broken)
    code = gpucheck.run(tmp_path, sim=True, stages=["versions", "compile"])
    summary = (tmp_path / "0-summary.md").read_text()
    assert code == 1 and "| versions | FAIL |" in summary and "RuntimeError: no device" in summary
    assert "| compile | ok |" in summary and "FAILED: versions" in summary


def test_without_a_gpu_the_command_points_at_the_simulator(tmp_path, monkeypatch, capsys):
    from embnum import _backend

    monkeypatch.setattr(_backend, "gpu_present", lambda: False)
    assert cli.main(["gpu-check", "--out", str(tmp_path)]) == 2
    assert "--sim" in capsys.readouterr().out and not any(tmp_path.iterdir())


def test_the_readme_says_how_to_run_it():
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m embnum gpu-check --out" in readme and "--sim" in readme


def test_a_stopped_pytest_stage_reports_how_far_it_got():
    from embnum.gpucheck._subprocs import progress

    out = "tests/test_a.py ..F.s  [ 12%]\nnot a progress line.\n.....E [100%]\n"
    assert progress(out) == "9 passed, 1 failed, 1 errors, 4 skipped (progress marks)"
