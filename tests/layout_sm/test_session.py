"""The engine session (docs/protocol.md §2, §5, §6) against real DaemonMachines: the steps, the
restore from a view, the bare view the mirror keeps, and the declared tables against
python-statemachine's own engine on the same classes."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest
from statemachine.exceptions import TransitionNotAllowed
from tools.mirror.reference import ReferenceEngineSession

from layout_sm.daemon import DaemonMachine
from layout_sm.declared import Call, Declared, Rule
from layout_sm.engine import (
    EngineLayout,
    Go,
    RankFinding,
    RebalancePhase,
)
from layout_sm.engine_machines import EngineState, RebalanceMachine, StartupMachine
from layout_sm.messages import AttachRequest
from layout_sm.reasons import Reason
from layout_sm.record import LayoutRecord
from layout_sm.session import EngineSession, EngineView, SessionError

INITIAL = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED = ((1, 0, 2, 3), (3, 2, 1, 0))
RECORD = LayoutRecord.initial(INITIAL, 4)
ENGINE = EngineLayout(2, 4, 4, RECORD.digest, routes_by_metadata=True)


@pytest.fixture(params=[False, True], ids=["tables", "statemachine"])
def statemachine(request: pytest.FixtureRequest) -> bool:
    """Every test runs twice: with the declared tables the engines run, and with python-statemachine."""
    return bool(request.param)


def _session_class(statemachine: bool) -> type[EngineSession]:
    return ReferenceEngineSession if statemachine else EngineSession


def _started(daemons: list[DaemonMachine], engine_id: str = "A", statemachine: bool = False) -> EngineSession:
    session = _session_class(statemachine)(engine_id, len(daemons), ENGINE)
    for rank, daemon in enumerate(daemons):
        reply = daemon.attach_engine(session.attach_request(), f"s{engine_id}{rank}")
        assert session.attached(rank, reply.to_wire()).go is Go.PROCEED
    assert session.agree().reason is Reason.INITIAL_LAYOUT
    for rank, daemon in enumerate(daemons):
        assert session.fetched(rank, daemon.fetch_check(session.fetch_claim(rank)).to_wire()).go is Go.PROCEED
    assert session.view().phase == "run"
    assert session.start_rebalance(["daemon"] * len(daemons)).reason is Reason.SHARED
    return session


def _chunk(session: EngineSession, daemons: list[DaemonMachine], layers: list[int]):  # type: ignore[no-untyped-def]
    assert session.rebalance().go is Go.PROCEED and session.shares
    session.begin_chunk(layers)
    for rank, daemon in enumerate(daemons):
        session.begun(rank, daemon.begin_move(session.begin_request(rank)))
    return session.decide()


def test_a_chunk_moves_commits_and_verifies(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
    assert _chunk(session, daemons, [0]).go is Go.PROCEED
    session.moved(MOVED)
    for rank, daemon in enumerate(daemons):
        request = session.commit_request(rank)
        assert request.rows == (MOVED[0],) and request.session == f"sA{rank}"
        session.committed(rank, daemon.commit_move(request))
    assert session.chunk_committed().go is Go.PROCEED and session.owes_check
    verdict = session.verify()
    view = session.view()
    assert verdict.go is Go.PROCEED and verdict.reason is Reason.COMMITTED
    assert view.version == 1 and view.rows == MOVED and view.rebalance == "idle" and view.shares
    assert all(d.view().record.rows == MOVED for d in daemons)


def test_a_commit_sent_before_the_move_is_taken_is_the_same_commit(statemachine: bool) -> None:
    """The adapter sends each rank's commit first and checks the engine's map while the daemon records
    it: the requests are the ones built after ``moved``, and the chunk verifies the same way."""
    early_daemons, late_daemons = (
        [DaemonMachine(RECORD), DaemonMachine(RECORD)],
        [
            DaemonMachine(RECORD),
            DaemonMachine(RECORD),
        ],
    )
    early, late = _started(early_daemons, statemachine=statemachine), _started(late_daemons, statemachine=statemachine)
    assert _chunk(early, early_daemons, [0]).go is Go.PROCEED and _chunk(late, late_daemons, [0]).go is Go.PROCEED
    with pytest.raises(SessionError, match="has no commit to send"):
        early.commit_request(0)  # without the map, only once the move is taken
    sent = [early.commit_request(rank, {0: list(MOVED[0])}) for rank in range(2)]
    early.moved(MOVED)
    late.moved(MOVED)
    assert sent == [late.commit_request(rank) for rank in range(2)]
    with pytest.raises(SessionError, match="before the move is taken"):
        early.commit_request(0, MOVED)  # once the move is taken, the commit is built from it
    for rank, daemon in enumerate(early_daemons):
        early.committed(rank, daemon.commit_move(sent[rank]))
    early.chunk_committed()
    assert early.verify().reason is Reason.COMMITTED and early.view().rows == MOVED


def test_a_map_changed_after_its_commit_went_out_fails_the_verification(statemachine: bool) -> None:
    """Rows sent early and a map taken after that differ: the daemons recorded the rows sent, the
    engine's digest is of the map it routes with, and the chunk stops unverified."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
    assert _chunk(session, daemons, [0]).go is Go.PROCEED
    sent = [session.commit_request(rank, MOVED) for rank in range(2)]
    session.moved(((0, 1, 3, 2), MOVED[1]))  # not the rows that went out
    for rank, daemon in enumerate(daemons):
        session.committed(rank, daemon.commit_move(sent[rank]))
    session.chunk_committed()
    verdict = session.verify()
    assert verdict.go is Go.STOP and verdict.reason is Reason.COMMIT_UNVERIFIED


