"""docs/protocol.md §6 with sglang's real EPLBManager and ExpertLocationUpdater moving the daemons' own
memory (mapped zero-copy through sglang's torch_ipc transport) between 2 ranks over gloo."""

from __future__ import annotations

import ea_scripts
from ea_helpers import OtherEngine
from tools.harness import daemon_proc, toy_moe

from layout_sm.record import layout_digest


def _ok(results):
    assert all(r.ok for r in results), [r.trace for r in results]
    return [r.value for r in results]


def test_rebalance_in_chunks_moves_the_daemons_memory_and_records_it(ranks, daemons):
    d = daemons()
    cfg = d.cfg
    start = _ok(ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets, layers_per_chunk=1)))
    assert [s["source"] for s in start] == ["daemon", "daemon"]
    out = _ok(ranks.run(ea_scripts.rebalance, 1))
    engine_map = out[0]["map"]
    assert engine_map == out[1]["map"] != toy_moe.trivial_map(cfg)
    for o in out:
        assert o["chunks_committed"] == cfg.num_layers  # one layer per chunk
        assert o["version"] == cfg.num_layers
        assert o["slots"] == o["believed"]  # every slot holds the expert the map names
        assert o["disabled"] is None
    for rank in (0, 1):
        q = d.query(rank, include_map=True)
        assert q["version"] == cfg.num_layers
        assert q["digest"] == layout_digest(engine_map)
        assert q["map"] == engine_map and q["pending"] is None
    ranks.run(ea_scripts.stop)

    # A new engine on the same daemons adopts that version and maps the moved memory.
    nxt = _ok(ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets)))
    assert all(n["kind"] == "adopt" and n["map"] == engine_map for n in nxt)
    held = _ok(ranks.run(ea_scripts.rebalance, 1))  # statistics unchanged: same layout, no move
    assert all(h["slots"] == h["believed"] for h in held)
    ranks.run(ea_scripts.stop)


def test_busy_daemon_pauses_the_rebalance_and_nothing_moves(ranks, daemons):
    d = daemons()
    _ok(ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets)))
    standby = OtherEngine(d.paths[1:], engine_id="engine-standby")  # a warm standby on rank 1's daemon
    out = _ok(ranks.run(ea_scripts.rebalance, 1))
    for o in out:
        assert o["map"] == o["before"] == toy_moe.trivial_map(d.cfg)
        assert o["slots"] == o["believed"]
        assert o["chunks_committed"] == 0 and o["disabled"] is None
    for rank in (0, 1):
        q = d.query(rank)
        assert q["version"] == 0 and q["pending"] is None  # rank 0's begun move was aborted
    standby.detach()
    out = _ok(ranks.run(ea_scripts.rebalance, 1))  # the next interval goes through
    assert all(o["chunks_committed"] == d.cfg.num_layers and o["slots"] == o["believed"] for o in out)
    assert d.query(1)["version"] == d.cfg.num_layers
    ranks.run(ea_scripts.stop)


def test_refused_begin_turns_rebalancing_off(ranks, daemons, cache_configs):
    d = daemons()
    _ok(ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets)))
    # An engine without the plugin fetched rank 0's weights: that daemon refuses moves for good.
    served = daemon_proc.request(d.paths[0], {"type": "fetch_state", "config": cache_configs[0]})
    assert served["status"] == "ok"
    out = _ok(ranks.run(ea_scripts.rebalance, 1))
    for o in out:
        assert o["map"] == o["before"] and o["slots"] == o["believed"]
        assert o["phase"] == "off" and "expert-layout" in o["disabled"]
        assert "rebalance-off:refused" in o["logged"]
    assert d.query(1)["pending"] is None and d.query(1)["version"] == 0  # the ok begin was aborted
    again = _ok(ranks.run(ea_scripts.rebalance, 2))
    assert all(a["steps"] == 0 and a["map"] == a["before"] for a in again)
    ranks.run(ea_scripts.stop)


def test_failed_commit_verification_logs_error_and_stops_rebalancing(ranks, daemons):
    d = daemons()
    _ok(ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets)))
    res = ranks.run_each([(ea_scripts.rebalance, (1,)), (ea_scripts.rebalance, (1, d.procs[1].pid))], timeout=60)
    out = _ok(res)
    for rank, o in enumerate(out):
        assert o["phase"] == "off" and "rebalance-off:commit_unverified" in o["logged"]
        assert "expert-layout" in o["disabled"]
        # Each rank knows its own commit; the all-gather that ends the rebalance finds rank 1's missing.
        assert o["chunks_committed"] == (1 if rank == 0 else 0)
        assert o["slots"] == o["believed"]  # the engine keeps serving its own consistent layout
    assert d.query(0)["version"] == 1  # rank 0's daemon recorded the chunk; rank 1's died
    again = _ok(ranks.run(ea_scripts.rebalance, 2))
    assert all(a["steps"] == 0 and a["map"] == a["before"] for a in again)
    ranks.run(ea_scripts.stop)
