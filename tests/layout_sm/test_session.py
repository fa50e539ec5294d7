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
    RebalancePhase,
)
from layout_sm.engine_machines import EngineState, RebalanceMachine, StartupMachine
from layout_sm.messages import AbortRequest, AttachRequest, BeginRequest, ClaimRequest, CommitRequest, ParkRequest
from layout_sm.ready import (
    Attached,
    BeginAnswered,
    ChunkAsked,
    Decided,
    Fetched,
    FindingsGathered,
    Moved,
    ParkAsked,
    Polled,
    RebalanceAsked,
    RebalanceEnded,
    SourcesGathered,
    Started,
    TakeOverAsked,
)
from layout_sm.reasons import Reason
from layout_sm.record import LayoutRecord
from layout_sm.session import POLL, EngineSession, EngineView, SessionError, Step

from .ranks import Ranks

INITIAL = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED = ((1, 0, 2, 3), (3, 2, 1, 0))
MOVED_TWICE = ((1, 0, 2, 3), (2, 3, 1, 0))
RECORD = LayoutRecord.initial(INITIAL, 4)
ENGINE = EngineLayout(2, 4, 4, RECORD.digest, routes_by_metadata=True)


@pytest.fixture(params=[False, True], ids=["tables", "statemachine"])
def statemachine(request: pytest.FixtureRequest) -> bool:
    """Every test runs twice: with the declared tables the engines run, and with python-statemachine."""
    return bool(request.param)


def _session_class(statemachine: bool) -> type[EngineSession]:
    return ReferenceEngineSession if statemachine else EngineSession


def _started(daemons: list[DaemonMachine], engine_id: str = "A", statemachine: bool = False) -> Ranks:
    """An engine of ``len(daemons)`` ranks through startup, each rank's fetch, and its first rebalance's mode."""
    ranks = Ranks(daemons, ENGINE, engine_id, _session_class(statemachine))
    steps = ranks.step(lambda r: Started(r, INITIAL))
    assert {s.reason for s in steps if s is not None} == {Reason.INITIAL_LAYOUT} and None not in steps
    for r, rank in enumerate(ranks.ranks):
        reply = daemons[r].fetch_check(rank.session.fetch_claim(r)).to_wire()
        assert rank.session.step(Fetched(r, reply)).done.go is Go.PROCEED
    assert {s.reason for s in ranks.step(lambda r: RebalanceAsked(r, source="daemon"))} == {Reason.SHARED}
    return ranks


def _decided(steps: list[Step | None]) -> Step:
    """The step every rank ended with: the same on all, since they decide on the same gathered lists."""
    assert len({(s.go, s.reason) for s in steps if s is not None}) == 1 and None not in steps, steps
    assert steps[0] is not None
    return steps[0]


def _chunk(ranks: Ranks, layers: list[int], move: tuple[tuple[int, ...], ...] = MOVED) -> Step:
    """One chunk as the adapter runs it: the begins, one all-gather, the decision, the move and the commits
    (their replies read before the ranks' next step)."""
    return _decided(ranks.step(lambda r: ChunkAsked(r, layers), move=move))


def _end(ranks: Ranks) -> Step | None:
    """The rebalance's end on every rank: the last chunk's commits read, and checked when owed."""
    steps = ranks.step(lambda r: RebalanceEnded(r))
    return None if steps[0] is None else _decided(steps)


def test_a_chunk_moves_commits_and_verifies(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons, statemachine=statemachine)
    assert _chunk(ranks, [0]).go is Go.PROCEED
    commits = [rank.sent[-1] for rank in ranks.ranks]
    assert [(c.rows, c.session) for c in commits] == [((MOVED[0],), "sA0"), ((MOVED[1 - 1],), "sA1")]
    verdict = _end(ranks)
    assert verdict is not None and verdict.go is Go.PROCEED and verdict.reason is Reason.COMMITTED
    for rank in ranks.ranks:
        view = rank.session.view()
        assert view.version == 1 and view.rows == MOVED and view.rebalance == "idle" and view.shares
    assert all(d.view().record.rows == MOVED for d in daemons)


def test_the_move_is_taken_with_its_commits_answer_and_its_rows_are_the_commits() -> None:
    """The commit goes out with the chunk's rows of the map sglang moved to, and the engine reads, checks
    and hashes that map when the commit's answer is taken: while the daemon records it."""
    daemons = [DaemonMachine(RECORD)]
    ranks = _started(daemons)
    assert _chunk(ranks, [0]).go is Go.PROCEED
    session = ranks.session
    assert session.view().rebalance == "moving" and session.view().version == 0  # the answer is unread
    assert ranks.ranks[0].sent[-1].rows == (MOVED[0],)
    ranks.flush()
    assert session.view().rebalance == "idle" and session.view().version == 1 and session.view().rows == MOVED
    with pytest.raises(SessionError, match="a move outside a chunk"):
        session.step(Moved(0, MOVED))


