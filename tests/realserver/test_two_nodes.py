"""The protocol across two nodes on real servers, as two hosts would run it (``tools.realserver.nodes``:
each node its own daemon sockets, ready files, logs and processes; TCP between them). TP2/EP2, one
rank per node, and TP4/EP4, two per node; servers ``launch_server --nnodes 2 --node-rank K`` in
client mode on each node's standalone layout-aware daemons (``python -m daemon_adapter --nnodes 2
--node-rank K --dist-init-method ...``), and outputs judged against a disk server with
``--init-expert-location`` at the daemons' map:

- a rebalance recorded by every daemon of both nodes, adopted on both by the next server; an older
  engine (the plugin off) across the nodes is refused on each, with the reason on its screen;
- SIGKILL on both nodes between chunks (the next server adopts the committed version) and mid-move
  (each node's daemons repair their torn move by themselves; the next server adopts);
- a warm standby spanning both nodes takes over from a primary SIGKILLed on both;
- ranks that find different records on the two nodes (one node's daemons repaired, the other's
  dirty) all fail, each node saying why, none left waiting in a collective;
- a node lost whole (its engine rank and its daemons, SIGKILL): its daemons start again from disk
  alone (``--expert-layout-start-alone``), the next server's startup has them rejoin at the other
  node's version, and it adopts that version on every rank; the rejoin's time and bytes beside a
  restart of every daemon of both nodes, in the same run;
- ``--weight-cache-mode daemon`` across the nodes: sglang 0.5.23 gives the daemons it spawns the
  engines' own rendezvous port, and node 0's scheduler then fails to bind it
  (docs/upstream-daemon-rendezvous.md); the plugin's spawn hook gives them a port of their own.
  With the hook's rule taken out, this case fails with EADDRINUSE.

Every case runs on TP4/EP4, two ranks and two daemons per node, which reaches every branch on the node
count and the local ranks. TP2/EP2, one rank per node, keeps daemon mode and the rebalance adopted on
both nodes. The node's loss continues from the case that rebalanced on both nodes: the daemon set,
the rebalance and the disk reference are that case's. Disk references are shared by the session
(``disk_outputs``): one server per topology and map.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from tools.demo import memory_probe
from tools.realserver import nodes as cluster
from tools.realserver import torn_move
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS
from tools.realserver.server import (
    PROTOCOL_OFF,
    DiskReferences,
    RealServer,
    ServerFailed,
    ServerSpec,
    Topology,
    park,
)

from daemon_adapter.__main__ import NO_AUTO_REPAIR, START_ALONE
from daemon_adapter.durable import copy_path
from engine_adapter.roles import ROLE_ENV, STANDBY

from .conftest import REPO

QUIET = 100_000  # rebalance iterations for servers that must not rebalance during the test
PARK_TIMEOUT_S = 240.0  # until every rank of both nodes waits at its stop point
START_TIMEOUT_S = 600.0  # a server's start, at worst on a loaded machine
REPAIR_TIMEOUT_S = 120.0  # a torn move's auto repair: well under a second on this tiny model
EXIT_TIMEOUT_S = 120.0  # a node's ranks, once the other node's exited: far below the protocol's wait
STARTUP_REFUSAL = "expert-layout startup check failed"
# Both topologies: one rank per node, and two ranks (and two daemons) per node; or the second alone.
TOPOLOGIES = pytest.mark.parametrize("tp", [2, 4], ids=["tp2-one-rank-per-node", "tp4-two-ranks-per-node"])
TP4 = pytest.mark.parametrize("tp", [4], ids=["tp4-two-ranks-per-node"])
# The takeover's time and the rejoin's time and bytes, for the results (TP4/EP4).
STANDBY_RESULTS = REPO / "build" / "two-node-standby-tp4.json"
REJOIN_RESULTS = REPO / "build" / "two-node-rejoin-tp4.json"


def _topology(tiny_model: Path, tp: int) -> Topology:
    """TP2/EP2 (2 redundant experts), or TP4/EP4 with 4 redundant experts: 12 slots over 4 ranks."""
    return Topology(tiny_model) if tp == 2 else Topology(tiny_model, tp_size=4, ep_size=4, redundant_experts=4)


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


def _rebalanced(two: cluster.Nodes, at_least: int) -> tuple[int, list[list[int]]]:
    """Server A across the nodes rebalances until every daemon records ``at_least``, and stops; every
    daemon of every node then holds the same version and map, nothing pending: that version and map."""
    a = two.servers(ServerSpec("A", rebalance_iterations=10))
    try:
        cluster.serve(a)
        _drive_until_version(a, two, at_least=at_least)
    finally:
        cluster.stop(a)
    states = two.daemon_states(include_map=True)
    assert len(states) == two.topology.tp_size, states
    version, moved_map = states[0]["version"], states[0]["map"]
    for state in states:
        assert (state["version"], state["map"], state["phase"]) == (version, moved_map, "clean"), states
    return version, moved_map


def _stopping(name: str, point: str, count: int) -> ServerSpec:
    """A server that rebalances one layer a chunk, each rank stopping at the ``count``-th ``point``."""
    return ServerSpec(name, rebalance_iterations=10, layers_per_chunk=1, stop_at=StopPoint(point, count))


def _outputs_and_beliefs(two: cluster.Nodes, name: str) -> tuple[list[list[int]], dict[int, dict[str, Any]]]:
    """A server across the nodes that does not rebalance: its greedy outputs and every rank's belief."""
    servers = two.servers(ServerSpec(name, rebalance_iterations=QUIET))
    try:
        cluster.serve(servers)
        return servers[0].generate(list(PROMPTS)), cluster.beliefs(servers)
    finally:
        cluster.stop(servers)