def test_busy_aborts_the_begun_ranks_then_pauses(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
    daemons[1].attach_engine(AttachRequest("standby"), "sS")  # a warm standby on rank 1's daemon
    step = _chunk(session, daemons, [1])
    assert (step.go, step.reason) == (Go.PAUSE, Reason.BEGIN_BUSY)
    assert session.view().rebalance == "aborting" and session.view().shares
    assert session.abort_request(1) is None  # rank 1's begin was busy: nothing to abort
    with pytest.raises(TransitionNotAllowed):
        session.aborted(1)
    request = session.abort_request(0)
    assert request is not None and daemons[0].abort_move(request).reason is Reason.ABORTED
    session.aborted(0)
    assert session.view().rebalance == "idle" and session.view().chunk == ()
    assert daemons[0].view().pending is None


def test_a_refusal_switches_rebalancing_off_for_good_with_the_reason(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
    daemons[1].fetch_check(None)  # an engine without the plugin was served: non-following seen
    step = _chunk(session, daemons, [0])
    assert step.go is Go.STOP and step.reason is Reason.BEGIN_REFUSED
    request = session.abort_request(0)
    assert request is not None
    daemons[0].abort_move(request)
    session.aborted_all()
    view = session.view()
    assert view.rebalance == "off" and not view.shares and view.off is not None
    assert view.off.reason is Reason.BEGIN_REFUSED and "non_following_seen" in view.off.message
    assert session.rebalance() == view.off
    with pytest.raises(TransitionNotAllowed):
        session.begin_chunk([0])


def test_a_rank_waits_for_another_engines_move_and_keeps_its_finding_while_it_lasts(statemachine: bool) -> None:
    daemon = DaemonMachine(RECORD)
    mover = _started([daemon], "M", statemachine=statemachine)
    assert _chunk(mover, [daemon], [0]).go is Go.PROCEED
    session = _session_class(statemachine)("B", 1, ENGINE)
    step = session.attached(0, daemon.attach_engine(session.attach_request(), "sB").to_wire())
    assert step.go is Go.PAUSE and "'M'" in step.message
    before = session.view()
    assert session.polled(0, daemon.query_state(include_map=True).to_wire()).go is Go.PAUSE
    assert session.view() == before
    with pytest.raises(TransitionNotAllowed):
        session.agree()  # a rank still waits
    mover.moved(MOVED)
    mover.committed(0, daemon.commit_move(mover.commit_request(0)))
    mover.chunk_committed()
    assert mover.verify().go is Go.PROCEED
    assert session.polled(0, daemon.query_state(include_map=True).to_wire()).go is Go.PROCEED
    step = session.agree()
    assert step.go is Go.PROCEED and step.reason is Reason.ADOPT and session.view().version == 1
    assert session.layout_to_install() == MOVED


def test_restore_puts_the_session_in_a_view(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
    idle = session.view()
    _chunk(session, daemons, [0])
    session.restore(idle)
    assert session.view() is idle and session.model.view is idle  # the model is the view: no copy
    session.begin_chunk([1])  # from idle again
    session.restore(EngineView.fresh("A", 2))  # back before startup: out of final states too
    assert session.found(0, RankFinding(0, "record", RECORD)).go is Go.PROCEED


def test_no_decision_reads_what_the_bare_view_drops(statemachine: bool) -> None:
    """The mirror keeps bare views: the same steps from a bare view decide the same."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine)
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
    assert (again.go, again.reason) == (decided.go, decided.reason)
    assert session.view().bare() == after


def test_steps_out_of_order_are_refused(statemachine: bool) -> None:
    session = _session_class(statemachine)("A", 2, ENGINE)
    with pytest.raises(TransitionNotAllowed):
        session.agree()  # no rank has found anything
    with pytest.raises(TransitionNotAllowed):
        session.begin_chunk([0])  # the rebalance mode is not known yet
    with pytest.raises(SessionError):
        session.begin_request(0)
    with pytest.raises(SessionError):
        session.rebalance()
    with pytest.raises(ValueError):
        EngineSession("A", 0, ENGINE)


def test_an_unknown_weight_source_fails_safe_and_never_attached_sessions_come_from_the_core() -> None:
    for sources in ((None, "daemon"), ("disk", None), ("gpu-direct",)):
        session = EngineSession.never_attached(len(sources))
        step = session.start_rebalance(sources)
        assert (step.go, step.reason) == (Go.STOP, Reason.UNKNOWN_SOURCE)
        assert session.rebalance() == step and not session.shares
    local = EngineSession.never_attached(2)
    assert local.start_rebalance(["disk", "disk"]).reason is Reason.LOCAL
    assert local.rebalance().go is Go.PROCEED and not local.shares  # sglang's own rebalance, no protocol
    assert EngineSession.never_attached(1).start_rebalance(["daemon"]).reason is Reason.NOT_ATTACHED


def test_missing_hooks_are_one_of_the_off_reasons(statemachine: bool) -> None:
    cls = _session_class(statemachine)
    session = cls.never_attached(2)
    session.install_checked(None)  # every hook in place: nothing changes
    assert not session.rebalance_started and session.view().rebalance == "starting"
    session.install_checked("hooks X, Y were not applied")
    step = session.rebalance()
    assert (step.go, step.reason) == (Go.STOP, Reason.PLUGIN_INCOMPLETE) and "hooks X, Y" in step.message
    assert session.rebalance_started and not session.shares and session.view().rebalance == "off"
    session.install_checked("hooks Z were not applied")  # off already: the first reason stays
    assert session.rebalance() == step
    shared = _started([DaemonMachine(RECORD), DaemonMachine(RECORD)], statemachine=statemachine)
    shared.install_checked(None)
    assert shared.rebalance().go is Go.PROCEED and shared.shares
    shared.install_checked("hooks X were not applied")
    assert shared.rebalance().reason is Reason.PLUGIN_INCOMPLETE and not shared.shares


def _standby_loaded(daemons: list[DaemonMachine], statemachine: bool) -> EngineSession:
    """A warm standby through startup; only rank 0's own fetch is taken, the others come from the all-gather."""
    session = _session_class(statemachine)("S", len(daemons), ENGINE, standby=True)
    for rank, daemon in enumerate(daemons):
        assert (
            session.attached(rank, daemon.attach_engine(session.attach_request(), f"sS{rank}").to_wire()).go
            is Go.PROCEED
        )
    assert session.agree().go is Go.PROCEED
    assert session.fetched(0, daemons[0].fetch_check(session.fetch_claim(0)).to_wire()).go is Go.PROCEED
    assert session.loaded_all([True, False]).go is Go.PAUSE and session.view().phase == "load"
    assert session.loaded_all([True, True]).go is Go.PROCEED and session.view().phase == "run"
    return session


def test_a_standby_s_rounds_are_the_session_s(statemachine: bool) -> None:
    """Park, notices, claims: the session says which rank goes next and whether the round goes on."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    daemons[0].attach_engine(AttachRequest("P"), "sP")  # a primary on rank 0's daemon
    session = _standby_loaded(daemons, statemachine)
    assert session.start_rebalance(["daemon", "daemon"]).reason is Reason.SHARED
    assert (session.rebalance().go, session.rebalance().reason) == (Go.PAUSE, Reason.PARKED)  # not the primary
    parked = []
    while (rank := session.next_to_park()) is not None:
        parked.append(rank)
        session.parked(rank, daemons[rank].park_engine(session.park_request(rank)).to_wire())
    assert parked == [0, 1] and session.standby_parked and not session.standby_promoted
    assert session.awaits_notice(0) and not session.awaits_notice(1)  # rank 1's park reply was its notice
    assert session.noticed_all().go is Go.PAUSE and session.next_to_claim() is None
    daemons[0].detach_engine("P", "sP")  # rank 0's notice
    daemons[1].attach_engine(AttachRequest("Q"), "sQ")  # another engine attaches before the claims
    assert session.noticed_all([True, False]).go is Go.PROCEED and not session.awaits_notice(0)
    claims = []
    while (rank := session.next_to_claim()) is not None:
        claims.append(session.claimed(rank, daemons[rank].claim_primary(session.claim_request(rank)).to_wire()))
    assert [c.go for c in claims] == [Go.PROCEED, Go.PAUSE]  # rank 1's claim taken: the round ended there
    assert session.promote().go is Go.PAUSE and session.next_to_park() == 0 and session.standby_parked
    for rank in (0, 1):
        session.parked(rank, daemons[rank].park_engine(session.park_request(rank)).to_wire())
    daemons[1].detach_engine("Q", "sQ")
    assert session.noticed_all([True, True]).go is Go.PROCEED
    while (rank := session.next_to_claim()) is not None:
        assert (
            session.claimed(rank, daemons[rank].claim_primary(session.claim_request(rank)).to_wire()).go is Go.PROCEED
        )
    assert session.promote().go is Go.PROCEED and session.standby_promoted and not session.standby_parked
    assert session.rebalance().go is Go.PROCEED and session.shares


def test_the_views_phases_are_the_machines_states() -> None:
    assert list(get_args(RebalancePhase)) == [state.id for state in RebalanceMachine.states]
    assert [s.id for s in StartupMachine.states] == ["start", "load", "run", "failed"]


def test_the_tables_are_the_declarations() -> None:
    """Every declared transition is a rule of the table, in declaration order, with its guards."""
    for machine, field in ((StartupMachine, "phase"), (RebalanceMachine, "rebalance")):
        table = Declared.of(machine, EngineState, field)
        declared = [(s.value, str(e), t.target.value) for s in machine.states for t in s.transitions for e in t.events]
        tabled = [(r.source, r.event, r.target) for s in machine.states for (src, _), rules in table.rules.items()
                  if src == s.value for r in rules]  # fmt: skip
        assert sorted(declared) == sorted(tabled)
        assert table.events == {str(e) for e in machine.events}


def test_the_table_finds_a_name_where_python_statemachine_does() -> None:
    """On the machine first (run on the host instance), then on the model: both engines agree."""
    from statemachine import State, StateMachine

    class OnMachine(StateMachine):
        a = State(initial=True)
        b = State(final=True)
        go = a.to(b, cond="not_found", on="take")

        def not_found(self, rank: int) -> bool:  # shadows EngineState.not_found, as in python-statemachine
            return rank == 7

        def take(self, rank: int) -> str:
            return f"taken {rank}"

    class Model:
        state = "a"

        def not_found(self, rank: int) -> bool:
            return True

    table = Declared(OnMachine, Model, "state")
    host = OnMachine(model=Model())
    with pytest.raises(TransitionNotAllowed):
        table.fire_on(host, Model(), "go", {"rank": 1})
    model = Model()
    assert table.fire_on(host, model, "go", {"rank": 7}) == "taken 7" and model.state == "b"
    reference = OnMachine(model=Model())
    assert reference.send("go", rank=7) == "taken 7" and reference.model.state == "b"


def test_the_table_refuses_what_it_cannot_read() -> None:
    """A callback the table would not run as python-statemachine does is refused when it is built."""
    from statemachine import State, StateMachine

    class Either(StateMachine):
        a = State(initial=True)
        b = State(final=True)
        go = a.to(b, cond="not_found or waits")

    with pytest.raises(TypeError, match="only names joined by 'and'"):
        Declared(Either, EngineState, "phase")

    class Entering(StateMachine):
        a = State(initial=True)
        b = State(final=True)
        go = a.to(b)

        def on_enter_b(self) -> None:
            pass

    with pytest.raises(TypeError, match="convention callback"):
        Declared(Entering, EngineState, "phase")


def test_guards_are_asked_in_order_and_stop_at_the_first_that_fails() -> None:
    """A rule asks each guard in order, each for the truth it must have, and none after the first
    that does not have it (a later guard may assume an earlier one)."""
    asked: list[object] = []

    class Model:
        def a(self) -> bool:
            asked.append("a")
            return True

        def b(self, x: int) -> bool:
            asked.append(("b", x))
            return False

        def c(self) -> bool:
            asked.append("c")
            return True

    def rule(*guards: Call) -> Rule:
        return Rule("go", "s", "t", guards, ())

    a, c = Call("a", ()), Call("c", ())
    assert rule(a, Call("b", ("x",), expected=False), c).allows(None, Model(), {"x": 1}) is True
    assert asked == ["a", ("b", 1), "c"]
    asked.clear()
    assert rule(a, Call("b", ("x",)), c).allows(None, Model(), {"x": 2}) is False
    assert asked == ["a", ("b", 2)]
    assert rule().allows(None, Model(), {}) is True


def test_the_diagrams_are_drawn_from_the_declarations() -> None:
    """``python -m layout_sm.diagrams`` reads the same classes (Graphviz renders the text it builds)."""
    from statemachine.contrib.diagram import DotGraphMachine

    from layout_sm.diagrams import machines

    drawn = {stem: DotGraphMachine(machine)().to_string() for stem, machine in machines().items()}
    assert "good" in drawn["rebalance_machine"] and "records_differ" in drawn["startup_machine"]
    assert set(drawn) == {"daemon_machine", "startup_machine", "rebalance_machine", "standby_machine"}
    assert "parked" in drawn["standby_machine"]


def _ranks_of(session: EngineSession) -> list[EngineSession]:
    """One session per rank, as every rank process keeps its own (the same view after startup)."""
    sessions = [session]
    for _ in range(1, session.view().num_ranks):
        other = EngineSession(session.view().engine_id, session.view().num_ranks, ENGINE)
        other.restore(session.view())
        sessions.append(other)
    return sessions


def _one_collective_chunk(
    sessions: list[EngineSession], daemons: list[DaemonMachine], layers: list[int], rows_of: object = None
):  # type: ignore[no-untyped-def]
    """A chunk as the adapter runs it: each rank's begin, one all-gather of the begin replies with the
    last chunk's commit answers, the move, each rank's commit with no collective after it."""
    for s in sessions:
        assert s.rebalance().go is Go.PROCEED
        s.begin_chunk(layers)
    pairs = enumerate(zip(sessions, daemons, strict=True))
    gathered = [(d.begin_move(s.begin_request(r)), s.owed_answer(r)) for r, (s, d) in pairs]
    steps = [s.begun_all([b for b, _ in gathered], owed=[o for _, o in gathered]) for s in sessions]
    assert len({(step.go, step.reason) for step in steps}) == 1  # every rank decides the same
    if steps[0].go is not Go.PROCEED:
        for r, (s, d) in enumerate(zip(sessions, daemons, strict=True)):
            abort = s.abort_request(r)
            if abort is not None:
                d.abort_move(abort)
            s.aborted_all()
        return steps[0]
    for r, (s, d) in enumerate(zip(sessions, daemons, strict=True)):
        s.moved(MOVED)
        request = s.commit_request(r)
        if rows_of is not None and r == 1:
            request = replace(request, rows=((0, 1, 2),))  # rows the daemon refuses: the move stays pending
        s.committed(r, d.commit_move(request))
        assert s.chunk_committed().go is Go.PROCEED  # no collective: it always goes on
    return steps[0]


def test_the_commit_check_rides_the_next_begin_and_the_rebalance_end() -> None:
    """One all-gather per chunk: each rank knows only its own commit answer until the next chunk's
    begin gathers every rank's; the rebalance's end gathers them once more."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    sessions = _ranks_of(_started(daemons))
    assert _one_collective_chunk(sessions, daemons, [0]).go is Go.PROCEED
    assert [s.view().owed[1 - r] for r, s in enumerate(sessions)] == [None, None]  # the peers' are owed
    assert all(s.owes_check and s.view().version == 1 for s in sessions)
    assert _one_collective_chunk(sessions, daemons, [1]).go is Go.PROCEED
    owed = [s.owed_answer(r) for r, s in enumerate(sessions)]
    assert all(s.verify(owed).go is Go.PROCEED and not s.owes_check for s in sessions)
    assert all(s.view().version == 2 and s.shares for s in sessions)
    assert all(d.view().record.version == 2 and d.view().record.digest == sessions[0].view().digest for d in daemons)


def test_a_failed_commit_stops_at_the_next_begin_and_its_move_stays_pending() -> None:
    """A daemon that refused a commit keeps the move pending and refuses the next begin (its rule for
    the engine's own pending move); the gathered check fails: the ranks that began abort, and
    rebalancing is off with the commit's reason."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    sessions = _ranks_of(_started(daemons))
    assert _one_collective_chunk(sessions, daemons, [0], rows_of="bad").go is Go.PROCEED
    assert daemons[1].view().phase == "pending"
    step = _one_collective_chunk(sessions, daemons, [1])
    assert (
        step.go is Go.STOP and step.reason is Reason.COMMIT_UNVERIFIED and "rank 1: commit not recorded" in step.message
    )
    assert all(s.view().rebalance == "off" and not s.shares and not s.owes_check for s in sessions)
    assert daemons[0].view().phase == "clean" and daemons[0].view().record.version == 1  # rank 0's begin aborted
    assert daemons[1].view().phase == "pending" and daemons[1].view().pending.layers == (0,)
