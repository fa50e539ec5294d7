"""docs/protocol.md §5 and §6: the engine's pure decisions and its phase machines."""

from __future__ import annotations

import pytest
from statemachine.exceptions import TransitionNotAllowed

from layout_sm.daemon import DaemonMachine
from layout_sm.engine import (
    EngineLayout,
    RankFinding,
    RebalanceMachine,
    RebalanceMode,
    StartupMachine,
    chunk_decision,
    needs_wait,
    rebalance_mode,
    startup_decision,
    verify_commits,
)
from layout_sm.messages import AttachRequest, BeginRequest, CommitRequest
from layout_sm.reasons import Reason, busy, ok, refused
from layout_sm.record import LayoutRecord, layout_digest

INITIAL = [[0, 1, 2, 3], [3, 2, 1, 0]]
MOVED = [[1, 0, 2, 3], [3, 2, 1, 0]]
V0 = LayoutRecord.initial(INITIAL, 4)
V1 = LayoutRecord.build(MOVED, 4, 1)
ENGINE = EngineLayout(2, 4, 4, layout_digest(INITIAL), routes_by_metadata=True)


def rec(rank: int, record: LayoutRecord = V0) -> RankFinding:
    return RankFinding(rank, "record", record)


# -- findings from real daemon machine replies ----------------------------------------------


def test_findings_come_from_attach_replies() -> None:
    daemon = DaemonMachine(V0)
    reply = daemon.attach_engine(AttachRequest("A"), "sA")
    finding = RankFinding.from_attach_reply(0, reply.to_wire())
    assert finding.kind == "record" and finding.record == V0 and not needs_wait(finding)
    daemon.begin_move(BeginRequest("A", "sA", 0, (0,)))
    pending = RankFinding.from_attach_reply(1, daemon.attach_engine(AttachRequest("B"), "sB").to_wire())
    assert pending.kind == "pending" and needs_wait(pending) and "'A'" in pending.detail
    daemon.detach_engine("A", "sA")
    dirty = RankFinding.from_attach_reply(1, daemon.attach_engine(AttachRequest("C"), "sC").to_wire())
    assert dirty.kind == "dirty" and "[0]" in dirty.detail
    assert (
        RankFinding.from_attach_reply(0, DaemonMachine(None).attach_engine(AttachRequest("A"), "s").to_wire()).kind
        == "no_record"
    )
    older = {"status": "error", "message": "Unknown request type: expert_layout_attach"}
    assert RankFinding.from_attach_reply(0, older).kind == "no_record"
    assert RankFinding.from_attach_reply(0, None).kind == "unreadable"
    assert RankFinding.from_attach_reply(0, {"status": "ok"}).kind == "unreadable"


def test_findings_round_trip_for_the_all_gather() -> None:
    for finding in (rec(0), RankFinding(1, "dirty", detail="x"), rec(0).timed_out(300.0)):
        assert RankFinding.from_wire(finding.to_wire()) == finding


def test_a_waiting_rank_sees_the_move_end_through_query() -> None:
    daemon = DaemonMachine(V0)
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


# -- startup_decision ---------------------------------------------------------------------


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
    outcome = startup_decision(findings, ENGINE)
    assert outcome.failed and outcome.reason == reason and needle in outcome.message
    assert not outcome.shared_rebalance


def test_the_decision_does_not_depend_on_gather_order() -> None:
    findings = [rec(1, V1), RankFinding(0, "dirty", detail="d"), RankFinding(2, "unreadable", detail="u")]
    assert startup_decision(findings, ENGINE) == startup_decision(list(reversed(findings)), ENGINE)


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


# -- rebalance_mode -----------------------------------------------------------------------


def test_rebalance_mode() -> None:
    agreed = startup_decision([rec(0), rec(1)], ENGINE)
    assert rebalance_mode(agreed, ["daemon", "daemon"]) == RebalanceMode(
        True, True, "shared", "rebalancing through the daemons' chunk protocol"
    )
    assert rebalance_mode(None, ["disk", "disk"]).shared is False and rebalance_mode(None, ["disk"]).enabled
    assert rebalance_mode(agreed, ["daemon", "disk"]).reason == "mixed_sources"
    assert rebalance_mode(agreed, ["daemon", "daemon"], elastic_ep=True).reason == "elastic_ep"
    assert rebalance_mode(None, ["daemon", "daemon"]).reason == "not_attached"
    no_record = startup_decision([RankFinding(0, "no_record"), RankFinding(1, "no_record")], ENGINE)
    mode = rebalance_mode(no_record, ["daemon", "daemon"])
    assert not mode.enabled and mode.reason == "no_record"


# -- chunk_decision -----------------------------------------------------------------------

