"""Readable progress for the README's test command.

Instead of a dot per test, one line per test file as it finishes: the run's elapsed time, how
many files are done, the file, its own duration and its outcomes (and, after a minute without a
line, how far the running file is). At the end, the skips counted
by reason. Failures still print ``F``/``E`` as they happen and in full at the end; ``-v`` keeps
pytest's per-test lines. Registered by ``tests/conftest.py`` (or ``-p progress`` with ``tests/`` on
the path) in the process that reports: the controller under pytest-xdist, which runs each file
whole in one worker with ``--dist loadfile``.
"""

from __future__ import annotations

import collections
import time

STILL_RUNNING_EVERY = 60.0  # seconds without a line before a long file says how far it is

QUIET = {"passed": "PASSED", "skipped": "SKIPPED", "xfailed": "XFAIL"}


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:2d}:{s:02d}"


class Progress:
    def __init__(self, config):
        self.config = config
        self.start = time.monotonic()
        self.expected: dict[str, int] = {}  # file -> number of tests in it
        self.outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.began: dict[str, float] = {}
        self.status: dict[str, str] = {}  # nodeid -> outcome so far
        self.skips: collections.Counter = collections.Counter()
        self.skipped_files: dict[str, str] = {}  # file skipped whole -> reason
        self.done = 0
        self.last_line = time.monotonic()

    @property
    def reporter(self):
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def pytest_sessionstart(self, session):
        self.start = time.monotonic()
        if self.config.option.verbose <= 0 and self.reporter is not None:
            self.reporter.showfspath = False  # the file's line says it, once it is done

    # -- what is expected ----------------------------------------------------------------------
    def pytest_collection_finish(self, session):
        if getattr(self.config.option, "dist", "no") == "no":  # one process; under xdist the workers collect
            self._expect(item.nodeid for item in session.items)

    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.expected:  # every worker collects the same ids
            self._expect(ids)

    def _expect(self, nodeids):
        self.expected = collections.Counter(_file(n) for n in nodeids)
        for file, reason in self.skipped_files.items():  # now the number of files is known
            self._line(file, f"skipped: {reason}", None)

    # -- what happens -------------------------------------------------------------------------
    def pytest_report_teststatus(self, report, config):
        """Passes and skips print nothing per test (their file's line counts them)."""
        if config.option.verbose > 0:
            return None
        if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            return "passed", "", QUIET["passed"]
        if report.skipped:
            category = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            return category, "", QUIET[category]
        return None

    def pytest_collectreport(self, report):
        """A whole file skipped at import (``pytest.skip(..., allow_module_level=True)``)."""
        if report.skipped and report.nodeid and report.nodeid not in self.skipped_files:
            self.skipped_files[report.nodeid] = _skip_reason(report)
            self.skips[_skip_reason(report)] += 1
            if self.expected:  # else said once collection is done (see _expect)
                self._line(report.nodeid, f"skipped: {_skip_reason(report)}", None)

    def pytest_runtest_logreport(self, report):
        file, nodeid = _file(report.nodeid), report.nodeid
        self.began.setdefault(file, getattr(report, "start", time.time()))
        before = self.status.get(nodeid)
        if report.failed:
            self.status[nodeid] = "error" if report.when != "call" else "failed"
        elif report.skipped and before is None:
            self.status[nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            if self.status[nodeid] == "skipped":
                self.skips[_skip_reason(report)] += 1
        elif report.when == "call" and before is None:
            self.status[nodeid] = "xpassed" if hasattr(report, "wasxfail") else "passed"
        if report.when != "teardown":
            return
        self.outcomes[file][self.status.pop(nodeid, "passed")] += 1
        n, expected = sum(self.outcomes[file].values()), self.expected.get(file, -1)
        if n != expected and time.monotonic() - self.last_line > STILL_RUNNING_EVERY:
            self._line(file, f"still running: {n}/{expected} tests so far", None, count=False)
        if n == expected:
            counts = self.outcomes[file]
            text = ", ".join(
                f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed") if counts[k]
            )
            self._line(file, text, getattr(report, "stop", time.time()) - self.began[file])

    def _line(self, file: str, text: str, seconds: float | None, count: bool = True):
        self.done += count
        self.last_line = time.monotonic()
        total = len(self.expected) + len(self.skipped_files)
        took = f"{seconds:7.1f} s" if seconds is not None else " " * 9
        tw = getattr(self.reporter, "_tw", None)
        if tw is not None and tw.width_of_current_line:  # after an F or E on this line
            self.reporter.write("\n")
        self.reporter.write_line(
            f"[{_clock(time.monotonic() - self.start)}] {self.done:3d}/{total:<3d} {file:44s} {took}  {text}"
        )

    def pytest_terminal_summary(self, terminalreporter):
        if not self.skips:
            return
        terminalreporter.write_sep("-", f"skipped: {sum(self.skips.values())}, by reason")
        for reason, n in self.skips.most_common():
            terminalreporter.write_line(f"{n:6d}  {reason}")


def pytest_configure(config):
    """Register :class:`Progress` where results are reported (not in xdist's workers)."""
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("embnum-progress"):
        config.pluginmanager.register(Progress(config), "embnum-progress")