def _left_running(server: RealServer) -> bool:
    """Whether ``server`` (a node's processes) still runs ``EXIT_TIMEOUT_S`` after the test saw another
    node's exit: no rank may be left waiting in a collective."""
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while server.tree.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    return server.tree.alive()


def _older_engine_is_refused_on_each_node(two: cluster.Nodes) -> None:
    """An older engine (the plugin off) across the nodes is refused on each, the reason on its screen,
    no rank left running."""
    older = two.servers(ServerSpec("older", rebalance_iterations=QUIET, plugins=PROTOCOL_OFF))
    try:
        cluster.start(older)
        with pytest.raises(ServerFailed):
            older[0].wait_ready(timeout_s=START_TIMEOUT_S)
        older_left_running = _left_running(older[1])
        on_screen = [server.log_text() for server in older]
    finally:
        cluster.kill(older)
    assert not older_left_running, "the older engine's node 1 still runs after node 0 exited"
    for node, text in enumerate(on_screen):
        assert "experts have moved" in text, f"node {node}'s older engine shows no reason:\n{text[-3000:]}"


def _refused_at_startup(two: cluster.Nodes, name: str) -> tuple[list[str], bool]:
    """A server across the nodes whose startup check fails: each node's screen, and whether node 1
    still ran ``EXIT_TIMEOUT_S`` after node 0's exit."""
    servers = two.servers(ServerSpec(name, rebalance_iterations=QUIET))
    try:
        cluster.start(servers)
        with pytest.raises(ServerFailed):
            servers[0].wait_ready(timeout_s=START_TIMEOUT_S)
        left_running = _left_running(servers[1])
        return [server.log_text() for server in servers], left_running
    finally:
        cluster.kill(servers)


def _refusal_lines(screens: list[str]) -> list[str]:
    """The startup check's failure lines on every node's screen; at least one."""
    lines = [line for text in screens for line in text.splitlines() if STARTUP_REFUSAL in line]
    assert lines, "no startup failure on any node's screen:\n" + "\n".join(text[-2000:] for text in screens)
    return lines