OK = ok(Reason.BEGUN, "begun", version=0)
BUSY = busy(Reason.OTHER_ENGINE_ATTACHED, "C attached")
REFUSED = refused(Reason.STALE_BASE_VERSION, "stale")


@pytest.mark.parametrize(
    ("replies", "kind", "abort_ranks"),
    [
        ([OK, OK], "proceed", ()),
        ([OK, BUSY], "pause", (0,)),
        ([BUSY, OK], "pause", (1,)),
        ([OK, REFUSED], "disable", (0,)),
        ([BUSY, REFUSED], "disable", ()),
        ([REFUSED, BUSY, OK], "disable", (2,)),
        ([OK, None], "disable", (0,)),
    ],
)
def test_chunk_decision(replies: list, kind: str, abort_ranks: tuple[int, ...]) -> None:
    decision = chunk_decision(replies)
    assert (decision.kind, decision.abort_ranks) == (kind, abort_ranks)
    assert chunk_decision([r.to_wire() if r else None for r in replies]) == decision


# -- verify_commits -----------------------------------------------------------------------


def _committed(rows: list[list[int]], version: int = 1) -> object:
    return ok(Reason.COMMITTED, "c", version=version, digest=layout_digest(rows))


def test_commits_verified_against_the_engines_own_digest() -> None:
    verdict = verify_commits([_committed(MOVED), _committed(MOVED)], MOVED, expected_version=1)
    assert verdict.ok and verdict.version == 1 and verdict.digest == layout_digest(MOVED)


@pytest.mark.parametrize(
    "replies",
    [
        [_committed(MOVED), _committed(INITIAL)],  # a daemon recorded another map
        [_committed(INITIAL), _committed(INITIAL)],  # both agree, but not with the engine's map
        [_committed(MOVED), _committed(MOVED, version=2)],
        [_committed(MOVED), refused(Reason.BAD_ROWS, "bad")],
        [_committed(MOVED), None],
    ],
)
def test_inconsistent_commits_fail_verification(replies: list) -> None:
    verdict = verify_commits(replies, MOVED)
    assert not verdict.ok and "restart the weight cache daemons" in verdict.message


def test_expected_version_is_checked() -> None:
    assert not verify_commits([_committed(MOVED, 3), _committed(MOVED, 3)], MOVED, expected_version=2).ok


# -- machines -----------------------------------------------------------------------------


def test_startup_machine_waits_then_decides() -> None:
    machine = StartupMachine()
    machine.send("found", finding=RankFinding(0, "pending", V0, "moving"))
    assert machine.current_state_value == "waiting"
    machine.send("polled", finding=RankFinding(0, "pending", V0, "moving"))
    assert machine.current_state_value == "waiting"
    machine.send("polled", finding=rec(0))
    machine.send("decided", outcome=startup_decision([rec(0, V1)], ENGINE))
    assert machine.current_state_value == "adopted"
    with pytest.raises(TransitionNotAllowed):
        machine.send("found", finding=rec(0))


def test_rebalance_machine_turns_off_for_good() -> None:
    machine = RebalanceMachine()
    machine.send("start", mode=rebalance_mode(startup_decision([rec(0)], ENGINE), ["daemon"]))
    assert machine.phase == "idle" and machine.may_rebalance
    machine.send("chunk")
    machine.send("begun", decision=chunk_decision([BUSY]))
    assert machine.phase == "idle", "busy pauses this rebalance only"
    machine.send("chunk")
    machine.send("begun", decision=chunk_decision([REFUSED]))
    assert machine.phase == "off" and not machine.may_rebalance
    with pytest.raises(TransitionNotAllowed):
        machine.send("chunk")


def test_rebalance_machine_aborts_the_begun_ranks_then_pauses_or_stops() -> None:
    machine = RebalanceMachine()
    machine.send("start", mode=rebalance_mode(startup_decision([rec(0)], ENGINE), ["daemon"]))
    machine.send("chunk")
    paused = chunk_decision([OK, OK, BUSY])
    machine.send("begun", decision=paused)
    assert machine.phase == "aborting"
    machine.send("aborted", decision=paused, left=1)
    assert machine.phase == "aborting"
    machine.send("aborted", decision=paused, left=0)
    assert machine.phase == "idle"
    machine.send("chunk")
    stopped = chunk_decision([OK, REFUSED])
    machine.send("begun", decision=stopped)
    machine.send("aborted", decision=stopped, left=0)
    assert machine.phase == "off"
    with pytest.raises(TransitionNotAllowed):
        machine.send("aborted", decision=stopped, left=0)


def test_rebalance_machine_local_mode_never_uses_the_protocol() -> None:
    machine = RebalanceMachine()
    machine.send("start", mode=rebalance_mode(None, ["disk", "disk"]))
    assert machine.phase == "local"
    with pytest.raises(TransitionNotAllowed):
        machine.send("chunk")


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
