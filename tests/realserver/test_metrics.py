"""The protocol's series on a real server's ``/metrics`` (sglang's ``--enable-metrics``), and the
daemons' series from ``expert-layout status --prometheus``.

Server A (TP2/EP2, 2 redundant experts, ``--enable-eplb``, one layer per chunk, ``--weight-cache-mode
client``) on standalone layout-aware daemons rebalances until the daemons are at version 2 or more;
its ``/metrics`` (sglang's, prometheus_client in multiprocess mode, every scheduler process merged)
must then show, per rank (sglang's ``tp_rank`` label), the record version and chunks committed equal
to the daemons' version, one ``keep_own`` startup and a protocol time per rebalance. Then a warm
standby (a bare attachment) holds rank 1's daemon: the next rebalances pause, and ``/metrics`` counts
them with the daemon's reason (``other_engine_attached``) on both ranks while the version stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tools.realserver.model import PROMPTS
from tools.realserver.server import RealServer, RunDir, ServerSpec, StandaloneDaemons, Topology

from daemon_adapter import client
from tests.realserver.conftest import daemon_versions, drive_until_version

P = "sglang:expert_layout_"


def _scrape(server: RealServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(P)
    }


def _per_rank(series: dict, name: str, **labels: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, ls), value in series.items():
        d = dict(ls)
        if n == name and labels.items() <= d.items():
            out[int(d["tp_rank"])] = out.get(int(d["tp_rank"]), 0.0) + value
    return out


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
@pytest.mark.usefixtures("realserver_lock")
def test_metrics_after_a_rebalance_and_a_paused_one(tiny_model: Path, run_dir: RunDir) -> None:
    topology = Topology(tiny_model)
    ranks = list(range(topology.tp_size))
    prompts = list(PROMPTS)
    daemons = StandaloneDaemons(run_dir, topology).start()
    try:
        daemons.wait_ready()
        spec = ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, extra_args=("--enable-metrics",))
        a = RealServer(run_dir, topology, spec).start()
        try:
            a.wait_ready()
            version = drive_until_version(a, run_dir, prompts, at_least=2)
            moved = _scrape(a)
            assert _per_rank(moved, f"{P}record_version") == dict.fromkeys(ranks, version), moved
            assert _per_rank(moved, f"{P}chunks_committed_total") == dict.fromkeys(ranks, version), moved
            assert _per_rank(moved, f"{P}startups_total", outcome="keep_own") == dict.fromkeys(ranks, 1), moved
            assert _per_rank(moved, f"{P}hooks_missing") == dict.fromkeys(ranks, 0), moved
            assert all(n >= 1 for n in _per_rank(moved, f"{P}rebalance_protocol_seconds_count").values()), moved
            labels = dict(next(ls for (n, ls) in moved if n == f"{P}record_version"))
            assert {"model_name", "tp_rank", "pp_rank", "moe_ep_rank"} <= labels.keys()  # sglang's own labels

            # A warm standby on rank 1's daemon: the next rebalances pause on every rank.
            standby, reply = client.attach(run_dir.socket_path(1), "engine-standby")
            assert reply["status"] == "ok", reply
            try:
                paused: dict[int, float] = {}
                for _ in range(40):
                    a.generate(prompts, max_new_tokens=16)
                    after = _scrape(a)
                    paused = _per_rank(after, f"{P}rebalances_paused_total", reason="other_engine_attached")
                    if len(paused) == len(ranks) and all(v >= 1 for v in paused.values()):
                        break
                    time.sleep(0.2)
                assert len(paused) == len(ranks) and all(v >= 1 for v in paused.values()), after
                assert daemon_versions(run_dir) == [version] * len(ranks)  # nothing moved while paused
                assert _per_rank(after, f"{P}chunks_committed_total") == dict.fromkeys(ranks, version)
                assert _per_rank(after, f"{P}record_version") == dict.fromkeys(ranks, version)

                # The daemons' own series, for a node exporter's textfile collector.
                sockets = [arg for rank in ranks for arg in ("--socket", run_dir.socket_path(rank))]
                env = dict(os.environ, SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=run_dir.socket_template)
                done = subprocess.run(
                    [sys.executable, "-m", "daemon_adapter.status_cli", "status", "--prometheus", *sockets],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=60,
                )
                assert done.returncode == 0, done.stderr
                of_rank1 = f'{{socket="{run_dir.socket_path(1)}"}}'
                assert f"sglang:expert_layout_daemon_record_version{of_rank1} {version}.0" in done.stdout, done.stdout
                assert f"sglang:expert_layout_daemon_attached_engines{of_rank1} 2.0" in done.stdout, done.stdout
            finally:
                standby.close()
        finally:
            a.stop()
    finally:
        daemons.stop()
