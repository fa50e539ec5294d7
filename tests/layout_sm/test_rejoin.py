"""A daemon started again from disk rejoins at the record the other daemons hold (spec: Lose, AskRejoin).

The daemon's rule (``DaemonMachine.rejoin_layout``): only a daemon whose record is older than the one it
rejoins at, with no engine attached but the asker and none served without attaching, and only at a moved
map of its own shape; it then repairs every layer. The engine's (``EngineSession``): its agreement has the
ranks behind rejoin when the daemons at the newest version hold one record, and fails with the reason when
a daemon refuses.
"""

from __future__ import annotations

import pytest

from layout_sm.daemon import DaemonMachine, RepairDone
from layout_sm.engine import EngineLayout, Go, RankFinding
from layout_sm.messages import (
    AttachRequest,
    BeginRequest,
    CommitRequest,
    RejoinRequest,
    parse_request,
    rejoin_request,
    request_wire,
)
from layout_sm.ready import (
    Attached,
    FindingsGathered,
    Polled,
    Ready,
    RejoinAnswered,
    RejoinRowsGathered,
    Started,
)
from layout_sm.reasons import Reason, Status
from layout_sm.record import LayoutRecord
from layout_sm.repair import RepairPlan, repair_plan
from layout_sm.session import POLL, EngineSession, SessionError

INITIAL_ROWS = ((0, 1, 2, 3), (0, 1, 2, 3))
INITIAL = LayoutRecord.initial(INITIAL_ROWS, 4)
MOVED = LayoutRecord.build(((3, 2, 1, 0), (0, 1, 2, 3)), 4, 1)
LAYOUT = EngineLayout(2, 4, 4, INITIAL.digest, True)


def _fresh(*engines: str) -> DaemonMachine:
    machine = DaemonMachine(INITIAL)
    for engine in engines:
        assert machine.attach_engine(AttachRequest(engine), session=f"s{engine}").ok
    return machine


def _ask(engine: str = "A", target: LayoutRecord = MOVED) -> RejoinRequest:
    return RejoinRequest(engine, f"s{engine}", target.version, target.digest, target.rows)


def test_a_fresh_daemon_rejoins_and_its_repair_reloads_every_layer_at_the_target() -> None:
    machine = _fresh("A")
    reply = machine.rejoin_layout(_ask())
    assert reply.ok and reply.reason is Reason.REJOIN_BEGUN, reply
    assert machine.phase == "repairing"
    view = machine.view()
    assert view.record == MOVED and view.state_wire()["repairing"]["rejoin"] is True
    plan = repair_plan(view)
    assert isinstance(plan, RepairPlan)
    assert plan.layers == (0, 1) and plan.rows == MOVED.rows and plan.base_version == 1
    # Mid-rejoin the daemon serves nothing: a begin is refused.
    assert not machine.begin_move(BeginRequest("A", "sA", 1, (0,))).ok
    assert machine.handle(RepairDone((0, 1), "reloaded")).reply.ok
    assert machine.phase == "clean" and machine.view().record == MOVED


def test_a_daemon_behind_rejoins_at_a_newer_version_and_none_is_rewound() -> None:
    machine = _fresh("A")
    assert machine.begin_move(BeginRequest("A", "sA", 0, (0,))).ok
    assert machine.commit_move(CommitRequest("A", "sA", (0,), ((1, 0, 3, 2),))).ok
    at_one = machine.view()
    # Not behind: a rejoin at its own version, or at an older one, is refused and changes nothing.
    for target in (LayoutRecord.build(((3, 2, 1, 0), (0, 1, 2, 3)), 4, 1), MOVED):
        reply = machine.rejoin_layout(_ask(target=target))
        assert reply.status is Status.REFUSED and reply.reason is Reason.NOT_BEHIND, reply
        assert machine.view() == at_one
    # Behind version 2 (the others recorded a commit this daemon did not): it rejoins there.
    newer = LayoutRecord.build(((3, 2, 1, 0), (0, 1, 2, 3)), 4, 2)
    assert machine.rejoin_layout(_ask(target=newer)).ok
    assert machine.phase == "repairing" and machine.view().record == newer


def test_a_daemon_with_another_engine_attached_refuses_to_rejoin() -> None:
    machine = _fresh("A", "B")
    reply = machine.rejoin_layout(_ask())
    assert reply.reason is Reason.OTHER_ENGINE_ATTACHED and "'B'" in reply.message, reply
    assert machine.view().record == INITIAL


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (RejoinRequest("A", "sA", 1, "0" * 64, MOVED.rows), Reason.BAD_ROWS),  # digest of another map
        (RejoinRequest("A", "sA", 0, MOVED.digest, MOVED.rows), Reason.NOT_BEHIND),  # not newer
        (RejoinRequest("A", "sA", 1, "0" * 64, ((0, 1),)), Reason.BAD_ROWS),  # another shape
        (RejoinRequest("A", "sX", 1, MOVED.digest, MOVED.rows), Reason.NOT_ATTACHED),  # not its session
    ],
)
def test_a_rejoin_that_does_not_fit_is_refused_and_changes_nothing(request_: RejoinRequest, reason: Reason) -> None:
    machine = _fresh("A")
    reply = machine.rejoin_layout(request_)
    assert reply.reason is reason, reply
    assert machine.phase == "clean" and machine.view().record == INITIAL


