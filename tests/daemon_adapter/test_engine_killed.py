"""A real engine-side process attached to the daemon and killed with SIGKILL: the daemon
learns of it only through EOF on the attach connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, fetch_state, query, status_reason, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_engine(socket_path: str, engine_id: str, *layers: int) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.daemon_adapter.engine_proc", socket_path, engine_id, *map(str, layers)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_mover_killed_mid_move_leaves_the_daemon_dirty(daemon):
    proc, said = start_engine(daemon.socket_path, "mover", 1, 2)
    assert status_reason(said["begin"]) == ("ok", "begun")
    assert query(daemon.socket_path)["phase"] == "pending"
    sigkill(proc)
    state = wait_for(
        lambda: (s := query(daemon.socket_path))["phase"] == "dirty" and s, what="dirty after the mover's EOF"
    )
    assert state["dirty"] == {"engine_id": "mover", "layers": [1, 2], "base_version": 0}
    assert state["attached"] == [] and state["pending"] is None
    # refuses fetch_state (with or without the field) and begin, saying why
    other = Engine(daemon.socket_path, "next")
    other.attach()
    for reply in (other.fetch(0, layout_digest(INITIAL_MAP)), fetch_state(daemon.socket_path)):
        assert status_reason(reply) == ("layout_refused", "dirty")
        assert "mover" in reply["message"] and "[1, 2]" in reply["message"] and "restart" in reply["message"]
        assert "entries" not in reply
    begin = other.begin([0])
    assert status_reason(begin) == ("refused", "dirty")
    assert "mover" in begin["message"]
    # sticky: still dirty after the others leave
    other.detach()
    wait_for(lambda: query(daemon.socket_path)["attached"] == [], what="detach")
    assert query(daemon.socket_path)["phase"] == "dirty"
    # only a restart clears it
    daemon.restart()
    assert query(daemon.socket_path)["phase"] == "clean"


def test_engine_killed_without_a_move_leaves_the_daemon_clean(daemon):
    proc, said = start_engine(daemon.socket_path, "idle")
    assert status_reason(said["attach"]) == ("ok", "attached")
    assert query(daemon.socket_path)["attached"] == ["idle"]
    sigkill(proc)
    wait_for(lambda: query(daemon.socket_path)["attached"] == [], what="detach after EOF")
    state = query(daemon.socket_path)
    assert (state["phase"], state["version"], state["dirty"]) == ("clean", 0, None)
    assert fetch_state(daemon.socket_path)["status"] == "ok"
