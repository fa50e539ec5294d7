"""Case 1 on real servers: a restart on the same daemons adopts the moved layout.

Server A (``python -m sglang.launch_server``, TP2/EP2, 2 redundant experts, ``--enable-eplb``,
``--weight-cache-mode client``) rebalances on standalone layout-aware daemons
(``python -m daemon_adapter``) and stops. Server B starts on the same daemons: every rank must
adopt the daemons' version and map, and B's greedy outputs must equal those of a reference
server that loads the weights from disk with ``--init-expert-location`` set to that map.

Run with the plugin off in B (``EXPERT_LAYOUT_TEST_B_PLUGINS=none``: B with ``SGLANG_PLUGINS=none``)
this test fails: B never becomes ready, because the layout-aware daemons refuse its ``fetch_state``
after A's moves (an engine that does not send its expert layout).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tools.realserver.model import PROMPTS
from tools.realserver.server import (
    RealServer,
    RunDir,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
    write_expert_location,
)

from tests.realserver.conftest import drive_until_version

# The rule this test checks can be broken from outside: B's SGLANG_PLUGINS (None: all plugins).
B_PLUGINS = os.environ.get("EXPERT_LAYOUT_TEST_B_PLUGINS") or None
QUIET = 100_000  # rebalance iterations for servers that must not rebalance during the test


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.usefixtures("realserver_lock")
def test_restart_adopts_the_daemons_layout_and_serves_like_disk(tiny_model: Path, run_dir: RunDir) -> None:
    topology = Topology(tiny_model)
    prompts = list(PROMPTS)
    daemons = StandaloneDaemons(run_dir, topology).start()
    try:
        daemons.wait_ready()
        a = RealServer(run_dir, topology, ServerSpec("A", rebalance_iterations=10)).start()
        try:
            a.wait_ready()
            version = drive_until_version(a, run_dir, prompts, at_least=2)
        finally:
            a.stop()
        status = daemon_status(run_dir, include_map=True)
        maps = [d["state"]["map"] for d in status["daemons"]]
        assert len(maps) == topology.tp_size and all(m == maps[0] for m in maps), status
        moved_map = maps[0]
        assert version == status["daemons"][0]["state"]["version"]

        b = RealServer(run_dir, topology, ServerSpec("B", rebalance_iterations=QUIET, plugins=B_PLUGINS)).start()
        try:
            b.wait_ready()
            beliefs = b.beliefs()
            b_out = b.generate(prompts)
        finally:
            b.stop()
    finally:
        daemons.stop()

    assert sorted(beliefs) == list(range(topology.tp_size)), f"a rank wrote no belief: {beliefs}"
    for rank, belief in beliefs.items():
        assert belief["map"] == moved_map, f"rank {rank} routes with another map than the daemons hold"
        assert belief["version"] == version, f"rank {rank} is at version {belief['version']}, daemons at {version}"
        assert belief["startup"] == "adopt", f"rank {rank} startup was {belief['startup']}"

    location = write_expert_location(run_dir.root / "moved_map.json", moved_map)
    reference = RealServer(
        run_dir,
        topology,
        ServerSpec("reference", weight_cache_mode="off", rebalance_iterations=QUIET, init_expert_location=location),
    ).start()
    try:
        reference.wait_ready()
        assert reference.beliefs()[0]["map"] == moved_map
        reference_out = reference.generate(prompts)
    finally:
        reference.stop()
    assert b_out == reference_out, "B's greedy outputs differ from a disk-loaded server's with the same map"
