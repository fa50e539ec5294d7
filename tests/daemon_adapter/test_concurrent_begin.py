"""16 engine processes attach and begin at once: at most one move is accepted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from .helpers import query
from .test_engine_killed import REPO

NUM_ENGINES = 16


def test_sixteen_engines_at_once_at_most_one_ok(daemon):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.daemon_adapter.engine_proc", daemon.socket_path, f"e{i}", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for i in range(NUM_ENGINES)
    ]
    try:
        results = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        assert all(r["attach"]["status"] == "ok" for r in results)
        begins = [r["begin"] for r in results]
        accepted = [f"e{i}" for i, b in enumerate(begins) if b["status"] == "ok"]
        assert len(accepted) <= 1, accepted
        assert all(b["status"] in ("ok", "busy", "refused") for b in begins), begins
        state = query(daemon.socket_path)
        assert len(state["attached"]) == NUM_ENGINES
        assert state["pending"] == ({"engine_id": accepted[0], "layers": [0], "base_version": 0} if accepted else None)
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
