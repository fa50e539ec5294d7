"""A daemon started from disk rejoins at a moved record on a real standalone daemon set: every layer reloaded.

One set of layout-aware daemons (``python -m daemon_adapter``, TP2/EP2, the tiny Qwen3-MoE) starts from
disk: version 0, the initial layout, as a daemon lost and started again is. The test plays the engine
whose startup found them fresh beside daemons at a moved record (version 4, every layer's row
reversed, so each rank must take experts the other rank loaded): on each rank it attaches and sends
``expert_layout_rejoin`` with that record. Each daemon then reloads the routed experts of every layer
through sglang's loader (the repair's reload, ``daemon_adapter.repair``) and ends clean at version 4
with the record's digest; ``tools.demo.memory_probe`` (a fresh mapping) identifies every slot of every
layer by its weights against the checkpoint and finds the record's map. A second engine attached
beside the asker gets the rejoin refused, and the daemon changes nothing.

It holds the real-server lock (``tests/realserver/conftest.py``) for the daemons' lifetime.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from tools.demo import memory_probe
from tools.realserver import torn_move
from tools.realserver.server import StandaloneDaemons

from daemon_adapter import client
from layout_sm.messages import rejoin_request
from layout_sm.record import layout_digest
from tests.daemon_adapter.real_daemons import tiny_daemon_set

TP = 2
VERSION = 4


@pytest.fixture
def daemon_set() -> Iterator[tuple[StandaloneDaemons, float]]:
    with tiny_daemon_set(TP, "rej-") as started:
        yield started


@pytest.mark.timeout(1800)
def test_a_fresh_daemon_set_rejoins_at_a_moved_record_every_layer_reloaded(
    daemon_set: tuple[StandaloneDaemons, float],
) -> None:
    daemons, start_s = daemon_set
    sockets = [daemons.run.socket_path(rank) for rank in range(TP)]
    fresh = torn_move.queried_states(sockets)
    assert [(s["phase"], s["version"]) for s in fresh] == [("clean", 0)] * TP, fresh
    target = [list(reversed(row)) for row in fresh[0]["map"]]
    assert all(t != row for t, row in zip(target, fresh[0]["map"], strict=True))
    digest = layout_digest(target)

    # Beside another engine the daemon refuses: the rejoin would rewrite weights that engine may map.
    asker, asker_reply = client.attach(sockets[0], "rejoin-engine")
    other, _ = client.attach(sockets[0], "another-engine")
    refused = client.request(
        sockets[0], rejoin_request("rejoin-engine", asker_reply["session"], VERSION, digest, target)
    )
    assert (refused["status"], refused["reason"]) == ("refused", "other_engine_attached"), refused
    assert "'another-engine'" in refused["message"]
    assert torn_move.queried_states(sockets)[0]["version"] == 0
    other.close()
    asker.close()
    torn_move.wait_phase(daemons, "clean", detached=True)

    # The engine's ranks: attach, ask, wait for the reload (as the engine adapter's startup does).
    attachments = [client.attach(path, "rejoin-engine") for path in sockets]
    started = time.monotonic()
    for path, (_, reply) in zip(sockets, attachments, strict=True):
        begun = client.request(path, rejoin_request("rejoin-engine", reply["session"], VERSION, digest, target))
        assert (begun["status"], begun["reason"], begun["version"]) == ("ok", "rejoin_begun", VERSION), begun
    clean = torn_move.wait_phase(daemons, "clean", timeout_s=300.0)
    rejoin_wall_s = time.monotonic() - started
    assert [(s["version"], s["digest"], s["map"]) for s in clean] == [(VERSION, digest, target)] * TP, clean
    held = memory_probe.held_map(sockets, str(daemons.topology.model_path))
    assert held == target, f"memory holds {held}, the record says {target}"
    for conn, _ in attachments:
        conn.close()

    log = daemons.tree.log_path.read_text(errors="replace")
    assert log.count("rejoining: reloading layers") == TP, daemons.tree.log_tail()
    replies = torn_move.logged_repairs(log)
    assert len(replies) == TP and all(r.layers == list(range(len(target))) for r in replies), replies
    loads = re.findall(r"Model loaded from disk in ([0-9.]+)s", log)
    print(
        f"\n[rejoin] daemon set (TP{TP}) start from disk {start_s:.1f} s (sglang's load: {loads} s); rejoin of "
        f"every layer {max(r.seconds for r in replies):.3f} s in the daemons, {rejoin_wall_s:.2f} s seen "
        f"outside; bytes read per rank {[r.bytes_read for r in replies]} of a "
        f"{replies[0].checkpoint_bytes}-byte checkpoint"
    )
