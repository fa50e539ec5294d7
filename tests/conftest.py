"""The suite's lanes and its time, beside CI's budget.

Lanes (``make test``: pytest-xdist, ``-n 2``): the tests that hold the machine-wide real-server lock
(``tests/realserver/``, and the daemon-set tests ``tests/*/test_*_real.py``) run one after another in one
lane, first and in their order; every other module is one unit of work for whichever lane is free, its
module fixtures built once. The lanes are xdist's ``loadscope`` with one scope for the lock's tests
(``pytest_xdist_make_scheduler``): xdist's ``loadgroup`` marks a group in the test's node id, which the
pytest this project pins no longer reads back. Without xdist the order is the only change.

Time: at the end of every run, the seconds of each test directory and the total, and every test over
``SLOW_S`` with the reason it gives (its ``slow`` marker, or the first line of its docstring). The table
also goes to ``build/ci-times.md`` (``results/ci-times.md`` is a fresh clone's copy). The budget is
reported, never asserted: a slow machine fails no test.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 35 * 60  # CI's tests, within its hard 90 minutes with the setup
SLOW_S = 60.0  # a test over this says why
TABLE = REPO / "build" / "ci-times.md"
WHY_SLOW = "why_slow"


REAL_SERVER_LANE = "the real-server lane"


def holds_server_lock(module: str) -> bool:
    """Whether the tests of ``module`` (a path from the repository) start real servers or daemon sets, under
    the machine-wide lock (``tests/realserver/conftest.py``)."""
    return module.startswith("tests/realserver/") or module.endswith("_real.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(reason): the test takes over a minute on 2 cores; the reason says why")
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) keeps the times
        config.pluginmanager.register(SuiteClock(), "suite-clock")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The lock's tests first (the longest lane starts at once), each group in its own order."""
    items.sort(key=lambda item: not holds_server_lock(item.nodeid.split("::", 1)[0]))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        """A module is a unit of work; every module of the lock's tests is one unit, the first."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return REAL_SERVER_LANE if holds_server_lock(module) else module

    config.option.loadscopereorder = False  # collection order: the lock's lane first
    return Lanes(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Why the test may be slow, carried with its reports (across xdist's workers too)."""
    marker = item.get_closest_marker("slow")
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    why = (marker.args[0] if marker and marker.args else "") or doc.strip().split("\n")[0]
    item.user_properties.append((WHY_SLOW, why))


def directory_of(nodeid: str) -> str:
    """``tests/realserver/test_x.py::t`` -> ``tests/realserver``; a test file at the top -> ``tests/*.py``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else f"{parts[0]}/*.py"


@dataclass(eq=False)  # a plugin: pluggy keeps its plugins in sets
class SuiteClock:
    started: float = field(default_factory=time.monotonic)
    seconds: dict[str, float] = field(default_factory=dict)  # by test id: setup + call + teardown
    why: dict[str, str] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        for name, value in report.user_properties:
            if name == WHY_SLOW:
                self.why[report.nodeid] = str(value)

    def table(self) -> list[str]:
        wall = time.monotonic() - self.started
        by_dir: dict[str, list[float]] = {}
        for nodeid, seconds in self.seconds.items():
            by_dir.setdefault(directory_of(nodeid), []).append(seconds)
        lines = ["| directory | tests | seconds |", "| --- | ---: | ---: |"]
        for directory, times in sorted(by_dir.items(), key=lambda kv: -sum(kv[1])):
            lines.append(f"| `{directory}` | {len(times)} | {sum(times):,.0f} |")
        total = sum(self.seconds.values())
        lines.append(f"| all (tests' own seconds) | {len(self.seconds)} | {total:,.0f} |")
        verdict = "within" if wall <= BUDGET_S else f"**over by {wall - BUDGET_S:,.0f} s**"
        lines += ["", f"Wall time of the test run: {wall:,.0f} s; the budget: {BUDGET_S:,} s ({verdict})."]
        slow = sorted(((s, n) for n, s in self.seconds.items() if s > SLOW_S), reverse=True)
        if slow:
            lines += ["", f"Tests over {SLOW_S:.0f} s, and why:", ""]
            lines += [f"- {s:,.0f} s `{n}`: {self.why.get(n) or '**says not why**'}" for s, n in slow]
        return lines

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        lines = self.table()
        terminalreporter.section("the suite's time, by directory, beside CI's budget")
        for line in lines:
            terminalreporter.write_line(line)
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text("\n".join([*_provenance(), "", *lines]) + "\n")


def _provenance() -> list[str]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return [
        f"<!-- pytest on commit {commit or 'unknown'}, {os.cpu_count()} CPUs, python {platform.python_version()} -->",
        "# The suite's time by directory",
    ]
