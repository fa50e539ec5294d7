"""The protocol across two nodes on real servers, as two hosts would run it (``tools.realserver.nodes``:
each node its own daemon sockets, ready files and logs; TCP between them).

TP2/EP2, one rank per node. Server A (``launch_server --nnodes 2 --node-rank K``, client mode)
rebalances on each node's standalone layout-aware daemons (``python -m daemon_adapter --nnodes 2
--node-rank K --dist-init-method ...``): every daemon of both nodes must record the same version and
map. Server B across the same nodes must adopt it on every rank and answer like a disk server started
with ``--init-expert-location`` at that map.

And ``--weight-cache-mode daemon`` across the nodes: sglang 0.5.23 gives the daemons it spawns the
engines' own rendezvous port, and node 0's scheduler then fails to bind it
(docs/upstream-daemon-rendezvous.md); the plugin's spawn hook gives them a port of their own. With
the plugin off (``SGLANG_PLUGINS=none``) the same server fails with EADDRINUSE.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tools.realserver import nodes as cluster
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS
from tools.realserver.server import ServerSpec, Topology, disk_reference

QUIET = 100_000  # rebalance iterations for servers that must not rebalance during the test
PARK_TIMEOUT_S = 240.0  # until every rank of both nodes waits at its stop point
REPAIR_TIMEOUT_S = 120.0  # a torn move's auto repair: well under a second on this tiny model


def _drive_until_version(servers: list, two: cluster.Nodes, at_least: int, rounds: int = 40) -> int:
    """Greedy requests to node 0 until every daemon of every node records ``at_least`` or more."""
    versions: list = []
    for _ in range(rounds):
        servers[0].generate(list(PROMPTS), max_new_tokens=16)
        versions = [s.get("version") for s in two.daemon_states()]
        if len(versions) == two.topology.tp_size and all(v is not None and v >= at_least for v in versions):
            return int(min(versions))
        time.sleep(0.2)
    tail = servers[0].tree.log_tail()
    raise AssertionError(f"the daemons of both nodes at {versions}, not {at_least}; log tail:\n{tail}")


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.usefixtures("realserver_lock")
def test_a_rebalance_across_two_nodes_is_recorded_on_both_and_adopted_on_both(tiny_model: Path, tmp_path: Path) -> None:
    topology = Topology(tiny_model)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons()
    try:
        for node in daemons:
            node.start()
        for node in daemons:
            node.wait_ready()
        a = two.servers(ServerSpec("A", rebalance_iterations=10))
        try:
            for server in a:
                server.start()
            a[0].wait_ready()
            _drive_until_version(a, two, at_least=2)
        finally:
            cluster.stop(a)
        states = two.daemon_states(include_map=True)
        assert len(states) == topology.tp_size, states
        version, moved_map = states[0]["version"], states[0]["map"]
        for state in states:  # every daemon of both nodes: the same version and map, nothing pending
            assert (state["version"], state["map"], state["phase"]) == (version, moved_map, "clean"), states

        b = two.servers(ServerSpec("B", rebalance_iterations=QUIET))
        try:
            for server in b:
                server.start()
            b[0].wait_ready()
            b_out = b[0].generate(list(PROMPTS))
            beliefs = cluster.beliefs(b)
        finally:
            cluster.stop(b)
    finally:
        for node in daemons:
            node.stop()

    assert sorted(beliefs) == list(range(topology.tp_size)), f"a rank wrote no belief: {beliefs}"
    for rank, belief in beliefs.items():
        assert (belief["startup"], belief["version"]) == ("adopt", version), (rank, belief)
        assert belief["map"] == moved_map, f"rank {rank} routes with another map than the daemons hold"

    reference = disk_reference(tmp_path / "reference", topology, moved_map).start()
    try:
        reference.wait_ready()
        assert reference.generate(list(PROMPTS)) == b_out, "B's outputs differ from a disk server's at that map"
    finally:
        reference.stop()


@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("realserver_lock")
def test_daemon_mode_across_two_nodes_meets_at_a_rendezvous_of_its_own(tiny_model: Path, tmp_path: Path) -> None:
    topology = Topology(tiny_model)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    servers = two.servers(ServerSpec("daemon-mode", weight_cache_mode="daemon", rebalance_iterations=QUIET))
    try:
        for server in servers:
            server.start()
        servers[0].wait_ready()
        out = servers[0].generate(list(PROMPTS))
        beliefs = cluster.beliefs(servers)
        logs = "".join(server.tree.log_path.read_text() for server in servers)
    finally:
        cluster.stop(servers)
    assert all(out), out
    assert sorted(beliefs) == list(range(topology.tp_size)), beliefs
    assert all(b["version"] == 0 for b in beliefs.values()), beliefs
    assert "EADDRINUSE" not in logs


@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("realserver_lock")
def test_sigkill_across_two_nodes_between_chunks_and_mid_move_each_node_repairs(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A, killed on both nodes once its first chunk is committed: every daemon stays clean at that
    version and D adopts it on every rank. D, killed on both nodes once its first chunk moved before
    its commit: each node's daemons repair their torn move by themselves (auto repair), clean at
    the last committed version again, and F adopts it and answers like a disk server with that map."""
    topology = Topology(tiny_model)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons()
    chunked = {"rebalance_iterations": 10, "layers_per_chunk": 1}
    try:
        for node in daemons:
            node.start()
        for node in daemons:
            node.wait_ready()
        a = two.servers(ServerSpec("A", **chunked, stop_at=StopPoint("after_commit", 1)))
        try:
            for server in a:
                server.start()
            a[0].wait_ready()
            cluster.park(a, PARK_TIMEOUT_S)
        finally:
            cluster.kill(a)
        after_a = two.wait_states(lambda states: not any(s.get("attached") for s in states), 30.0)
        assert [(s["phase"], s["version"]) for s in after_a] == [("clean", 1)] * topology.tp_size, after_a

        d = two.servers(ServerSpec("D", **chunked, stop_at=StopPoint("before_commit", 1)))
        try:
            for server in d:
                server.start()
            d[0].wait_ready()
            d_beliefs = cluster.beliefs(d)
            cluster.park(d, PARK_TIMEOUT_S)
        finally:
            cluster.kill(d)
        assert sorted(d_beliefs) == list(range(topology.tp_size)), d_beliefs
        for rank, belief in d_beliefs.items():
            assert (belief["startup"], belief["version"], belief["map"]) == ("adopt", 1, after_a[0]["map"]), rank
        repaired = two.wait_states(
            lambda states: all(s.get("phase") == "clean" and not s.get("attached") for s in states), REPAIR_TIMEOUT_S
        )
        assert [(s["phase"], s["version"]) for s in repaired] == [("clean", 1)] * topology.tp_size, repaired
        assert all(s["map"] == after_a[0]["map"] for s in repaired), "a node's repair left another map"
        for node in daemons:  # D's move was torn on each node, and each node's daemons repaired it
            assert "repairing layers" in node.tree.log_path.read_text(errors="replace"), node.name

        f = two.servers(ServerSpec("F", rebalance_iterations=QUIET))
        try:
            for server in f:
                server.start()
            f[0].wait_ready()
            f_out = f[0].generate(list(PROMPTS))
            f_beliefs = cluster.beliefs(f)
        finally:
            cluster.stop(f)
    finally:
        for node in daemons:
            node.stop()
    assert {(b["startup"], b["version"]) for b in f_beliefs.values()} == {("adopt", 1)}, f_beliefs
    reference = disk_reference(tmp_path / "reference", topology, after_a[0]["map"]).start()
    try:
        reference.wait_ready()
        assert reference.generate(list(PROMPTS)) == f_out, "F's outputs differ from a disk server's at that map"
    finally:
        reference.stop()