def test_busy_aborts_the_begun_ranks_then_pauses(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons, statemachine=statemachine)
    daemons[1].attach_engine(AttachRequest("standby"), "sS")  # a warm standby on rank 1's daemon
    step = _chunk(ranks, [1])
    assert (step.go, step.reason) == (Go.PAUSE, Reason.BEGIN_BUSY)
    assert [type(rank.sent[-1]) for rank in ranks.ranks] == [AbortRequest, BeginRequest]  # rank 1: nothing begun
    for rank in ranks.ranks:
        assert rank.session.view().rebalance == "idle" and rank.session.view().chunk == () and rank.session.shares
    assert daemons[0].view().pending is None


def test_a_begin_whose_reply_is_lost_stops_rebalancing_and_is_not_aborted(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons, statemachine=statemachine)
    ranks.replies_lost[1] = BeginRequest  # daemon 1 takes the begin; rank 1 never reads the reply
    step = _chunk(ranks, [0])
    assert step.go is Go.STOP and step.reason is Reason.BEGIN_REFUSED and "rank 1: no reply" in step.message
    assert "do not restart the daemons" in step.message
    # Rank 0 aborts its begin; rank 1 sends no abort: an abort names no begin, and a lost reply may hide
    # a refusal for an earlier move this daemon holds pending (its weights moved).
    assert [type(rank.sent[-1]) for rank in ranks.ranks] == [AbortRequest, BeginRequest]
    assert daemons[0].view().pending is None
    pending = daemons[1].view().pending
    assert pending is not None and pending.engine_id == "A"  # kept until its mover is gone
    assert not ranks.session.view().shares and ranks.session.view().version == 0


def test_a_refusal_switches_rebalancing_off_for_good_with_the_reason(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons, statemachine=statemachine)
    daemons[1].fetch_check(None)  # an engine without the plugin was served: non-following seen
    step = _chunk(ranks, [0])
    assert step.go is Go.STOP and step.reason is Reason.BEGIN_REFUSED
    assert isinstance(ranks.ranks[0].sent[-1], AbortRequest) and daemons[0].view().pending is None
    view = ranks.session.view()
    assert view.rebalance == "off" and not view.shares and view.off is not None
    assert view.off.reason is Reason.BEGIN_REFUSED and "non_following_seen" in view.off.message
    assert ranks.session.step(RebalanceAsked(0)).done == view.off
    with pytest.raises(TransitionNotAllowed):
        ranks.session.step(ChunkAsked(0, [0]))


def test_a_rank_waits_for_another_engines_move_and_keeps_its_finding_while_it_lasts(statemachine: bool) -> None:
    daemon = DaemonMachine(RECORD)
    mover = _started([daemon], "M", statemachine=statemachine)
    assert _chunk(mover, [0]).go is Go.PROCEED  # moved; its commit went out, the daemon holds it
    session = _session_class(statemachine)("B", 1, ENGINE)
    attach = session.step(Started(0)).send
    ready = session.step(Attached(0, daemon.attach_engine(attach, "sB").to_wire()))
    assert ready.send == POLL and ready.done is not None and ready.done.go is Go.PAUSE and "'M'" in ready.done.message
    before = session.view()
    ready = session.step(Polled(0, daemon.query_state(include_map=True).to_wire()))
    assert ready.send == POLL and session.view() == before
    with pytest.raises(TransitionNotAllowed):
        session.step(FindingsGathered([before.findings[0]]))  # a rank still waits
    mover.flush()
    assert _end(mover).go is Go.PROCEED
    ready = session.step(Polled(0, daemon.query_state(include_map=True).to_wire()))
    assert ready.gathers and ready.send is None
    agreed = session.step(ready.then([ready.gather], 0.0))
    assert agreed.done.go is Go.PROCEED and agreed.done.reason is Reason.ADOPT and session.view().version == 1
    assert agreed.install == MOVED == session.layout_to_install()


def test_a_wait_ends_at_its_timeout_and_the_rank_gathers_the_timeout() -> None:
    daemon = DaemonMachine(RECORD)
    mover = _started([daemon], "M")
    assert _chunk(mover, [0]).go is Go.PROCEED
    session = EngineSession("B", 1, ENGINE, wait_timeout_s=30.0)
    attach = session.step(Started(0)).send
    assert session.step(Attached(0, daemon.attach_engine(attach, "sB").to_wire(), now_s=100.0)).send == POLL
    assert session.step(Polled(0, daemon.query_state(include_map=True).to_wire(), now_s=129.0)).send == POLL
    ready = session.step(Polled(0, daemon.query_state(include_map=True).to_wire(), now_s=130.0))
    assert ready.gathers and session.view().findings[0].kind == "timeout"
    failed = session.step(ready.then([ready.gather], 130.0))
    assert failed.done.go is Go.STOP and failed.done.reason is Reason.WAIT_TIMEOUT and failed.close


