"""Compatibility: new engine on an older daemon, older engine on a new daemon, daemon without
--enable-eplb (each on real processes)."""

from __future__ import annotations

import ea_scripts
from ea_helpers import OtherEngine, rotated_map
from tools.harness import toy_moe


def _rebalance_stays_off(ranks, d, mode: str) -> None:
    out = ranks.run(ea_scripts.rebalance, 1)
    assert all(o.ok for o in out), [o.trace for o in out]
    for o in out:
        assert o.value["mode"] == mode and o.value["phase"] == "off"
        assert o.value["steps"] == 0 and o.value["map"] == toy_moe.trivial_map(d.cfg)
        assert o.value["slots"] == o.value["believed"]
        assert any(key.startswith("rebalance-off:") for key in o.value["logged"])  # the warning


def test_new_engine_on_older_daemon(ranks, daemons):
    d = daemons(plain=(True, True))  # sglang's own daemon: "Unknown request type" for the layout requests
    res = ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets))
    assert all(r.ok for r in res), [r.trace for r in res]
    for r in res:
        assert r.value["kind"] == "keep_own" and not r.value["shared"]
        assert r.value["source"] == "daemon"  # sglang's daemon ignores the extra field
    _rebalance_stays_off(ranks, d, "no_record")
    ranks.run(ea_scripts.stop)


def test_daemon_without_enable_eplb(ranks, daemons):
    d = daemons(maps=(None, None))
    res = ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets))
    assert all(r.ok for r in res), [r.trace for r in res]
    assert all(r.value["kind"] == "keep_own" and r.value["source"] == "daemon" for r in res)
    assert d.query(0)["has_record"] is False
    _rebalance_stays_off(ranks, d, "no_record")
    ranks.run(ea_scripts.stop)


def test_older_engine_served_at_v0_and_refused_after_a_move(ranks, daemons):
    d = daemons()
    older = ea_scripts.spec(d.sockets, plugin=False)  # an engine without this plugin
    res = ranks.run(ea_scripts.start_load, older)
    assert all(r.ok and r.value["loaded"] == "daemon" and not r.value["attached"] for r in res)
    assert all(d.query(rank)["non_following_seen"] for rank in (0, 1))
    ranks.run(ea_scripts.stop)

    fresh = daemons()
    other = OtherEngine(fresh.paths)
    other.move([2], [rotated_map(fresh.cfg)[2]])
    other.detach()
    res = ranks.run(ea_scripts.start_load, ea_scripts.spec(fresh.sockets, plugin=False))
    # sglang's loader reads any non-ok reply as a config mismatch and raises: it never loads.
    assert [r.kind for r in res] == ["error", "error"]
    assert all("Daemon config mismatch" in r.error for r in res)
    assert "older_engine_after_move" in fresh.log(0) or "does not send its expert layout" in fresh.log(0)
    ranks.run(ea_scripts.stop)
