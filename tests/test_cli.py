"""``python -m embnum``: --version, the aligned ``list``, and the tour's timing
(median and quartiles of interleaved runs)."""

import contextlib
import re
import subprocess
import sys

import numpy as np
import pytest

import embnum
from embnum import __main__ as cli
from embnum import _warmup


def test_version_flag_prints_the_package_version():
    done = subprocess.run([sys.executable, "-m", "embnum", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"embnum {embnum.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", embnum.__version__)


def test_list_names_every_op_in_one_aligned_column(capsys):
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [op.name for op in embnum.ops()]
    assert [line.split()[0] for line in lines] == [op.family for op in embnum.ops()]
    columns = {line.index(line.split()[1], len(line.split()[0])) for line in lines}
    assert len(columns) == 1, columns  # every name starts in the same column
    assert columns.pop() > max(len(op.family) for op in embnum.ops())  # after a gap, even for the longest


def test_timed_runs_are_interleaved_between_backends():
    calls = []
    ticks = iter(range(100))
    runs = {name: (lambda name=name: calls.append(name)) for name in ("ref", "cpu", "cuda")}
    times = cli.interleaved_times(runs, {"ref": 2, "cpu": 4, "cuda": 1}, clock=lambda: next(ticks))
    assert calls == ["ref", "cpu", "cuda", "ref", "cpu", "cpu", "cpu"]
    assert {k: len(v) for k, v in times.items()} == {"ref": 2, "cpu": 4, "cuda": 1}
    assert all(t == 1 for v in times.values() for t in v)  # each time spans one call only


def test_summary_is_median_and_quartiles():
    assert cli.summary([7.0, 1.0, 3.0, 2.0, 6.0, 5.0, 4.0]) == (4.0, 2.5, 5.5)
    assert cli.summary([2.0]) == (2.0, 2.0, 2.0)
    assert cli._fmt_spread([0.002, 0.001, 0.003]) == ("2.00 ms", "1.50-2.50 ms")
    assert cli._fmt_spread([5e-6]) == ("5.00 us", "-")


def test_tour_reports_median_and_quartiles_per_backend(monkeypatch, capsys):
    # the oracle's answer is this process's first call of the op (imports, cache loads): not a
    # slow oracle's single timed run, whatever this worker ran before
    monkeypatch.setattr(cli, "SLOW_ORACLE", float("inf"))
    code = cli.main(["tour", "--op", "complete_cumsum", "--small", "--no-sim", "--backend", "ref", "--backend", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.startswith("op "))
    assert "median" in header and "quartiles" in header
    rows = [line for line in out.splitlines() if line.startswith("complete_cumsum")]
    assert [row.split()[1] for row in rows] == ["ref", "cpu"]
    for row in rows:
        flag = r"(, SLOWER than ref \(\d+\.\dx\))?"  # a busy machine can make cpu slower than ref
        assert re.search(r" \d+\.?\d* (s|ms|us) +\d+\.?\d*-\d+\.?\d* (s|ms|us)  ok" + flag + "$", row), row


@pytest.mark.parametrize("argv", [["--help"], ["tour", "--help"]])
def test_help_exits_cleanly(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m embnum" in out
    for markup in ("``", ":func:", ":class:", "`"):  # plain text, not the module docstring's reST
        assert markup not in out, (markup, out)


def test_tour_says_what_brings_a_missing_cuda_backend(monkeypatch):
    """Without numba-cuda (the README's run command installs only NumPy and Numba) the tour says
    which install adds the cuda backend instead of only naming it."""
    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None if name == "numba_cuda" else real(name))
    assert "requirements/sim.txt" in cli._why_missing("cuda") and "[sim]" in cli._why_missing("cuda")
    assert cli._why_missing("cpu") == "cpu"


def test_tour_flags_a_fast_path_slower_than_the_oracle():
    rows = {
        "ref": ("ref", "[8] int64", 0.0, "ok"),
        "cpu": ("cpu", "[8] int64", 0.0, "ok"),
        "cuda": ("cuda (sim)", "[2] int64", 0.0, "ok"),
    }
    times = {"ref": [1.0, 2.0, 3.0], "cpu": [4.0, 6.0, 5.0], "cuda": [90.0]}
    assert cli.slower_than_oracle("cpu", times, rows) == pytest.approx(2.5)
    assert cli.slower_than_oracle("ref", times, rows) is None
    assert cli.slower_than_oracle("cuda", times, rows) is None  # simulated, another input
    assert cli.slower_than_oracle("cpu", dict(times, cpu=[1.5, 1.9, 1.0]), rows) is None  # faster
    assert cli.slower_than_oracle("cpu", dict(times, ref=[]), rows) is None  # no oracle time


def test_tour_marks_the_slower_rows(monkeypatch, capsys):
    monkeypatch.setattr(cli, "slower_than_oracle", lambda name, times, rows: 3.0 if name == "cpu" else None)
    assert cli.main(["tour", "--op", "inclusive_cumsum", "--backend", "ref", "--backend", "cpu", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "ok, SLOWER than ref (3.0x)" in out and "1 fast paths slower than the oracle" in out


def test_the_oracle_answers_each_example_once_and_in_place_rows_get_their_own_copies(monkeypatch, capsys):
    """Every backend's row of one op shares its example and the oracle's answer (one ref call
    per example size for the answers, then the ref row's timed runs); an in-place op writes only
    the row's own copies, so each row starts from the example as made and matches the oracle."""
    op = embnum.get_op("tbe_backward_update")
    made, ref_calls, inputs_seen = [], [], []
    example_fn = op.example_fn

    def counting_example(rng, size):
        ex = example_fn(rng, size)
        made.append((size, ex))
        return ex

    real_public = op.public.__class__.__call__

    def watching(self, *a, **kw):
        if self is op:
            if kw.get("backend") == "ref":
                ref_calls.append(kw["weights"].sum())
            inputs_seen.append((kw.get("backend"), kw["weights"].copy()))
        return real_public(self, *a, **kw)

    monkeypatch.setattr(type(op), "example_fn", property(lambda self: counting_example if self is op else example_fn))
    monkeypatch.setattr(type(op), "__call__", watching)
    monkeypatch.setattr(cli, "SLOW_ORACLE", float("inf"))  # three timed ref runs, however long the answer took
    argv = ["tour", "--op", op.name, "--small", "--no-sim", "--backend", "ref", "--backend", "cpu", "--repeats", "2"]
    code = cli.main([*argv, "--jobs", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [size for size, _ in made] == ["small"]  # one example, shared by both rows
    example = made[0][1]
    # the answer (1) + the ref row's three timed runs; the cpu row reuses the answer
    assert len(ref_calls) == 4, ref_calls
    # the example's own arrays were never written, and every row's first call saw them as made
    original = example_fn(np.random.default_rng(0), "small").args["weights"]
    assert (example.args["weights"] == original).all()
    first_of = {}
    for backend, w in inputs_seen:
        first_of.setdefault(backend, w)
    assert set(first_of) == {"ref", "cpu"}
    assert all((w == original).all() for w in first_of.values())


@pytest.mark.parametrize("compiled, ref_calls", [(False, 1), (True, 2)])
def test_a_slow_oracle_is_timed_by_its_answer_unless_that_call_compiled(monkeypatch, capsys, compiled, ref_calls):
    """Over ``SLOW_ORACLE`` the oracle's row is its answer's call alone; when Numba compiled
    during that call (the declaration's checks), one more call is timed instead."""
    op = embnum.get_op("inclusive_cumsum")
    calls = []
    real_public = op.public.__class__.__call__

    def watching(self, *a, **kw):
        if self is op and kw.get("backend") == "ref":
            calls.append(1)
        return real_public(self, *a, **kw)

    @contextlib.contextmanager
    def counting():  # whatever this worker's cache holds
        yield ["a kernel"] * int(compiled)

    monkeypatch.setattr(type(op), "__call__", watching)
    monkeypatch.setattr(_warmup, "compiled_kernels", counting)
    monkeypatch.setattr(cli, "SLOW_ORACLE", -1.0)
    argv = ["tour", "--op", op.name, "--small", "--no-sim", "--backend", "ref", "--backend", "cpu", "--repeats", "2"]
    assert cli.main([*argv, "--jobs", "0"]) == 0
    assert len(calls) == ref_calls
    ref_row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:2] == [op.name, "ref"])
    assert ref_row.endswith("-  ok")  # one timed run: no quartiles


def test_the_small_answer_comes_first(monkeypatch):
    """On the large inputs the oracle answers the small example first, so that the op's one-time
    costs (imports, kernels loaded from the cache) do not fall on the large answer's time."""
    op = embnum.get_op("inclusive_cumsum")
    sizes = []
    real_public = op.public.__class__.__call__

    def watching(self, *a, **kw):
        if self is op and kw.get("backend") == "ref":
            sizes.append(len(kw["lengths"] if "lengths" in kw else a[0]))
        return real_public(self, *a, **kw)

    monkeypatch.setattr(type(op), "__call__", watching)
    assert cli.main(["tour", "--op", op.name, "--no-sim", "--backend", "ref", "--repeats", "1", "--jobs", "0"]) == 0
    assert len(sizes) >= 2 and sizes[0] < sizes[1]