def _assert_adopted(beliefs: dict[int, dict[str, Any]], tp_size: int, version: int, moved_map: list) -> None:
    assert sorted(beliefs) == list(range(tp_size)), f"a rank wrote no belief: {beliefs}"
    for rank, belief in beliefs.items():
        assert (belief["startup"], belief["version"]) == ("adopt", version), (rank, belief)
        assert belief["map"] == moved_map, f"rank {rank} routes with another map than the daemons hold"


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.slow("two nodes' daemons; a rebalance, an older engine, a server, a disk reference")
@pytest.mark.usefixtures("realserver_lock")
@pytest.mark.parametrize("tp", [2], ids=["tp2-one-rank-per-node"])
def test_a_rebalance_across_two_nodes_is_recorded_on_both_and_adopted_on_both(
    tiny_model: Path, tmp_path: Path, tp: int, disk_outputs: DiskReferences
) -> None:
    """A rebalances across the nodes: every daemon of both nodes records the same version and map. An
    older engine (the plugin off) across the nodes is refused on each node, the reason on its screen,
    no rank left running. B adopts the version and map on both ranks and answers like a disk server
    with that map."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons()
    try:
        cluster.start_daemons(daemons)
        version, moved_map = _rebalanced(two, at_least=2)
        _older_engine_is_refused_on_each_node(two)
        b_out, beliefs = _outputs_and_beliefs(two, "B")
    finally:
        cluster.stop(daemons)
    _assert_adopted(beliefs, topology.tp_size, version, moved_map)
    assert b_out == disk_outputs.outputs(topology, moved_map), "B's outputs differ from a disk server's"


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.slow("the rebalance case, then a node lost whole: refused servers, its rejoin, a full restart")
@pytest.mark.usefixtures("realserver_lock")
@TP4
def test_a_rebalance_adopted_on_both_nodes_then_a_node_lost_whole_rejoins_at_the_other_nodes_version(
    tiny_model: Path, tmp_path: Path, tp: int, disk_outputs: DiskReferences
) -> None:
    """A rebalances across the nodes: every daemon of both nodes records the same version and map. An
    older engine (the plugin off) across the nodes is refused on each node, the reason on its screen,
    no rank left running. B adopts the version and map on every rank and answers like a disk server
    with that map. Node 1 is then lost whole: B's ranks there and node 1's daemons, SIGKILL (B's node 0
    goes too, as its collectives would fail), its disk with it: no durable copy there. Node 1's daemons
    start again from disk alone, at version 0, beside node 0's at A's version. C's startup has node 1's
    daemons rejoin (every layer reloaded there, nothing on node 0) and adopts A's version and map on
    every rank, answering like a disk server with that map. Then every daemon of both nodes is
    SIGKILLed and started again: each from its durable copy (node 1's written after its rejoin), at A's
    version and map, and D adopts them on every rank, answering like the disk server too."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    local = two.local_ranks
    daemons = two.daemons()
    try:
        cluster.start_daemons(daemons)
        version, moved_map = _rebalanced(two, at_least=2)
        _older_engine_is_refused_on_each_node(two)

        b = two.servers(ServerSpec("B", rebalance_iterations=QUIET))
        try:
            cluster.serve(b)
            b_out, b_beliefs = b[0].generate(list(PROMPTS)), cluster.beliefs(b)
            b[1].kill()
            daemons[1].kill()
        finally:
            cluster.kill(b)
        copies = [copy_path(two.runs[1].socket_path(gpu)) for gpu in range(local)]
        assert all(file is not None and file.exists() for file in copies), f"node 1's durable copies: {copies}"
        shutil.rmtree(copies[0].parent)  # type: ignore[union-attr]  # node 1 lost whole, its disk with it
        daemons[1] = two.daemons(extra_args={1: (START_ALONE,)})[1]
        daemons[1].start()
        alone_start_s = daemons[1].wait_ready(START_TIMEOUT_S)
        apart = two.wait_states(lambda st: not any(s.get("attached") for s in st), 30.0)
        assert [(s["phase"], s["version"]) for s in apart] == [("clean", version)] * local + [("clean", 0)] * local
        sockets = [run.socket_path(gpu) for run in two.runs for gpu in range(local)]  # in EP order

        # Node 1's daemons die again before any server rejoined them (what a kill mid-rejoin leaves:
        # the rejoin's reload takes milliseconds, too short to aim a SIGKILL at): the next server is
        # refused, naming each socket and the way back, which is then followed.
        daemons[1].kill()
        lost_screens, lost_left_running = _refused_at_startup(two, "C-lost")
        daemons[1] = two.daemons(extra_args={1: (START_ALONE,)})[1]
        daemons[1].start()
        daemons[1].wait_ready(START_TIMEOUT_S)

        # Two servers start at once beside the daemons that must rejoin: C2 holds node 1's daemons
        # attached (stopped before its rejoin), and C1, refused its rejoin, says to start it again once
        # that one is up or has stopped; C2 then stops, and C, started again, rejoins.
        waiting = two.servers(ServerSpec("C2", rebalance_iterations=QUIET, stop_at=StopPoint("before_rejoin", 1)))
        try:
            cluster.start(waiting)
            waiting[1].wait_stopped(START_TIMEOUT_S, ranks=local)
            refused_screens, refused_left_running = _refused_at_startup(two, "C1")
        finally:
            cluster.kill(waiting)
        two.wait_states(lambda st: not any(s.get("attached") for s in st), 30.0)

        c = two.servers(ServerSpec("C", rebalance_iterations=QUIET))
        try:
            cluster.start(c)
            c_ready_s = c[0].wait_ready()
            c_out = c[0].generate(list(PROMPTS))
            c_beliefs = cluster.beliefs(c)
        finally:
            cluster.stop(c)
        rejoined = two.daemon_states(include_map=True)
        held = memory_probe.held_map(sockets, str(tiny_model))
        logs = [node.tree.log_path.read_text(errors="replace") for node in daemons]

        for node in daemons:  # every daemon of both nodes, SIGKILL
            node.kill()
        daemons = two.daemons()
        restarted = time.monotonic()
        cluster.start_daemons(daemons)
        full_restart_s = time.monotonic() - restarted
        after_full_restart = two.daemon_states(include_map=True)
        d = two.servers(ServerSpec("D", rebalance_iterations=QUIET))
        try:
            cluster.start(d)
            d_ready_s = d[0].wait_ready()
            d_out = d[0].generate(list(PROMPTS))
            d_beliefs = cluster.beliefs(d)
        finally:
            cluster.stop(d)
    finally:
        cluster.stop(daemons)

    _assert_adopted(b_beliefs, topology.tp_size, version, moved_map)
    assert not lost_left_running and not refused_left_running, "a refused server's node 1 still runs"
    lost_refusals = _refusal_lines(lost_screens)
    for socket in sockets[local:]:
        assert any(str(socket) in line for line in lost_refusals), (socket, lost_refusals)
    for words in ("ConnectionRefusedError", "start the daemon at that socket again", "--expert-layout-start-alone"):
        assert all(words in line for line in lost_refusals), (words, lost_refusals)
    refusals = _refusal_lines(refused_screens)
    assert all("start this engine again once that one is up or has stopped" in line for line in refusals), refusals
    assert not any("restart the weight cache daemons" in line for line in refusals), refusals
    assert all((s["phase"], s["version"], s["map"]) == ("clean", version, moved_map) for s in rejoined), rejoined
    assert held == moved_map, f"the daemons' memory holds {held}, the record says {moved_map}"
    assert sorted(c_beliefs) == list(range(topology.tp_size)), c_beliefs
    for rank, belief in c_beliefs.items():
        assert (belief["version"], belief["map"]) == (version, moved_map), f"C's rank {rank}: {belief}"
    assert "rejoining: reloading layers" not in logs[0], "node 0's daemon, which kept the record, reloaded"
    assert logs[1].count("rejoining: reloading layers") == local, logs[1][-3000:]
    reports = torn_move.logged_repairs(logs[1])
    assert len(reports) == local and all(r.layers == list(range(len(moved_map))) for r in reports), reports
    assert [(s["version"], s["map"]) for s in after_full_restart] == [(version, moved_map)] * tp, (
        "a daemon started again from its durable copy at another layout"
    )
    assert [s["durable"]["at_start"]["kind"] for s in after_full_restart] == ["whole"] * tp, after_full_restart
    assert sorted(d_beliefs) == list(range(topology.tp_size)), d_beliefs
    for rank, belief in d_beliefs.items():
        assert (belief["version"], belief["map"], belief["startup"]) == (version, moved_map, "adopt"), (
            f"D's rank {rank}: {belief}"
        )
    REJOIN_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # Figures for the results, not the test's verdict.
    REJOIN_RESULTS.write_text(
        json.dumps(
            {
                "topology": f"TP{tp}/EP{tp}, {local} rank(s) per node",
                "version": version,
                "node_alone_start_s": round(alone_start_s, 3),
                "rejoin_in_daemon_s": max(r.seconds for r in reports),
                "rejoin_bytes_read": sum(r.bytes_read for r in reports),
                "checkpoint_bytes": reports[0].checkpoint_bytes,
                "server_ready_with_rejoin_s": round(c_ready_s, 3),
                "full_restart_both_nodes_s": round(full_restart_s, 3),
                "server_ready_after_full_restart_s": round(d_ready_s, 3),
            }
        )
        + "\n"
    )
    reference = disk_outputs.outputs(topology, moved_map)
    assert b_out == reference, "B's outputs differ from a disk server's"
    assert c_out == reference, "C's outputs differ from a disk server's"
    assert d_out == reference, "D's outputs differ from a disk server's after the full restart"


@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("realserver_lock")
@TOPOLOGIES
def test_daemon_mode_across_two_nodes_meets_at_a_rendezvous_of_its_own(
    tiny_model: Path, tmp_path: Path, tp: int
) -> None:
    """A server across the nodes in ``--weight-cache-mode daemon``: the daemons each node spawns meet at a
    port of their own (the plugin's spawn hook), not the engines' (sglang's choice, which fails with
    EADDRINUSE); it serves at version 0 on both ranks."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    servers = two.servers(ServerSpec("daemon-mode", weight_cache_mode="daemon", rebalance_iterations=QUIET))
    try:
        cluster.serve(servers)
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
@pytest.mark.slow("two nodes' daemons; two servers killed at stop points, repairs, a third server")
@pytest.mark.usefixtures("realserver_lock")
@TP4
def test_sigkill_across_two_nodes_between_chunks_and_mid_move_each_node_repairs(
    tiny_model: Path, tmp_path: Path, tp: int, disk_outputs: DiskReferences
) -> None:
    """A, killed on both nodes once its first chunk is committed: every daemon stays clean at that
    version and D adopts it on every rank. D, killed on both nodes once its first chunk moved before
    its commit: each node's daemons repair their torn move by themselves (auto repair), clean at
    the last committed version again, and F adopts it and answers like a disk server with that map."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons()
    try:
        cluster.start_daemons(daemons)
        a = two.servers(_stopping("A", "after_commit", 1))
        try:
            cluster.serve(a)
            park(a, PARK_TIMEOUT_S)
        finally:
            cluster.kill(a)
        after_a = two.wait_states(lambda states: not any(s.get("attached") for s in states), 30.0)
        assert [(s["phase"], s["version"]) for s in after_a] == [("clean", 1)] * topology.tp_size, after_a

        d = two.servers(_stopping("D", "before_commit", 1))
        try:
            cluster.serve(d)
            d_beliefs = cluster.beliefs(d)
            park(d, PARK_TIMEOUT_S)
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

        f_out, f_beliefs = _outputs_and_beliefs(two, "F")
    finally:
        cluster.stop(daemons)
    assert {(b["startup"], b["version"]) for b in f_beliefs.values()} == {("adopt", 1)}, f_beliefs
    assert f_out == disk_outputs.outputs(topology, after_a[0]["map"]), "F's outputs differ from a disk server's"


@pytest.mark.timeout(3600)
@pytest.mark.slow("two nodes' daemons; a primary rebalancing beside a parked standby, the takeover")
@pytest.mark.usefixtures("realserver_lock")
@TP4
def test_a_warm_standby_across_two_nodes_takes_over_from_a_primary_killed_on_both(
    tiny_model: Path, tmp_path: Path, tp: int, disk_outputs: DiskReferences
) -> None:
    """Primary A and warm standby S each span both nodes. S parks on every daemon of both nodes
    while A rebalances; A stops between chunks of its second rebalance and is SIGKILLed on both
    nodes. S must take over on every rank with the daemons' record, and answer like a disk server
    with that map."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons()
    s: list = []
    try:
        cluster.start_daemons(daemons)
        a = two.servers(_stopping("A", "after_commit", 3))
        try:
            cluster.serve(a)
            attached = two.wait_states(lambda states: all(st.get("attached") for st in states), PARK_TIMEOUT_S)
            assert all(st.get("attached") for st in attached), attached
            s = two.servers(ServerSpec("S", rebalance_iterations=QUIET, extra_env={ROLE_ENV: STANDBY}))
            cluster.start(s)
            parked = two.wait_states(lambda states: all(st.get("parked") for st in states), START_TIMEOUT_S)
            assert all(st.get("parked") for st in parked), f"S did not park on every daemon of both nodes: {parked}"
            park(a, PARK_TIMEOUT_S)
            at_kill = two.daemon_states(include_map=True)
            killed_at = time.monotonic()
        finally:
            cluster.kill(a)
        first = s[0].generate_streamed(PROMPTS[1], max_new_tokens=16)
        taken_over_s = (first.first_token or first.done) - killed_at
        s_out = s[0].generate(list(PROMPTS))
        s_beliefs = cluster.beliefs(s)
    finally:
        cluster.stop(s)
        cluster.stop(daemons)
    version, record_map = at_kill[0]["version"], at_kill[0]["map"]
    assert version == 3 and all((st["version"], st["map"]) == (version, record_map) for st in at_kill), at_kill
    assert sorted(s_beliefs) == list(range(topology.tp_size)), s_beliefs
    for rank, belief in s_beliefs.items():
        assert (belief["version"], belief["map"]) == (version, record_map), f"S's rank {rank}: {belief}"
    STANDBY_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # Its time is a figure for the results, not a test's verdict.
    STANDBY_RESULTS.write_text(
        json.dumps({"version": version, "first_token_after_sigkill_s": round(taken_over_s, 3)}) + "\n"
    )
    assert s_out == disk_outputs.outputs(topology, record_map), "S's outputs differ from a disk server's"


@pytest.mark.timeout(3600)
@pytest.mark.slow("two nodes' daemons; a torn move, a refused server, the operator's repair, a server")
@pytest.mark.usefixtures("realserver_lock")
@TP4
def test_ranks_that_find_different_records_on_the_two_nodes_all_fail_with_the_reason(
    tiny_model: Path, tmp_path: Path, tp: int, disk_outputs: DiskReferences
) -> None:
    """A is SIGKILLed on both nodes mid-move in its second chunk. Node 0's daemons repair the torn move
    by themselves; node 1's run with auto repair off and stay dirty. B's ranks then find a clean record
    on node 0 and a dirty one on node 1: B must exit on both nodes by itself, each node's log naming
    the dirty daemons and what to do, no rank left waiting in a collective. After the operator's
    ``expert-layout repair`` on node 1, C adopts the committed version on both nodes."""
    topology = _topology(tiny_model, tp)
    two = cluster.Nodes(tmp_path / "nodes", topology)
    daemons = two.daemons(extra_args={1: (NO_AUTO_REPAIR,)})
    try:
        cluster.start_daemons(daemons)
        a = two.servers(_stopping("A", "before_commit", 2))
        try:
            cluster.serve(a)
            park(a, PARK_TIMEOUT_S)
        finally:
            cluster.kill(a)
        local = two.local_ranks  # daemon states come node by node: node 0's, then node 1's
        apart = two.wait_states(
            lambda st: all(s.get("phase") == "clean" for s in st[:local]) and all(s.get("dirty") for s in st[local:]),
            REPAIR_TIMEOUT_S,
        )
        assert [(s.get("phase"), s.get("version")) for s in apart[:local]] == [("clean", 1)] * local, apart
        assert all(s.get("dirty") and s["dirty"]["base_version"] == 1 for s in apart[local:]), apart

        b = two.servers(ServerSpec("B", rebalance_iterations=QUIET))
        try:
            cluster.start(b)
            with pytest.raises(ServerFailed) as failed:
                b[0].wait_ready(timeout_s=START_TIMEOUT_S)
            node1_alive = _left_running(b[1])
        finally:
            cluster.kill(b)
        assert "exited with code" in str(failed.value), str(failed.value)[-2000:]
        assert not node1_alive, f"B's node 1 still runs {EXIT_TIMEOUT_S:.0f} s after node 0 exited"
        for server in b:  # each node's log says why, and what to do
            refusals = [line for line in server.log_text().splitlines() if STARTUP_REFUSAL in line]
            assert refusals and all("dirty" in line for line in refusals), (server.spec.name, server.log_text()[-3000:])

        done, _seconds = torn_move.run_repair_cli(daemons[1])
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        c = two.servers(ServerSpec("C", rebalance_iterations=QUIET))
        try:
            cluster.serve(c)
            c_beliefs = cluster.beliefs(c)
        finally:
            cluster.stop(c)
    finally:
        cluster.stop(daemons)
    assert sorted(c_beliefs) == list(range(topology.tp_size)), c_beliefs
    assert {(b["startup"], b["version"]) for b in c_beliefs.values()} == {("adopt", 1)}, c_beliefs
