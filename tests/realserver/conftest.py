"""Fixtures of the real-server tests: the machine-wide server lock, the tiny model, a run folder.

These tests start real ``python -m sglang.launch_server`` processes (TP2/EP2, ~6 GB over 9
processes, ~30 s each to be ready on 2 cores), so they hold ``/tmp/realserver.lock`` from the
first such test to the end of the session: two runs never start servers at once.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from expert_layout_real.model import build_tiny_qwen3_moe
from expert_layout_real.server import RealServer, RunDir, daemon_status

REPO = Path(__file__).resolve().parents[2]
LOCK_PATH = "/tmp/realserver.lock"


@pytest.fixture(scope="session")
def realserver_lock() -> Iterator[None]:
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_qwen3_moe(REPO / "build" / "models")


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
