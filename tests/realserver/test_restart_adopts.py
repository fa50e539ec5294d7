"""Case 1 on real servers, and the protocol's metrics, on one set of standalone daemons (one module fixture).

Server A (``python -m sglang.launch_server``, TP2/EP2, 2 redundant experts, ``--enable-eplb``, one layer
per chunk, ``--weight-cache-mode client``, sglang's ``--enable-metrics``) rebalances on standalone
layout-aware daemons (``python -m daemon_adapter``) until they are at version 2 or more. Its ``/metrics``
(sglang's, prometheus_client in multiprocess mode, every scheduler process merged) must then show, per
rank (sglang's ``tp_rank`` label), the record version and chunks committed equal to the daemons'
version, one ``keep_own`` startup and a protocol time per rebalance. Then a warm standby (a bare
attachment) holds rank 1's daemon: the next rebalances pause, and ``/metrics`` counts them with the
daemon's reason (``other_engine_attached``) on both ranks while the version stays; ``expert-layout
status --prometheus`` shows the daemons' own series.

A stops, and server B starts on the same daemons: every rank must adopt the daemons' version and map,
and B's greedy outputs must equal those of a server that loads the weights from disk with
``--init-expert-location`` set to that map.

Then every daemon is SIGKILLed and started again, twice. First with every durable copy whole: each
daemon starts from its copy, at A's version and map, and server C adopts them on every rank. Then
with rank 1's copy truncated (a write cut short by a disk fault): rank 1's daemon sets the file aside,
says why in ``expert-layout status`` and starts at the initial layout, version 0, while rank 0's
starts from its copy; server D's startup has rank 1's daemon rejoin (it alone reloads) and adopts A's
version on every rank. C's and D's greedy outputs must equal the disk server's too.

Run with the plugin off in B (``EXPERT_LAYOUT_TEST_B_PLUGINS=none``: B with ``SGLANG_PLUGINS=none``)
the restart test fails: B never becomes ready, because the layout-aware daemons refuse its
``fetch_state`` after A's moves (an engine that does not send its expert layout).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tools.realserver.model import PROMPTS
from tools.realserver.server import (
    DiskReferences,
    RealServer,
    RunDir,
    ServerFailed,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
)

from daemon_adapter import client
from daemon_adapter.durable import copy_path
from tests.realserver.conftest import daemon_versions, drive_until_version

# The rule the restart test checks can be broken from outside: B's SGLANG_PLUGINS (None: all plugins).
B_PLUGINS = os.environ.get("EXPERT_LAYOUT_TEST_B_PLUGINS") or None
QUIET = 100_000  # rebalance iterations for servers that must not rebalance during the test
P = "sglang:expert_layout_"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(server: RealServer) -> Series:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(P)
    }


def _per_rank(series: Series, name: str, **labels: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, ls), value in series.items():
        d = dict(ls)
        if n == name and labels.items() <= d.items():
            out[int(d["tp_rank"])] = out.get(int(d["tp_rank"]), 0.0) + value
    return out


@dataclass
class OneDaemonSet:
    """What A and B did on the module's daemons."""

    run: RunDir
    topology: Topology
    version: int  # the daemons' version when A stopped rebalancing
    moved: Series  # A's /metrics once the daemons reached ``version``
    paused: Series  # A's /metrics once a rebalance paused on every rank beside the bare attachment
    versions_while_paused: list[int | None]
    prometheus: subprocess.CompletedProcess[str]  # expert-layout status --prometheus, the attachment held
    moved_map: list[list[int]] | None  # the daemons' map after A (None: the daemons disagree)
    status: dict[str, Any]
    beliefs: dict[int, dict[str, Any]]  # B's ranks'
    b_out: list[list[int]] | None  # None: B did not become ready
    b_failure: str
    restarts: list[FullRestart]  # every daemon SIGKILLed and started again: copies whole, then one torn


@dataclass
class FullRestart:
    """Every daemon SIGKILLed and started again from its durable copy, and the server that started next."""

    status: dict[str, Any]  # expert-layout status --json of the daemons, started again
    beliefs: dict[int, dict[str, Any]]
    out: list[list[int]] | None  # None: the server did not become ready
    failure: str
    reloaded: list[int]  # each rank's daemon's rejoin reloads (its log's lines)


def _full_restart(
    run: RunDir, topology: Topology, daemons: list[StandaloneDaemons], name: str, spoil: Callable[[int, Path], None]
) -> FullRestart:
    """SIGKILL every daemon; ``spoil`` the copies' files as a fault would; start them again; start a server."""
    daemons[-1].kill()
    for rank in range(topology.tp_size):
        file = copy_path(run.socket_path(rank))
        assert file is not None and file.exists(), f"rank {rank}'s daemon wrote no durable copy"
        spoil(rank, file)
    daemons.append(StandaloneDaemons(run, topology, name=f"daemons-{name}").start())
    daemons[-1].wait_ready()
    status = daemon_status(run, include_map=True)
    out, failure, beliefs = _serve(RealServer(run, topology, ServerSpec(name, rebalance_iterations=QUIET)))
    log = daemons[-1].tree.log_path.read_text(errors="replace")
    reloaded = [log.count(f"[LayoutAwareDaemon gpu={rank}] rejoining: reloading") for rank in range(topology.tp_size)]
    return FullRestart(status, beliefs, out, failure, reloaded)


