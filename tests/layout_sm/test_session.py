"""The engine session (docs/protocol.md §2, §5, §6) against real DaemonMachines: the steps, the
restore from a view, and the bare view the mirror keeps."""

from __future__ import annotations

import pytest
from statemachine.exceptions import TransitionNotAllowed

from layout_sm.daemon import DaemonMachine
from layout_sm.engine import EngineLayout, RankFinding
from layout_sm.messages import AttachRequest
from layout_sm.reasons import Reason
from layout_sm.record import LayoutRecord
from layout_sm.session import EngineSession, EngineView, Gather, SessionError, Wait

INITIAL = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED = ((1, 0, 2, 3), (3, 2, 1, 0))
RECORD = LayoutRecord.initial(INITIAL, 4)
ENGINE = EngineLayout(2, 4, 4, RECORD.digest, routes_by_metadata=True)


def _started(daemons: list[DaemonMachine], engine_id: str = "A") -> EngineSession:
    session = EngineSession(engine_id, len(daemons), ENGINE)
    for rank, daemon in enumerate(daemons):
        reply = daemon.attach_engine(session.attach_request(), f"s{engine_id}{rank}")
        assert isinstance(session.attached(rank, reply.to_wire()), Gather)
    assert session.agree().kind == "keep_own"
    for rank, daemon in enumerate(daemons):
        assert session.fetched(rank, daemon.fetch_check(session.fetch_claim(rank)).to_wire()) is None
    assert session.view().phase == "run"
    assert session.start_rebalance(["daemon"] * len(daemons)).reason is Reason.SHARED
    return session


def _chunk(session: EngineSession, daemons: list[DaemonMachine], layers: list[int]):  # type: ignore[no-untyped-def]
    assert session.rebalance() == "shared"
    session.begin_chunk(layers)
    for rank, daemon in enumerate(daemons):
        session.begun(rank, daemon.begin_move(session.begin_request(rank)))
    return session.decide()


def test_a_chunk_moves_commits_and_verifies() -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons)
    assert _chunk(session, daemons, [0]).kind == "proceed"
    session.moved(MOVED)
    for rank, daemon in enumerate(daemons):
        request = session.commit_request(rank)
        assert request.rows == (MOVED[0],) and request.session == f"sA{rank}"
        session.committed(rank, daemon.commit_move(request))
    verdict = session.verify()
    view = session.view()
    assert verdict.ok and view.version == 1 and view.rows == MOVED and view.rebalance == "idle" and view.shares
    assert all(d.view().record.rows == MOVED for d in daemons)


def test_busy_aborts_the_begun_ranks_then_pauses() -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons)
    daemons[1].attach_engine(AttachRequest("standby"), "sS")  # a warm standby on rank 1's daemon
    decision = _chunk(session, daemons, [1])
    assert (decision.kind, decision.abort_ranks, decision.reason) == ("pause", (0,), Reason.BEGIN_BUSY)
    assert session.view().rebalance == "aborting" and session.view().shares
    with pytest.raises(SessionError):
        session.abort_request(1)  # rank 1's begin was busy: nothing to abort
    assert daemons[0].abort_move(session.abort_request(0)).reason is Reason.ABORTED
    session.aborted(0)
    assert session.view().rebalance == "idle" and session.view().chunk == ()
    assert daemons[0].view().pending is None


def test_a_refusal_switches_rebalancing_off_for_good_with_the_reason() -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons)
    daemons[1].fetch_check(None)  # an engine without the plugin was served: non-following seen
    decision = _chunk(session, daemons, [0])
    assert decision.kind == "disable" and decision.reason is Reason.BEGIN_REFUSED
    daemons[0].abort_move(session.abort_request(0))
    session.aborted(0)
    view = session.view()
    assert view.rebalance == "off" and not view.shares and view.off is not None
    assert view.off.reason is Reason.BEGIN_REFUSED and "non_following_seen" in view.off.message
    assert session.rebalance() == "off"
    with pytest.raises(TransitionNotAllowed):
        session.begin_chunk([0])


def test_a_rank_waits_for_another_engines_move_and_keeps_its_finding_while_it_lasts() -> None:
    daemon = DaemonMachine(RECORD)
    mover = _started([daemon], "M")
    assert _chunk(mover, [daemon], [0]).kind == "proceed"
    session = EngineSession("B", 1, ENGINE)
    step = session.attached(0, daemon.attach_engine(session.attach_request(), "sB").to_wire())
    assert isinstance(step, Wait) and "'M'" in step.detail
    before = session.view()
    assert isinstance(session.polled(0, daemon.query_state(include_map=True).to_wire()), Wait)
    assert session.view() == before and not session.may_agree
    mover.moved(MOVED)
    mover.committed(0, daemon.commit_move(mover.commit_request(0)))
    assert mover.verify().ok
    assert isinstance(session.polled(0, daemon.query_state(include_map=True).to_wire()), Gather)
    outcome = session.agree()
    assert outcome.kind == "adopt" and outcome.reason is Reason.ADOPT and session.view().version == 1


def test_restore_puts_the_session_and_its_machines_in_a_view() -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons)
    idle = session.view()
    _chunk(session, daemons, [0])
    session.restore(idle)
    assert session.view() == idle
    session.begin_chunk([1])  # from idle again
    fresh = EngineView.fresh("A", 2)
    session.restore(fresh)  # back before startup: the machines left their final states
    assert isinstance(session.found(0, RankFinding(0, "record", RECORD)), Gather)


def test_no_decision_reads_what_the_bare_view_drops() -> None:
    """The mirror keeps bare views: the same steps from a bare view decide the same."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons)
    daemons[1].attach_engine(AttachRequest("standby"), "sS")
    session.begin_chunk([0])
    for rank, daemon in enumerate(daemons):
        session.begun(rank, daemon.begin_move(session.begin_request(rank)))
    full = session.view()
    bare = full.bare()
    assert bare != full and bare.bare() == bare and hash(bare)
    decided = session.decide()
    after = session.view().bare()
    session.restore(bare)
    again = session.decide()
    assert (again.kind, again.abort_ranks, again.reason) == (decided.kind, decided.abort_ranks, decided.reason)
    assert session.view().bare() == after


def test_steps_out_of_order_are_refused() -> None:
    session = EngineSession("A", 2, ENGINE)
    with pytest.raises(SessionError):
        session.agree()  # no rank has found anything
    with pytest.raises(TransitionNotAllowed):
        session.begin_chunk([0])  # the rebalance mode is not known yet
    with pytest.raises(ValueError):
        EngineSession("A", 0, ENGINE)


def test_the_views_rebalance_phases_are_the_machines_states() -> None:
    from typing import get_args

    from layout_sm.engine import RebalanceMachine
    from layout_sm.session import RebalancePhase

    assert list(get_args(RebalancePhase)) == [state.id for state in RebalanceMachine.states]
