"""Case 3b on real servers: SIGKILL of a server mid-move leaves the daemons dirty, and the next
server fails at startup promptly, with the reason in what its launcher sees.

Server A runs with the test probe ``EXPERT_LAYOUT_TEST_STOP=mid_move:1``
(``expert_layout_real.engine_probes``): each rank stops once its daemon has accepted the begin
of A's first chunk, before sglang moves the weights. The test then SIGKILLs A's whole process
tree. Server B on the same daemons must exit on its own, well before the protocol's wait
timeout, and its log (its launcher's output) must say the daemons are dirty and what to do.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from expert_layout_real.engine_probes import StopPoint
from expert_layout_real.model import PROMPTS
from expert_layout_real.server import RealServer, RunDir, ServerFailed, ServerSpec, StandaloneDaemons, Topology

# B's SGLANG_PLUGINS can be set from outside, to run the test with the plugin's startup check off.
B_PLUGINS = os.environ.get("EXPERT_LAYOUT_TEST_B_PLUGINS") or None
PROMPT_TIMEOUT_S = 240.0
# The engine-side wait for another engine's move; B must fail well before it.
WAIT_TIMEOUT_S = 300.0


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.usefixtures("realserver_lock")
def test_sigkill_mid_move_makes_the_next_server_fail_at_startup(tiny_model: Path, run_dir: RunDir) -> None:
    topology = Topology(tiny_model)
    daemons = StandaloneDaemons(run_dir, topology).start()
    try:
        daemons.wait_ready()
        a = RealServer(
            run_dir,
            topology,
            ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=StopPoint("mid_move", 1)),
        ).start()
        try:
            a.wait_ready()
            # Requests hang once the ranks stop: send them from a thread and wait for the stop.
            traffic = threading.Thread(target=_requests_until_stopped, args=(a,), daemon=True)
            traffic.start()
            a.wait_stopped(PROMPT_TIMEOUT_S)
            pending = [(d["state"] or {}).get("pending") for d in _status(run_dir)]
            assert all(pending), f"the stop point is not mid-move: pending={pending}"
        finally:
            a.kill()
        dirty = _wait_dirty(run_dir, topology.tp_size, timeout_s=30.0)
        assert all(dirty), f"daemons are not dirty after the mover's SIGKILL: {dirty}"

        b = RealServer(run_dir, topology, ServerSpec("B", rebalance_iterations=100_000, plugins=B_PLUGINS)).start()
        started = time.monotonic()
        try:
            with pytest.raises(ServerFailed) as failed:
                b.wait_ready(timeout_s=WAIT_TIMEOUT_S)
            took = time.monotonic() - started
        finally:
            b.kill()
    finally:
        daemons.kill()

    message = str(failed.value)
    assert "exited with code" in message, f"B did not exit by itself: {message[:2000]}"
    assert took < WAIT_TIMEOUT_S / 2, f"B failed only after {took:.0f}s"
    assert "dirty" in message and "restart the weight cache daemons" in message, message[-3000:]


def _status(run: RunDir) -> list[dict]:
    from expert_layout_real.server import daemon_status

    return daemon_status(run)["daemons"]


def _wait_dirty(run: RunDir, daemons: int, timeout_s: float) -> list:
    """Each daemon's dirty field, once all are dirty or after ``timeout_s`` (the daemon sees the
    killed engine's attach connection close, then turns dirty)."""
    deadline = time.monotonic() + timeout_s
    while True:
        dirty = [(d["state"] or {}).get("dirty") for d in _status(run)]
        if (len(dirty) == daemons and all(dirty)) or time.monotonic() > deadline:
            return dirty
        time.sleep(0.5)


def _requests_until_stopped(server: RealServer) -> None:
    while server.tree.alive() and len(server.stopped_ranks()) < server.topology.tp_size:
        try:
            server.generate(list(PROMPTS), max_new_tokens=16)
        except Exception:
            return
