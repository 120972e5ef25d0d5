"""The tour's workers that compile the kernels of the ops ahead while it runs."""

import json
import os
import re
import subprocess
import sys
import textwrap

import embnum
from embnum import _warmup


def _env(cache_dir) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    src = os.path.dirname(os.path.dirname(embnum.__file__))
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return env


def test_families_are_taken_from_the_front_and_the_back():
    assert _warmup._front_and_back([[1], [2], [3], [4], [5]]) == [[1], [5], [2], [4], [3]]
    assert _warmup._front_and_back([]) == []


AHEAD = textwrap.dedent(
    """
    import json
    from embnum import _warmup

    # jagged, then kjt (the back), then keyed_tensor: one worker takes the first two at most
    ahead = _warmup.Ahead(["inclusive_cumsum", "permute_pooled_embs", "invert_permute"], ("cpu",), 1)
    ahead.wait("permute_pooled_embs")  # not taken by the worker: dropped, at once
    dropped = ahead._futures["permute_pooled_embs"].cancelled()
    ahead.wait("inclusive_cumsum")
    first = ahead._futures["inclusive_cumsum"]
    ahead.close()
    print(json.dumps([dropped, first.done(), [error for _, _, error in first.result()]]))
    """
)


def test_a_queued_family_is_dropped_and_a_started_one_waited_for(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", AHEAD], env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, [None]]


def test_the_tour_prints_the_same_rows_with_and_without_workers(tmp_path):
    ops = ["--op", "inclusive_cumsum", "--op", "invert_permute", "--backend", "ref", "--backend", "cpu"]
    rows = {}
    for jobs in ("2", "0"):
        cmd = [sys.executable, "-m", "embnum", "tour", *ops, "--repeats", "1", "--jobs", jobs]
        done = subprocess.run(cmd, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        lines = [line for line in done.stdout.splitlines() if line.startswith(("inclusive_cumsum", "invert_permute"))]
        rows[jobs] = [re.split(r"\s{2,}", line)[:4] for line in lines]  # op, backend, input, error
        assert "all ops match the oracle" in done.stdout
    assert len(rows["2"]) == 4 and rows["2"] == rows["0"]


PER_OP = textwrap.dedent(
    """
    import json, os
    from embnum import _warmup

    # one family (jagged), one worker: the caller waits for the first op only, not the family
    ahead = _warmup.Ahead(["inclusive_cumsum", "jagged_to_padded_dense"], ("cpu",), 1)
    ahead.wait("inclusive_cumsum")
    family = ahead._futures["inclusive_cumsum"]
    first_warm = os.path.exists(os.path.join(ahead._done, "inclusive_cumsum"))
    family_done_then = family.done()
    ahead.wait("jagged_to_padded_dense")
    second_warm = os.path.exists(os.path.join(ahead._done, "jagged_to_padded_dense"))
    ahead.close()
    print(json.dumps([first_warm, family_done_then, second_warm, [e for _, _, e in family.result()]]))
    """
)


def test_the_caller_waits_for_its_op_not_the_whole_family(tmp_path):
    """On a cold cache the family's second op still compiles in the worker when the first is
    handed over (its marker written), and is waited for in its turn."""
    done = subprocess.run(
        [sys.executable, "-c", PER_OP], env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, False, True, [None, None]]
