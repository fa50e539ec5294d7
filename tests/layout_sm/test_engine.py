"""docs/protocol.md §5: the engine's findings, and the startup agreement taken on them by the session's
StartupMachine (the chunk decisions and commit checks are in testdata/session/)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from layout_sm.daemon import DaemonMachine, RepairDone
from layout_sm.engine import EngineLayout, Go, RankFinding, RecordStamp, StartupOutcome, needs_wait
from layout_sm.messages import AttachRequest, BeginRequest, CommitRequest
from layout_sm.ready import Attached, FindingsGathered
from layout_sm.reasons import Reason
from layout_sm.record import LayoutRecord, layout_digest
from layout_sm.session import EngineSession

INITIAL = [[0, 1, 2, 3], [3, 2, 1, 0]]
MOVED = [[1, 0, 2, 3], [3, 2, 1, 0]]
V0 = LayoutRecord.initial(INITIAL, 4)
V1 = LayoutRecord.build(MOVED, 4, 1)
ENGINE = EngineLayout(2, 4, 4, layout_digest(INITIAL), routes_by_metadata=True)
# Without the rejoin, a daemon at version 0 beside a moved one is a disagreement (tests/layout_sm/test_rejoin.py).
NO_REJOIN = replace(ENGINE, rejoins=False)


def rec(rank: int, record: LayoutRecord = V0) -> RankFinding:
    return RankFinding(rank, "record", record)


def startup_decision(findings: list[RankFinding], engine: EngineLayout) -> StartupOutcome:
    """What a session agrees on ``findings`` (gathered in rank order): its outcome."""
    ordered = sorted(findings, key=lambda f: f.rank)
    session = EngineSession("E", len(ordered), engine)
    step = session.step(FindingsGathered(ordered)).done
    outcome = session.view().outcome
    assert outcome is not None and (step.go is Go.STOP) == outcome.failed and step.reason == outcome.reason
    return outcome


# -- findings from real daemon machine replies ----------------------------------------------


def test_findings_come_from_attach_replies() -> None:
    daemon = DaemonMachine(V0, auto_repair=False)
    reply = daemon.attach_engine(AttachRequest("A"), "sA")
    finding = RankFinding.from_attach_reply(0, reply.to_wire())
    assert finding.kind == "record" and finding.record == V0 and not needs_wait(finding)
    daemon.begin_move(BeginRequest("A", "sA", 0, (0,)))
    pending = RankFinding.from_attach_reply(1, daemon.attach_engine(AttachRequest("B"), "sB").to_wire())
    assert pending.kind == "pending" and needs_wait(pending) and "'A'" in pending.detail
    daemon.detach_engine("A", "sA")
    dirty = RankFinding.from_attach_reply(1, daemon.attach_engine(AttachRequest("C"), "sC").to_wire())
    assert dirty.kind == "dirty" and "[0]" in dirty.detail
    # A repairing daemon makes the rank wait like a pending move, with the base version's record;
    # its poll after the repair finds the record (spec: MustWait, Poll).
    daemon.begin_repair()
    repairing = RankFinding.from_attach_reply(1, daemon.attach_engine(AttachRequest("D"), "sD").to_wire())
    assert repairing.kind == "pending" and needs_wait(repairing) and repairing.record == V0
    assert "repairing layers [0]" in repairing.detail
    polled = RankFinding.from_query_reply(1, daemon.query_state(include_map=True).to_wire())
    assert polled.kind == "pending" and polled.record == V0
    daemon.handle(RepairDone((0,), "reloaded"))
    polled = RankFinding.from_query_reply(1, daemon.query_state(include_map=True).to_wire())
    assert polled.kind == "record" and polled.record == V0 and not needs_wait(polled)
    assert (
        RankFinding.from_attach_reply(0, DaemonMachine(None).attach_engine(AttachRequest("A"), "s").to_wire()).kind
        == "no_record"
    )
    older = {"status": "error", "message": "Unknown request type: expert_layout_attach"}
    assert RankFinding.from_attach_reply(0, older).kind == "no_record"
    assert RankFinding.from_attach_reply(0, None).kind == "unreadable"
    assert RankFinding.from_attach_reply(0, {"status": "ok"}).kind == "unreadable"


def test_findings_round_trip_for_the_all_gather_without_their_maps() -> None:
    for finding in (rec(0), RankFinding(1, "dirty", detail="x"), rec(0).timed_out(300.0), rec(1, V1)):
        gathered = RankFinding.from_wire(finding.to_wire())
        assert gathered.same_as(finding) and gathered.detail == finding.detail
        assert "map" not in str(finding.to_wire()) and gathered.record == (
            None if finding.record is None else RecordStamp.of_any(finding.record)
        )
    assert not rec(0).same_as(rec(0, V1)) and not rec(0).same_as(rec(1))
    # a rank's own finding keeps its map through the gather; another rank's is a stamp
    session = EngineSession("E", 2, ENGINE)
    session.step(Attached(0, DaemonMachine(V1).handle(AttachRequest("E"), session="s0").reply.to_wire()))
    agreed = session.step(FindingsGathered([RankFinding.from_wire(f.to_wire()) for f in (rec(0, V1), rec(1, V1))]))
    findings = session.view().findings
    assert findings[0].record == V1 and findings[1].record == RecordStamp.of_any(V1)
    assert agreed.done.reason is Reason.ADOPT and agreed.install == V1.rows == session.layout_to_install()


def test_a_waiting_rank_sees_the_move_end_through_query() -> None:
    daemon = DaemonMachine(V0, auto_repair=False)
    daemon.attach_engine(AttachRequest("A"), "sA")
    daemon.begin_move(BeginRequest("A", "sA", 0, (0,)))
    waiting = RankFinding.from_attach_reply(0, daemon.attach_engine(AttachRequest("B"), "sB").to_wire())
    assert waiting.kind == "pending"
    assert RankFinding.from_query_reply(0, daemon.query_state(include_map=True).to_wire()).kind == "pending"
    # The move the rank waited for was committed: the poll reads the new map, not the old one.
    daemon.commit_move(CommitRequest("A", "sA", (0,), (tuple(MOVED[0]),)))
    ended = RankFinding.from_query_reply(0, daemon.query_state(include_map=True).to_wire())
    assert ended.kind == "record" and ended.record == V1
    assert RankFinding.from_query_reply(0, daemon.query_state(include_map=False).to_wire()).kind == "unreadable"
    assert not daemon.begin_move(BeginRequest("A", "sA", 1, (1,))).ok, "B is attached: A must wait"
    daemon.detach_engine("B", "sB")
    assert daemon.begin_move(BeginRequest("A", "sA", 1, (1,))).ok
    daemon.detach_engine("A", "sA")
    assert RankFinding.from_query_reply(0, daemon.query_state(include_map=True).to_wire()).kind == "dirty"


def test_an_attach_that_names_the_engines_digest_gets_the_record_without_its_map() -> None:
    """The map goes on the wire only when the engine needs it: to adopt a moved layout. A record of
    the engine's own initial digest comes as its stamp, and startup keeps the engine's layout."""
    assert "map" in DaemonMachine(V0).attach_engine(AttachRequest("A"), "s").data["record"]  # no digest named
    for record, needs_map in ((V0, False), (V1, True)):
        daemons = [DaemonMachine(record), DaemonMachine(record)]
        session = EngineSession("E", 2, ENGINE)
        request = session.next_request(0)
        assert isinstance(request, AttachRequest) and request.known_digest == ENGINE.initial_digest
        replies = [d.attach_engine(request, f"s{r}").to_wire() for r, d in enumerate(daemons)]
        assert all(("map" in reply["record"]) is needs_map for reply in replies)
        for rank, reply in enumerate(replies):
            assert session.step(Attached(rank, reply)).gathers
        assert isinstance(session.view().findings[0].record, LayoutRecord if needs_map else RecordStamp)
        assert session.step(FindingsGathered(session.view().findings)).done.go is Go.PROCEED
        outcome, view = session.view().outcome, session.view()
        assert outcome is not None and view.digest == record.digest and view.version == record.version
        if needs_map:
            assert outcome.kind == "adopt" and session.layout_to_install() == V1.rows and view.rows == V1.rows
        else:
            assert outcome.kind == "keep_own" and session.layout_to_install() is None and view.rows is None


# -- the agreement ---------------------------------------------------------------------


def test_all_daemons_agree_on_a_moved_layout_adopt_it() -> None:
    outcome = startup_decision([rec(0, V1), rec(1, V1)], ENGINE)
    assert outcome.kind == "adopt" and outcome.record == V1 and outcome.shared_rebalance


def test_daemons_at_the_engines_initial_layout_keep_the_metadata() -> None:
    outcome = startup_decision([rec(0), rec(1)], ENGINE)
    assert outcome.kind == "keep_own" and outcome.shared_rebalance and outcome.record == V0


@pytest.mark.parametrize(
    ("findings", "reason", "needle"),
    [
        ([rec(0, V0), rec(1, V1)], "disagree", "rank 0: version 0, rank 1: version 1"),
        # Same map, different versions (a daemon restarted under the others): not agreed either.
        ([rec(0, LayoutRecord.build(INITIAL, 4, 2)), rec(1, V0)], "disagree", "rank 0: version 2, rank 1: version 0"),
        ([rec(0), RankFinding(1, "unreadable", detail="connection refused")], "unreadable", "rank 1"),
        ([rec(0), RankFinding(1, "dirty", detail="engine 'X' went away")], "dirty", "restart"),
        ([rec(0), rec(1).timed_out(300)], "wait_timeout", "waited 300 s"),
        ([rec(0, V1), RankFinding(1, "no_record")], "mixed_after_move", "ranks [1]"),
    ],
)
def test_startup_fails_with_the_reason(findings: list[RankFinding], reason: str, needle: str) -> None:
    outcome = startup_decision(findings, NO_REJOIN)
    assert outcome.failed and outcome.reason == reason and needle in outcome.message
    assert not outcome.shared_rebalance


def test_daemons_without_record_start_with_own_layout_and_no_shared_rebalance() -> None:
    for findings in (
        [RankFinding(0, "no_record"), RankFinding(1, "no_record")],
        [rec(0), RankFinding(1, "no_record")],
    ):
        outcome = startup_decision(findings, ENGINE)
        assert outcome.kind == "keep_own" and not outcome.shared_rebalance


def test_shape_is_checked_before_adopting() -> None:
    wider = LayoutRecord.build([[0, 1, 2, 3, 0], [3, 2, 1, 0, 1]], 4, 1)
    outcome = startup_decision([rec(0, wider), rec(1, wider)], ENGINE)
    assert outcome.failed and outcome.reason == "shape_mismatch" and "--ep-num-redundant-experts" in outcome.message


def test_an_engine_that_does_not_route_by_metadata_cannot_adopt_a_move() -> None:
    static = EngineLayout(2, 4, 4, layout_digest(INITIAL), routes_by_metadata=False)
    assert startup_decision([rec(0, V1), rec(1, V1)], static).reason == "not_routing_by_metadata"
    assert startup_decision([rec(0), rec(1)], static).kind == "keep_own"


def test_findings_without_a_reply() -> None:
    assert RankFinding.no_daemon(0, "no socket").kind == "no_record"
    assert RankFinding.unreachable(1, "refused").kind == "unreadable"
    assert RankFinding.from_query_reply(1, None).kind == "unreadable"
    # No daemon on any rank: the engine loads from disk with its own layout.
    outcome = startup_decision([RankFinding.no_daemon(0, "x"), RankFinding.no_daemon(1, "x")], ENGINE)
    assert outcome.kind == "keep_own" and not outcome.shared_rebalance


def test_daemons_without_eplb_under_an_engine_with_redundant_slots_get_a_warning_not_a_refusal() -> None:
    """README item 7: sglang never writes the redundant slots of a daemon loaded without EPLB
    metadata. The outcome stays sglang's (keep_own, no record); the operator is told why."""
    no_eplb = [
        RankFinding.from_attach_reply(r, DaemonMachine(None).attach_engine(AttachRequest("A"), "s").to_wire())
        for r in (0, 1)
    ]
    assert all(f.without_eplb for f in no_eplb)
    assert [RankFinding.from_wire(f.to_wire()) for f in no_eplb] == no_eplb  # survives the all-gather
    redundant = EngineLayout(2, 5, 4, layout_digest([[0, 1, 2, 3, 0], [3, 2, 1, 0, 3]]), routes_by_metadata=True)
    outcome = startup_decision(no_eplb, redundant)
    assert (outcome.kind, outcome.reason) == ("keep_own", Reason.NO_RECORD)
    assert "ranks [0, 1]" in outcome.warning and "--enable-eplb" in outcome.warning
    assert "1 redundant expert slot(s)" in outcome.warning
    # no redundant slot, an older daemon (it may have been started with --enable-eplb), or no daemon: silent
    assert startup_decision(no_eplb, ENGINE).warning == ""
    older = {"status": "error", "message": "Unknown request type: expert_layout_attach"}
    silent = [RankFinding.from_attach_reply(0, older), RankFinding.no_daemon(1, "no socket")]
    assert startup_decision(silent, redundant).warning == ""
    # one rank without EPLB next to one at the initial record: still keep_own, still said
    initial = LayoutRecord.initial([[0, 1, 2, 3, 0], [3, 2, 1, 0, 3]], 4)
    mixed = startup_decision([no_eplb[0], RankFinding(1, "record", initial)], redundant)
    assert mixed.reason == Reason.MIXED_INITIAL and "ranks [0]" in mixed.warning