def _serve(server: RealServer) -> tuple[list[list[int]] | None, str, dict[int, dict[str, Any]]]:
    """Start ``server``, read what its ranks route with and its greedy outputs, stop it: (outputs, or None
    when it did not become ready; why not; its ranks' beliefs)."""
    server.start()
    try:
        server.wait_ready()
        beliefs = server.beliefs()
        return server.generate(list(PROMPTS)), "", beliefs
    except ServerFailed as failed:
        return None, str(failed)[-3000:], {}
    finally:
        server.stop()


def _truncate_rank1(rank: int, file: Path) -> None:
    if rank == 1:
        file.write_bytes(file.read_bytes()[:100])


def _until_paused(a: RealServer, ranks: list[int]) -> Series:
    after: Series = {}
    for _ in range(40):
        a.generate(list(PROMPTS), max_new_tokens=16)
        after = _scrape(a)
        paused = _per_rank(after, f"{P}rebalances_paused_total", reason="other_engine_attached")
        if len(paused) == len(ranks) and all(v >= 1 for v in paused.values()):
            break
        time.sleep(0.2)
    return after


def _prometheus(run: RunDir, ranks: list[int]) -> subprocess.CompletedProcess[str]:
    sockets = [arg for rank in ranks for arg in ("--socket", run.socket_path(rank))]
    env = dict(os.environ, SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=run.socket_template)
    return subprocess.run(
        [sys.executable, "-m", "daemon_adapter.status_cli", "status", "--prometheus", *sockets],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.fixture(scope="module")
def one_daemon_set(
    realserver_lock: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OneDaemonSet]:
    run = RunDir(tmp_path_factory.mktemp("restart") / "run")
    topology = Topology(tiny_model)
    ranks = list(range(topology.tp_size))
    daemons = [StandaloneDaemons(run, topology).start()]
    restarts: list[FullRestart] = []
    try:
        daemons[0].wait_ready()
        spec = ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, extra_args=("--enable-metrics",))
        a = RealServer(run, topology, spec).start()
        try:
            a.wait_ready()
            version = drive_until_version(a, run, list(PROMPTS), at_least=2)
            moved = _scrape(a)
            # A warm standby on rank 1's daemon: the next rebalances pause on every rank.
            standby, reply = client.attach(run.socket_path(1), "engine-standby")
            assert reply["status"] == "ok", reply
            try:
                paused = _until_paused(a, ranks)
                versions_while_paused = daemon_versions(run)
                prometheus = _prometheus(run, ranks)
            finally:
                standby.close()
        finally:
            a.stop()
        status = daemon_status(run, include_map=True)
        maps = [d["state"]["map"] for d in status["daemons"]]
        moved_map = maps[0] if len(maps) == topology.tp_size and all(m == maps[0] for m in maps) else None

        b_out, b_failure, beliefs = _serve(
            RealServer(run, topology, ServerSpec("B", rebalance_iterations=QUIET, plugins=B_PLUGINS))
        )
        restarts.append(_full_restart(run, topology, daemons, "C", lambda rank, file: None))
        restarts.append(_full_restart(run, topology, daemons, "D", _truncate_rank1))
    finally:
        daemons[-1].stop()
    yield OneDaemonSet(
        run, topology, version, moved, paused, versions_while_paused, prometheus, moved_map, status, beliefs, b_out,
        b_failure, restarts,
    )  # fmt: skip


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock and the module's servers
@pytest.mark.slow("the module's daemon set: A rebalances and pauses beside a bare attachment, then B starts")
@pytest.mark.usefixtures("realserver_lock")
def test_metrics_after_a_rebalance_and_a_paused_one(one_daemon_set: OneDaemonSet) -> None:
    ran = one_daemon_set
    ranks, version, moved, after = list(range(ran.topology.tp_size)), ran.version, ran.moved, ran.paused
    assert _per_rank(moved, f"{P}record_version") == dict.fromkeys(ranks, version), moved
    assert _per_rank(moved, f"{P}chunks_committed_total") == dict.fromkeys(ranks, version), moved
    assert _per_rank(moved, f"{P}startups_total", outcome="keep_own") == dict.fromkeys(ranks, 1), moved
    assert _per_rank(moved, f"{P}hooks_missing") == dict.fromkeys(ranks, 0), moved
    assert all(n >= 1 for n in _per_rank(moved, f"{P}rebalance_protocol_seconds_count").values()), moved
    labels = dict(next(ls for (n, ls) in moved if n == f"{P}record_version"))
    assert {"model_name", "tp_rank", "pp_rank", "moe_ep_rank"} <= labels.keys()  # sglang's own labels

    # Beside the bare attachment on rank 1's daemon the next rebalances paused on every rank.
    paused = _per_rank(after, f"{P}rebalances_paused_total", reason="other_engine_attached")
    assert len(paused) == len(ranks) and all(v >= 1 for v in paused.values()), after
    assert ran.versions_while_paused == [version] * len(ranks)  # nothing moved while paused
    assert _per_rank(after, f"{P}chunks_committed_total") == dict.fromkeys(ranks, version)
    assert _per_rank(after, f"{P}record_version") == dict.fromkeys(ranks, version)

    # The daemons' own series, for a node exporter's textfile collector.
    done = ran.prometheus
    assert done.returncode == 0, done.stderr
    of_rank1 = f'{{socket="{ran.run.socket_path(1)}"}}'
    assert f"sglang:expert_layout_daemon_record_version{of_rank1} {version}.0" in done.stdout, done.stdout
    assert f"sglang:expert_layout_daemon_attached_engines{of_rank1} 2.0" in done.stdout, done.stdout