def test_restore_puts_the_session_in_a_view(statemachine: bool) -> None:
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    session = _started(daemons, statemachine=statemachine).session
    idle = session.view()
    session.step(ChunkAsked(0, [0]))
    session.restore(idle)
    assert session.view() is idle and session.model.view is idle  # the model is the view: no copy
    session.step(ChunkAsked(0, [1]))  # from idle again
    session.restore(EngineView.fresh("A", 2))  # back before startup: out of final states too
    ready = session.step(Attached(0, daemons[0].attach_engine(AttachRequest("A2"), "sA2").to_wire()))
    assert ready.gathers and session.view().findings[0].kind == "record"


def test_no_decision_reads_what_the_bare_view_drops(statemachine: bool) -> None:
    """The mirror keeps bare views: the same steps from a bare view decide the same."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons, statemachine=statemachine)
    session = ranks.session
    daemons[1].attach_engine(AttachRequest("standby"), "sS")
    for rank, daemon in enumerate(daemons):  # each rank's own begin, its answers taken one by one by rank 0
        own = ranks.ranks[rank].session
        begin = own.step(ChunkAsked(rank, [0])).send
        session.step(BeginAnswered(rank, daemon.begin_move(begin).to_wire()))
    full = session.view()
    bare = full.bare()
    assert bare != full and bare.bare() == bare and hash(bare)
    decided = session.step(Decided()).done
    after = session.view().bare()
    session.restore(bare)
    again = session.step(Decided()).done
    assert (again.go, again.reason) == (decided.go, decided.reason)
    assert session.view().bare() == after


def test_steps_out_of_order_are_refused(statemachine: bool) -> None:
    session = _session_class(statemachine)("A", 2, ENGINE)
    with pytest.raises(TransitionNotAllowed):
        session.step(FindingsGathered([]))  # no rank has found anything
    with pytest.raises(TransitionNotAllowed):
        session.step(ChunkAsked(0, [0]))  # the rebalance mode is not known yet
    with pytest.raises(TransitionNotAllowed):
        session.step(BeginAnswered(0, None))  # no chunk begun
    with pytest.raises(SessionError, match="not an event"):
        session.step("begin")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        EngineSession("A", 0, ENGINE)


def test_an_unknown_weight_source_fails_safe_and_never_attached_sessions_come_from_the_core() -> None:
    for sources in ((None, "daemon"), ("disk", None), ("gpu-direct",)):
        session = EngineSession.never_attached(len(sources))
        step = session.step(SourcesGathered(sources)).done
        assert step is not None and (step.go, step.reason) == (Go.STOP, Reason.UNKNOWN_SOURCE)
        assert session.step(RebalanceAsked(0)).done == step and not session.shares
    local = EngineSession.never_attached(2)
    step = local.step(SourcesGathered(["disk", "disk"])).done
    assert step is not None and step.reason is Reason.LOCAL and step.go is Go.PROCEED and not local.shares
    assert EngineSession.never_attached(1).step(SourcesGathered(["daemon"])).done.reason is Reason.NOT_ATTACHED


def test_missing_hooks_are_one_of_the_off_reasons(statemachine: bool) -> None:
    cls = _session_class(statemachine)
    session = cls.never_attached(2)
    ready = session.step(RebalanceAsked(0, None))  # every hook in place: the sources are gathered first
    assert ready.gathers and session.view().rebalance == "starting"
    step = session.step(RebalanceAsked(0, "hooks X, Y were not applied")).done
    assert (step.go, step.reason) == (Go.STOP, Reason.PLUGIN_INCOMPLETE) and "hooks X, Y" in step.message
    assert not session.shares and session.view().rebalance == "off"
    assert session.step(RebalanceAsked(0, "hooks Z were not applied")).done == step  # the first reason stays
    shared = _started([DaemonMachine(RECORD), DaemonMachine(RECORD)], statemachine=statemachine).session
    assert shared.step(RebalanceAsked(0, None)).done.go is Go.PROCEED and shared.shares
    assert shared.step(RebalanceAsked(0, "hooks X were not applied")).done.reason is Reason.PLUGIN_INCOMPLETE
    assert not shared.shares


def _standby_loaded(daemons: list[DaemonMachine], statemachine: bool) -> Ranks:
    """A warm standby through startup, each rank's own fetch taken (the others come from the all-gather)."""
    ranks = Ranks(daemons, ENGINE, "S", _session_class(statemachine), standby=True)
    assert {s.go for s in ranks.step(lambda r: Started(r, INITIAL))} == {Go.PROCEED}
    for r, rank in enumerate(ranks.ranks):
        reply = daemons[r].fetch_check(rank.session.fetch_claim(r)).to_wire()
        assert rank.session.step(Fetched(r, reply)).done.go is Go.PROCEED
        assert rank.session.view().phase == "load"  # its peers' loads are learnt at the park
    return ranks


