"""DESIGN §5 on real processes: 2 engine ranks over gloo, each attached to its own real daemon."""

from __future__ import annotations

import ea_scripts
from ea_helpers import OtherEngine, rotated_map
from layout_sm.record import layout_digest
from layout_testkit import toy_moe


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


def test_versions_differ_every_rank_fails(ranks, daemons):
    d = daemons()
    other = OtherEngine(d.paths[:1])
    other.move([1], [rotated_map(d.cfg)[1]])
    other.detach()
    res = ranks.run(ea_scripts.start, ea_scripts.spec(d.sockets))
    _all_fail(res, "different layouts", "rank 0: version 1", "rank 1: version 0")


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
