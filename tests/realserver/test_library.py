"""The real-server library's own parts, without a server (fast)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from expert_layout_real.engine_probes import StopPoint
from expert_layout_real.processes import ProcessTree


def test_stop_point_parses_and_refuses_bad_values() -> None:
    assert StopPoint.parse("after_commit:2") == StopPoint("after_commit", 2)
    assert StopPoint.parse("mid_move:1").env_value() == "mid_move:1"
    for bad in ("mid_move", "mid_move:0", "between:1", "after_commit:x"):
        with pytest.raises(ValueError, match="EXPERT_LAYOUT_TEST_STOP"):
            StopPoint.parse(bad)


def test_kill_reaches_every_descendant_and_the_log_keeps_the_output(tmp_path: Path) -> None:
    # A parent that starts a grandchild in a new session of its own: only the pid walk reaches it.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        "print('grandchild pid', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    tree = ProcessTree("t", [sys.executable, "-c", code], {}, tmp_path / "t.log")
    tree.start()
    deadline = time.monotonic() + 30
    while "grandchild pid " not in tree.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    members = tree.members()
    assert len(members) == 2, tree.log_tail()
    assert tree.rss_bytes() > 0
    tree.kill()
    _gone, alive = psutil.wait_procs(members, timeout=10)
    assert not alive and not tree.alive()
    assert tree.exit_code() == -9
    assert "grandchild pid " in tree.log_tail()
