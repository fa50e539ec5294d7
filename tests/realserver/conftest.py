"""Fixtures of the real-server tests: the machine-wide server lock, the tiny model, a run folder.

These tests start real ``python -m sglang.launch_server`` processes (TP2/EP2, ~6 GB over 9
processes, ~30 s each to be ready on 2 cores), so they hold ``/tmp/realserver.lock`` from the
first such test to the end of the session: two runs never start servers at once. Run under
``flock /tmp/realserver.lock`` too, they take the outer hold as theirs (``hold_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tools.realserver.model import build_tiny_qwen3_moe
from tools.realserver.server import DiskReferences, RealServer, RunDir, daemon_status
from tools.trace_check import check_all, reports

REPO = Path(__file__).resolve().parents[2]
LOCK_PATH = "/tmp/realserver.lock"


@pytest.fixture(scope="session")
def realserver_lock() -> Iterator[None]:
    with hold_lock(LOCK_PATH):
        yield


def lock_holders(path: str) -> set[int]:
    """Pids holding a flock on ``path`` (``/proc/locks``; waiters, the ``->`` lines, left out)."""
    inode = os.stat(path).st_ino
    holders = set()
    with open("/proc/locks") as locks:
        for line in locks:
            parts = line.split()
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
                holders.add(int(parts[4]))
    return holders


def held_by_an_ancestor(path: str) -> bool:
    holders = lock_holders(path)
    proc: psutil.Process | None = psutil.Process().parent()
    while proc is not None:
        if proc.pid in holders:
            return True
        proc = proc.parent()
    return False


_HELD_HERE: set[str] = set()  # the locks this process holds through hold_lock


@contextlib.contextmanager
def hold_lock(path: str) -> Iterator[None]:
    """The machine-wide server lock, for as long as the block runs. Already held by this process (the
    session's hold, then a daemon-set test's) or by an ancestor (``flock /tmp/realserver.lock pytest
    ...``): taking it again here would wait for that hold forever (a second open file, a second
    flock), so that hold is the hold."""
    if path in _HELD_HERE:
        yield
        return
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if held_by_an_ancestor(path):
                yield
                return
            fcntl.flock(lock, fcntl.LOCK_EX)
        _HELD_HERE.add(path)
        try:
            yield
        finally:
            _HELD_HERE.discard(path)
            fcntl.flock(lock, fcntl.LOCK_UN)


# Each trace file as last checked (its size): a folder is checked again when one of its files grew.
_CHECKED: dict[Path, int] = {}


@pytest.fixture(autouse=True)
def traces_are_behaviours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After each test, every run folder's traces of the session (``RunDir``: each daemon and engine rank
    writes one) where a trace is new or grown since the last check must be a behaviour of the protocol
    (``tools.trace_check``): a divergence fails the test. The whole session's folders, not the test's
    own: a module's fixture runs its servers in a folder of its own, before the test."""
    yield
    base = tmp_path_factory.getbasetemp()
    # A run folder's traces (``RunDir``: traces/ beside sockets/): not other tests' traces, some broken on purpose.
    files = {
        path: path.stat().st_size for path in base.rglob("traces/*.ndjson") if (path.parent.parent / "sockets").is_dir()
    }
    folders = sorted({path.parent for path, size in files.items() if _CHECKED.get(path) != size})
    verdicts = check_all(folders)
    _CHECKED.update(files)
    assert all(v.ok for v in verdicts), "a trace is not a behaviour of the protocol:\n" + reports(verdicts)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_qwen3_moe(REPO / "build" / "models")


@pytest.fixture(scope="session")
def disk_outputs(tmp_path_factory: pytest.TempPathFactory) -> DiskReferences:
    """The disk references' outputs of the whole session, by topology and map: a case that ends at a
    layout another case already judged reads its reference's outputs again instead of a server."""
    return DiskReferences(tmp_path_factory.mktemp("disk-references"))


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    return RunDir(tmp_path / "run")


def daemon_versions(run: RunDir) -> list[int | None]:
    status = daemon_status(run)
    return [(d.get("state") or {}).get("version") for d in status["daemons"]]


def drive_until_version(server: RealServer, run: RunDir, prompts: list[str], at_least: int, rounds: int = 40) -> int:
    """Greedy requests until every daemon's record is at ``at_least`` or more (EPLB rebalances
    every ``rebalance_iterations`` forward passes); returns the version reached."""
    for _ in range(rounds):
        server.generate(prompts, max_new_tokens=16)
        versions = daemon_versions(run)
        if versions and all(v is not None and v >= at_least for v in versions):
            assert len(set(versions)) == 1, f"daemons disagree after a rebalance: {versions}"
            return int(versions[0])
        time.sleep(0.2)
    raise AssertionError(
        f"the daemons' versions {daemon_versions(run)} did not reach {at_least} in {rounds} rounds of requests; "
        f"log tail:\n{server.tree.log_tail()}"
    )