def test_the_rejoin_request_round_trips_and_a_malformed_one_names_its_field() -> None:
    wire = rejoin_request("A", "sA", 1, MOVED.digest, MOVED.rows)
    assert parse_request(wire) == _ask()
    assert request_wire(_ask()) == wire
    bad = parse_request({**wire, "digest": "xyz"})
    assert not isinstance(bad, RejoinRequest) and bad.data["field"] == "digest"


# -- the engine's side ------------------------------------------------------------------------------


def _attached_session(records: list[LayoutRecord], rejoins: bool = True) -> EngineSession:
    layout = EngineLayout(2, 4, 4, INITIAL.digest, True, rejoins=rejoins)
    session = EngineSession("E", len(records), layout)
    for rank, record in enumerate(records):
        machine = DaemonMachine(record)
        reply = machine.attach_engine(AttachRequest("E", INITIAL.digest), session=f"s{rank}").to_wire()
        session.step(Attached(rank, reply))
    return session


def _agree(session: EngineSession) -> Ready:
    return session.step(FindingsGathered(session.view().findings))


def test_fresh_ranks_beside_one_moved_record_rejoin_then_the_engine_adopts_it() -> None:
    session = _attached_session([MOVED, INITIAL, MOVED])
    ready = _agree(session)
    step = ready.done
    assert step.go is Go.PAUSE and step.reason is Reason.REJOIN, step
    assert ready.gather == MOVED.rows  # this process holds the map: its part of the rows' all-gather
    requests = [session.next_request(r) for r in range(3)]
    assert requests == [None, RejoinRequest("E", "s1", 1, MOVED.digest, MOVED.rows), None]
    daemon = DaemonMachine(INITIAL)
    daemon.attach_engine(AttachRequest("E"), session="s1")
    waiting = session.step(RejoinAnswered(1, daemon.rejoin_layout(requests[1]).to_wire()))
    assert waiting.done.go is Go.PAUSE and waiting.send == POLL
    assert session.step(Polled(1, daemon.query_state(include_map=True).to_wire())).send == POLL  # still reloading
    daemon.handle(RepairDone((0, 1), "reloaded"))
    assert session.step(Polled(1, daemon.query_state(include_map=True).to_wire())).gathers
    adopted = _agree(session)
    assert adopted.done.go is Go.PROCEED and adopted.done.reason is Reason.ADOPT, adopted
    assert adopted.install == MOVED.rows == session.layout_to_install()


def test_without_rejoin_the_same_findings_fail_as_records_that_differ() -> None:
    step = _agree(_attached_session([MOVED, INITIAL], rejoins=False)).done
    assert step.go is Go.STOP and step.reason is Reason.DISAGREE, step


def test_moved_records_that_differ_are_no_rejoin() -> None:
    other = LayoutRecord.build(((0, 1, 2, 3), (3, 2, 1, 0)), 4, 1)
    step = _agree(_attached_session([MOVED, INITIAL, other])).done
    assert step.go is Go.STOP and step.reason is Reason.DISAGREE, step


def test_a_refused_rejoin_fails_the_startup_with_the_reason() -> None:
    session = _attached_session([MOVED, INITIAL])
    assert _agree(session).done.reason is Reason.REJOIN
    daemon = _fresh("E", "B")  # another engine attached: refused
    daemon.restore(daemon.view().evolve(attachments={"E": "s1", "B": "sB"}))
    refused = session.step(RejoinAnswered(1, daemon.rejoin_layout(session.next_request(1)).to_wire()))
    assert refused.gathers  # the rank gathers its finding: the refusal
    failed = _agree(session).done
    assert failed.go is Go.STOP and failed.reason is Reason.REJOIN_REFUSED, failed
    assert "'B'" in failed.message and "rank 1" in failed.message


def test_a_target_known_by_its_stamp_needs_rows_with_its_digest() -> None:
    # Rank 1's process: it attached to its own (fresh) daemon and gathers rank 0's finding as a stamp.
    session = EngineSession("E", 2, LAYOUT)
    session.step(Started(1, INITIAL_ROWS))
    daemon = DaemonMachine(INITIAL)
    session.step(Attached(1, daemon.attach_engine(AttachRequest("E", INITIAL.digest), session="s1").to_wire()))
    rank0 = RankFinding(0, "record", MOVED)
    agreed = session.step(FindingsGathered([RankFinding.from_wire(rank0.to_wire()), session.view().findings[1]]))
    assert agreed.done.reason is Reason.REJOIN and agreed.gather is None  # this process holds no map of it
    with pytest.raises(SessionError, match="rows of version 1 are needed"):
        session.next_request(1)
    with pytest.raises(SessionError, match="do not have the digest"):
        session.next_request(1, INITIAL_ROWS)
    assert session.next_request(1, MOVED.rows).rows == MOVED.rows
    # The rows come with the all-gather from the rank whose daemon holds the map.
    asked = session.step(RejoinRowsGathered([MOVED.rows, None]))
    assert asked.send == RejoinRequest("E", "s1", 1, MOVED.digest, MOVED.rows)
