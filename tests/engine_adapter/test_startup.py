"""docs/protocol.md §5 on real processes: 2 engine ranks over gloo, each attached to its own real daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import ea_scripts
from ea_helpers import OtherEngine, rotated_map
from tools.harness import toy_moe

from layout_sm.record import layout_digest

FAST_POLL = (("SGLANG_EXPERT_LAYOUT_POLL_INTERVAL", "0.1"),)


def _all_fail(results, *needles: str) -> str:
    """Every rank failed (none hung), with the same message naming ``needles``."""
    assert [r.kind for r in results] == ["error", "error"], [(r.kind, r.error, r.trace) for r in results]
    assert results[0].error == results[1].error
    for needle in needles:
        assert needle in results[0].error, results[0].error
    assert results[0].error.startswith("ExpertLayoutStartupError")
    return results[0].error


def test_all_daemons_agree_initial_and_after_a_move(ranks, daemons):
    d = daemons()
    spec = ea_scripts.spec(d.sockets)
    res = ranks.run(ea_scripts.start, spec)
    assert all(r.ok for r in res), [r.trace for r in res]
    cfg = d.cfg
    assert [r.value["kind"] for r in res] == ["keep_own", "keep_own"]
    assert all(r.value["shared"] and r.value["attached"] for r in res)
    assert res[0].value["map"] == toy_moe.trivial_map(cfg)
    assert res[0].value["engine_id"] == res[1].value["engine_id"]
    ranks.run(ea_scripts.stop)

    moved = rotated_map(cfg)
    other = OtherEngine(d.paths)
    other.move([0, 2], [moved[0], moved[2]])
    other.detach()
    res = ranks.run(ea_scripts.start, spec)
    assert all(r.ok for r in res), [r.trace for r in res]
    expect = toy_moe.trivial_map(cfg)
    expect[0], expect[2] = moved[0], moved[2]
    for r in res:
        assert r.value["kind"] == "adopt"
        assert r.value["map"] == expect
        assert r.value["version"] == 1
        assert r.value["digest"] == layout_digest(expect) == d.query(r.rank)["digest"]
    ranks.run(ea_scripts.stop)


def test_records_differ_every_rank_fails(ranks, daemons):
    d = daemons()
    for path, layer, engine_id in ((d.paths[0], 1, "engine-A"), (d.paths[1], 2, "engine-B")):
        other = OtherEngine([path], engine_id=engine_id)
        other.move([layer], [rotated_map(d.cfg)[layer]])
        other.detach()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "different layouts", "rank 0: version 1", "rank 1: version 1")


def test_a_fresh_daemon_beside_a_moved_one_is_asked_to_rejoin(ranks, daemons):
    """Rank 1's daemon is at version 0 beside rank 0's at version 1: the ranks gather the map, rank 1 asks
    its daemon to rejoin and waits; these daemons hold no model to reload (``daemon_proc``), so the
    reload fails, the daemon turns dirty, and every rank fails with that reason after the second
    all-gather (a daemon that reloads: tests/daemon_adapter/test_rejoin_real.py)."""
    d = daemons()
    other = OtherEngine(d.paths[:1])
    other.move([1], [rotated_map(d.cfg)[1]])
    other.detach()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "dirty", "rank 1", "its rejoin at version 1", "model is not loaded")
    state = d.query(1)
    assert state["phase"] == "dirty" and state["dirty"]["rejoin"] is True, state


def test_one_rank_cannot_read_its_daemon(ranks, daemons):
    d = daemons()
    d.procs[1].kill()  # a crash: the socket file stays, nobody answers
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "could not read", "rank 1")


def test_one_daemon_dirty(ranks, daemons):
    d = daemons()
    other = OtherEngine(d.paths[1:], engine_id="engine-crashed")
    assert other.begin([3])[0]["status"] == "ok"
    other.detach()  # gone mid-move: the daemon cannot know its layout any more
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "dirty", "engine-crashed", "rank 1", "restart the weight cache daemons")


def test_pending_move_clears_during_the_wait(ranks, daemons):
    d = daemons()
    moved = rotated_map(d.cfg, shift=3)
    other = OtherEngine(d.paths)
    assert all(r["status"] == "ok" for r in other.begin([1]))

    def finish() -> None:
        other.commit([1], [moved[1]])
        other.detach()

    timer = threading.Timer(1.5, finish)
    timer.start()
    t0 = time.monotonic()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets, wait_timeout=30, env=FAST_POLL), timeout=60)
    waited = time.monotonic() - t0
    timer.join()
    assert all(r.ok for r in res), [r.trace for r in res]
    expect = toy_moe.trivial_map(d.cfg)
    expect[1] = moved[1]
    assert [r.value["kind"] for r in res] == ["adopt", "adopt"]
    assert all(r.value["map"] == expect and r.value["version"] == 1 for r in res)
    assert waited >= 1.5
    ranks.run(ea_scripts.stop)


def test_pending_move_stuck_until_the_timeout(ranks, daemons):
    d = daemons()
    other = OtherEngine(d.paths, engine_id="engine-stuck")
    assert all(r["status"] == "ok" for r in other.begin([0, 3]))
    t0 = time.monotonic()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets, wait_timeout=1.0, env=FAST_POLL), timeout=60)
    assert time.monotonic() - t0 < 30
    _all_fail(res, "timed out", "engine-stuck", "[0, 3]", "rank 0", "rank 1")
    other.detach()


def test_record_and_no_record_mixed(ranks, daemons):
    d = daemons(maps=("trivial", None))  # rank 1's daemon runs without --enable-eplb
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    assert all(r.ok for r in res), [r.trace for r in res]
    assert [r.value["kind"] for r in res] == ["keep_own", "keep_own"]
    assert not any(r.value["shared"] for r in res)
    assert res[0].value["map"] == toy_moe.trivial_map(d.cfg)
    ranks.run(ea_scripts.stop)

    other = OtherEngine(d.paths[:1])
    other.move([2], [rotated_map(d.cfg)[2]])
    other.detach()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "without a record", "ranks [1]", "ranks [0]", "versions [1]")


def test_shape_and_routing_are_checked_before_adopting(ranks, daemons):
    d = daemons()
    other = OtherEngine(d.paths)
    other.move([0], [rotated_map(d.cfg)[0]])
    other.detach()
    narrow = toy_moe.ToyMoEConfig(num_redundant=0)  # another --ep-num-redundant-experts
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets, cfg=narrow))
    _all_fail(res, "--ep-num-redundant-experts", "10 physical", "8 of 8")
    static_layout = ea_scripts.spec(d.sockets, enable_eplb=False)  # routes by the static layout
    res = ranks.run(ea_scripts.start, static_layout)
    _all_fail(res, "--enable-eplb", "version 1")


def test_forked_child_outlives_the_engine_and_the_daemon_still_sees_the_detach(ranks, daemons):
    # Last in this file: it SIGKILLs the pool's rank processes (the next test restarts them).
    d = daemons()
    res = ranks.run(ea_scripts.start_load_fork, ea_scripts.spec(d.sockets), 60.0, 1)
    assert all(r.ok for r in res), [r.trace for r in res]
    engine_id = res[0].value["engine_id"]
    assert all(d.query(rank)["attached"] == [engine_id] for rank in (0, 1))
    children = [r.value["child"] for r in res]
    control = res[1].value["control"]  # holds rank 1's attach socket on purpose
    try:
        for r in res:
            os.kill(r.value["pid"], signal.SIGKILL)
        ranks.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and d.query(0)["attached"]:
            time.sleep(0.05)
        assert all(_alive(pid) for pid in [*children, control])  # the children still run...
        assert d.query(0)["attached"] == []  # ...and the dead engine is detached from rank 0's daemon;
        time.sleep(0.5)
        assert d.query(1)["attached"] == [engine_id]  # the control's explicit holder keeps rank 1's
        os.kill(control, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and d.query(1)["attached"]:
            time.sleep(0.05)
        assert d.query(1)["attached"] == []
    finally:
        for pid in [*children, control]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