def test_a_standby_s_rounds_are_the_session_s(statemachine: bool) -> None:
    """Park, notices, claims: the session says which rank goes next, and whether the round goes on."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    daemons[0].attach_engine(AttachRequest("P"), "sP")  # a primary on rank 0's daemon
    ranks = _standby_loaded(daemons, statemachine)
    assert {s.reason for s in ranks.step(lambda r: RebalanceAsked(r, source="daemon"))} == {Reason.PARKED}
    step = _decided(ranks.step(lambda r: ParkAsked(r)))  # both park; rank 1's park reply is its notice
    assert step.go is Go.PAUSE and all(rank.session.standby_parked for rank in ranks.ranks)
    assert [type(rank.sent[-1]) for rank in ranks.ranks] == [ParkRequest, ParkRequest]
    assert ranks.session.view().phase == "run" and ranks.session.view().claims == ("parked", "notified")
    daemons[0].detach_engine("P", "sP")  # rank 0's notice
    ranks.noticed[0] = True
    daemons[1].attach_engine(AttachRequest("Q"), "sQ")  # another engine attaches before the claims
    step = _decided(ranks.step(lambda r: TakeOverAsked(r)))  # rank 1's claim taken: every rank parks again
    assert step.go is Go.PAUSE and all(rank.session.standby_parked for rank in ranks.ranks)
    assert [type(r) for r in ranks.ranks[0].sent[-2:]] == [ClaimRequest, ParkRequest]
    daemons[1].detach_engine("Q", "sQ")
    ranks.noticed = [False, True]
    step = _decided(ranks.step(lambda r: TakeOverAsked(r)))
    assert step.go is Go.PROCEED and all(rank.session.standby_promoted for rank in ranks.ranks)
    assert all(rank.installed == INITIAL for rank in ranks.ranks)
    assert ranks.session.step(RebalanceAsked(0)).done.go is Go.PROCEED and ranks.session.shares


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


def test_the_commit_check_rides_the_next_begin_and_the_rebalance_end() -> None:
    """One all-gather per chunk: each rank knows only its own commit answer until the next chunk's
    begin gathers every rank's; the rebalance's end gathers them once more."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons)
    assert _chunk(ranks, [0]).go is Go.PROCEED
    ranks.flush()
    sessions = [rank.session for rank in ranks.ranks]
    assert [s.view().owed[1 - r] for r, s in enumerate(sessions)] == [None, None]  # the peers' are owed
    assert all(s.view().owed and s.view().version == 1 for s in sessions)
    assert _chunk(ranks, [1], move=MOVED_TWICE).go is Go.PROCEED
    verdict = _end(ranks)
    assert verdict is not None and verdict.go is Go.PROCEED
    assert all(s.view().version == 2 and s.shares and not s.view().owed for s in sessions)
    assert all(d.view().record.version == 2 and d.view().record.digest == sessions[0].view().digest for d in daemons)


def test_a_failed_commit_stops_at_the_next_begin_and_its_move_stays_pending() -> None:
    """A daemon that refused a commit keeps the move pending and refuses the next begin (its rule for
    the engine's own pending move); the gathered check fails: the ranks that began abort, and
    rebalancing is off with the commit's reason."""
    daemons = [DaemonMachine(RECORD), DaemonMachine(RECORD)]
    ranks = _started(daemons)
    assert _chunk(ranks, [0]).go is Go.PROCEED
    # rank 1's commit reaches its daemon with rows it refuses: its move stays pending
    ranks.on_the_way[1] = lambda request: (
        replace(request, rows=((0, 1, 2),)) if isinstance(request, CommitRequest) else request
    )
    ranks.flush()
    del ranks.on_the_way[1]
    assert daemons[1].view().phase == "pending"
    step = _chunk(ranks, [1], move=MOVED_TWICE)
    assert (
        step.go is Go.STOP and step.reason is Reason.COMMIT_UNVERIFIED and "rank 1: commit not recorded" in step.message
    )
    assert all(
        r.session.view().rebalance == "off" and not r.session.shares and not r.session.view().owed for r in ranks.ranks
    )
    assert daemons[0].view().phase == "clean" and daemons[0].view().record.version == 1  # rank 0's begin aborted
    assert daemons[1].view().phase == "pending" and daemons[1].view().pending.layers == (0,)