@pytest.mark.timeout(3600)
@pytest.mark.slow("the module's daemon set (above), then a disk reference, shared by the session")
@pytest.mark.usefixtures("realserver_lock")
def test_restart_adopts_the_daemons_layout_and_serves_like_disk(
    one_daemon_set: OneDaemonSet, disk_outputs: DiskReferences
) -> None:
    ran = one_daemon_set
    assert ran.moved_map is not None, f"the daemons hold different maps after A: {ran.status}"
    assert ran.version == ran.status["daemons"][0]["state"]["version"]
    assert ran.b_out is not None, f"B did not become ready on A's daemons:\n{ran.b_failure}"
    assert sorted(ran.beliefs) == list(range(ran.topology.tp_size)), f"a rank wrote no belief: {ran.beliefs}"
    for rank, belief in ran.beliefs.items():
        assert belief["map"] == ran.moved_map, f"rank {rank} routes with another map than the daemons hold"
        assert belief["version"] == ran.version, f"rank {rank} at version {belief['version']}, daemons at {ran.version}"
        assert belief["startup"] == "adopt", f"rank {rank} startup was {belief['startup']}"
    reference = disk_outputs.outputs(ran.topology, ran.moved_map)
    assert ran.b_out == reference, "B's greedy outputs differ from a disk-loaded server's with the same map"


@pytest.mark.timeout(3600)
@pytest.mark.slow("the module's daemon set (above): every daemon killed and started again, twice")
@pytest.mark.usefixtures("realserver_lock")
def test_every_daemon_killed_starts_again_from_its_copy_and_the_next_server_adopts_it(
    one_daemon_set: OneDaemonSet, disk_outputs: DiskReferences
) -> None:
    ran = one_daemon_set
    assert ran.moved_map is not None, f"the daemons hold different maps after A: {ran.status}"
    reference = disk_outputs.outputs(ran.topology, ran.moved_map)
    whole, torn = ran.restarts
    ranks = list(range(ran.topology.tp_size))

    # Every copy whole: every daemon starts again at A's version and map, and C adopts them.
    states = [d["state"] for d in whole.status["daemons"]]
    assert [(s["phase"], s["version"], s["map"]) for s in states] == [("clean", ran.version, ran.moved_map)] * len(
        ranks
    ), states
    assert all(s["durable"]["at_start"]["kind"] == "whole" for s in states), states
    assert whole.out is not None, f"C did not become ready after the full restart:\n{whole.failure}"
    assert sorted(whole.beliefs) == ranks, whole.beliefs
    for rank, belief in whole.beliefs.items():
        assert (belief["version"], belief["map"], belief["startup"]) == (ran.version, ran.moved_map, "adopt"), (
            f"C's rank {rank}: {belief}"
        )
    assert whole.reloaded == [0] * len(ranks), "a daemon that started from its whole copy reloaded"
    assert whole.out == reference, "C's greedy outputs differ from a disk-loaded server's with the same map"

    # Rank 1's copy truncated: it starts at version 0 and says why; D has it rejoin, and it alone reloads.
    states = [d["state"] for d in torn.status["daemons"]]
    assert [(s["version"], s["durable"]["at_start"]["kind"]) for s in states] == [(ran.version, "whole"), (0, "torn")]
    assert "not whole JSON" in states[1]["durable"]["at_start"]["why"], states[1]
    assert torn.out is not None, f"D did not become ready beside a torn copy:\n{torn.failure}"
    for rank, belief in torn.beliefs.items():
        assert (belief["version"], belief["map"]) == (ran.version, ran.moved_map), f"D's rank {rank}: {belief}"
    assert torn.reloaded == [0, 1], f"the rejoin's reloads by rank: {torn.reloaded}"
    assert torn.out == reference, "D's greedy outputs differ from a disk-loaded server's with the same map"
