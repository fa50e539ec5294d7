"""sglang's real IpcModelLoader with the plugin: the fetch_state field, and refusals that raise."""

from __future__ import annotations

import ea_scripts
from ea_helpers import OtherEngine, rotated_map
from tools.harness import toy_moe


def test_the_loader_sends_the_layout_field(ranks, daemons):
    d = daemons()
    moved = rotated_map(d.cfg, shift=2)
    other = OtherEngine(d.paths)
    other.move([0, 1, 2, 3], moved)  # after a move only an engine that sends its layout is served
    other.detach()
    res = ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets))
    assert all(r.ok for r in res), [r.trace for r in res]
    for r in res:
        assert r.value["kind"] == "adopt" and r.value["source"] == "daemon"
        q = d.query(r.rank)
        assert q["non_following_seen"] is False  # served as a following, attached engine
        assert q["attached"] == [r.value["engine_id"]]
    ranks.run(ea_scripts.stop)


def test_layout_refused_raises_with_the_daemons_reason_and_never_loads_from_disk(ranks, daemons):
    d = daemons()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    assert all(r.ok and r.value["version"] == 0 for r in res)
    # Between startup and load, rank 1's daemon is restarted and another engine moves experts.
    d.procs[1].restart()
    other = OtherEngine(d.paths[1:])
    other.move([1], [rotated_map(d.cfg)[1]])
    other.detach()
    res = ranks.run(ea_scripts.load)
    assert res[0].ok and res[0].value["source"] == "daemon"
    assert not res[1].ok and res[1].kind == "error"
    assert res[1].error.startswith("LayoutRefusedError")
    assert "digest_mismatch" in res[1].error and "version 1" in res[1].error
    after = ranks.run(ea_scripts.current)
    assert after[1].value["source"] is None  # nothing was loaded, from the daemon or from disk
    ranks.run(ea_scripts.stop)


def test_load_source_is_recorded_per_rank_and_mixed_sources_do_not_rebalance(ranks, daemons):
    d = daemons(absent=(False, True))  # rank 1 has no daemon: sglang's client mode loads from disk
    res = ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets))
    assert all(r.ok for r in res), [r.trace for r in res]
    assert [r.value["source"] for r in res] == ["daemon", "disk"]
    out = ranks.run(ea_scripts.rebalance, 1)
    assert all(o.ok for o in out), [o.trace for o in out]
    for o in out:
        assert o.value["mode"] == "mixed_sources" and o.value["phase"] == "off"
        assert o.value["map"] == toy_moe.trivial_map(d.cfg) and o.value["steps"] == 0
    assert d.query(0)["version"] == 0
    ranks.run(ea_scripts.stop)
