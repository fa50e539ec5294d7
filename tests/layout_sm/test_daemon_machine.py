"""The daemon machine: its declared shape, the table the package's runner reads off it, and each
ladder's conjuncts deciding by themselves (spec/LayoutProtocol.tla: Attach, Fetch, Begin, Commit,
Abort, Detach).

Why: the daemon decides with ``layout_sm.declared``, not python-statemachine's event loop. These
tests hold the runner's table to the declarations, the runner to python-statemachine's own
``send``, and a declaration broken on purpose to a changed answer.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from statemachine.exceptions import TransitionNotAllowed
from tools.mirror.reference import ReferenceDaemonMachine

from layout_sm import messages
from layout_sm.daemon import (
    CLEAN,
    DIRTY,
    LOADING,
    MAX_ATTACHMENTS,
    NO_RECORD,
    PENDING,
    REPAIRING,
    Attach,
    DaemonMachine,
    DaemonView,
    Detach,
    DetachEffect,
    DirtyInfo,
    EventArguments,
    Fetch,
    Move,
    RepairDone,
    RepairFailed,
)
from layout_sm.ladders import LADDERS
from layout_sm.reasons import Reason, Reply
from layout_sm.record import LayoutRecord

from .broken_declaration import without_guard

RECORD = LayoutRecord.build([[0, 1], [1, 0]], 2, version=3)
INITIAL = LayoutRecord.initial([[1, 0], [0, 1]], 2)  # another map: another digest
MOVE = Move("A", "sA", (0,), RECORD.version)
LOADED = (NO_RECORD, CLEAN, PENDING, DIRTY, REPAIRING)
REQUEST_EVENTS = (
    "attach", "fetch", "begin", "commit", "abort", "detach", "repair", "repair_done", "repair_failed", "park", "claim",
    "rejoin",
)  # fmt: skip
# What a fresh daemon (INITIAL, version 0) rejoins at: RECORD, version 3.
REJOIN = messages.RejoinRequest("A", "sA", RECORD.version, RECORD.digest, RECORD.rows)


def _claim(engine_id: str = "A", session: str = "sA", record: LayoutRecord = RECORD) -> messages.FetchLayoutField:
    return messages.FetchLayoutField(engine_id, session, record.version, record.digest)


# -- the declared shape ---------------------------------------------------------------------------


def test_each_event_changes_the_phase_only_where_the_spec_does() -> None:
    """Every transition that changes the phase, every phase-keeping acceptance, and every phase
    each request is answered in."""
    changes, kept, answered = set(), set(), set()
    for state in DaemonMachine.states:
        for transition in state.transitions:
            for event in (str(e) for e in transition.events):
                if transition.target is not state:
                    changes.add((event, state.id, transition.target.id))
                elif list(transition.cond):
                    kept.add((event, state.id))
                else:
                    answered.add((event, state.id))
    assert changes == {
        ("loaded_with_record", LOADING, CLEAN),
        ("loaded_without_record", LOADING, NO_RECORD),
        ("begin", CLEAN, PENDING),  # Begin: ok
        ("commit", PENDING, CLEAN),  # Commit: CommitOk
        ("abort", PENDING, CLEAN),  # Abort
        ("detach", PENDING, DIRTY),  # Detach of the mover, auto repair off
        ("detach", PENDING, REPAIRING),  # Detach of the mover, auto repair on (Repairs)
        ("repair", DIRTY, REPAIRING),  # RepairAgain (the operator's)
        ("repair_done", REPAIRING, CLEAN),  # RepairDone
        ("repair_failed", REPAIRING, DIRTY),  # RepairFails
        ("rejoin", CLEAN, REPAIRING),  # AskRejoin, granted
    }
    # Attach, Fetch, Park and Claim leave dphase: attach and park are taken in every loaded phase, fetch
    # served and a claim granted when clean.
    assert kept == {(event, phase) for event in ("attach", "park") for phase in LOADED} | {
        ("fetch", CLEAN),
        ("claim", CLEAN),
    }
    assert answered == {(event, phase) for event in REQUEST_EVENTS for phase in LOADED}


def test_the_table_is_the_declared_transitions() -> None:
    """The fast path's table, read again from python-statemachine's declarations: per phase and
    event, the transitions in their declared order, each with its guards, target and action."""
    expected: dict[tuple[str, str], list[tuple[list[str], str, str]]] = {}
    for state in DaemonMachine.states:
        for transition in state.transitions:
            for event in (str(e) for e in transition.events):
                if event.startswith("loaded_"):
                    continue
                guards = [str(c.func) if c.expected_value else f"not {c.func}" for c in transition.cond]
                (action,) = [str(c.func) for c in transition.on if not c.is_convention]
                expected.setdefault((state.value, event), []).append((guards, transition.target.value, action))
    table = {
        key: [
            ([g.name if g.expected else f"not {g.name}" for g in r.guards], r.target, r.actions[0].name) for r in rules
        ]
        for key, rules in DaemonMachine.declared().rules.items()
        if not key[1].startswith("loaded_")
    }
    assert table == expected
    # Each accepting transition's guards are its ladder's conjuncts, in precedence order, then its
    # branch's conjunct (the branches first, in order); the answering self-loop comes last and has none.
    for (phase, event), transitions in table.items():
        *accepting, answering = transitions
        assert answering == ([], phase, "answer")
        ladder = LADDERS[event]
        if accepting:
            branches = [ladder.branch_guards(i) for i in range(len(ladder.branches))]
            assert [t[0] for t in accepting] in ([*branches, ladder.guards], [ladder.guards])
            assert all(t[2] == "accept" for t in accepting)


def test_a_daemon_loads_once() -> None:
    for machine in (DaemonMachine(RECORD), ReferenceDaemonMachine(RECORD)):
        with pytest.raises(TransitionNotAllowed):
            machine.load_weights(RECORD)
        with pytest.raises(TransitionNotAllowed):
            machine.load_weights(None)
    reference = ReferenceDaemonMachine(RECORD)
    with pytest.raises(TransitionNotAllowed):
        reference.send("loaded_with_record", record=RECORD)
    assert DaemonMachine(None).phase == NO_RECORD == ReferenceDaemonMachine(None).phase


def test_a_daemon_machine_is_made_once_and_loaded_when_its_weights_are() -> None:
    machine = DaemonMachine(loaded=False)
    assert machine.phase == LOADING
    with pytest.raises(TransitionNotAllowed):
        machine.begin_move(messages.BeginRequest("A", "sA", 0, (0,)))
    machine.load_weights(RECORD, auto_repair=False)
    assert machine.phase == CLEAN and machine.view().record == RECORD and not machine.view().auto_repair


def test_no_request_is_taken_before_the_weights_are_loaded() -> None:
    machine = DaemonMachine(RECORD)
    machine.model.view = None  # back to loading, as a daemon is before its weights are loaded
    assert machine.phase == LOADING
    for step in (
        lambda: machine.attach_engine(messages.AttachRequest("A"), "sA"),
        lambda: machine.fetch_check(None),
        lambda: machine.begin_move(messages.BeginRequest("A", "sA", 3, (0,))),
        lambda: machine.commit_move(messages.CommitRequest("A", "sA", (0,), ((1, 0),))),
        lambda: machine.abort_move(messages.AbortRequest("A", "sA")),
        lambda: machine.detach_engine("A", "sA"),
        lambda: machine.begin_repair(),
        lambda: machine.handle(RepairDone((0,), "reloaded")).reply,
        lambda: machine.handle(RepairFailed(Reason.REPAIR_FAILED, "a read error")).reply,
    ):
        with pytest.raises(TransitionNotAllowed):
            step()


# -- the fast path against python-statemachine's own event loop --------------------------------

VIEWS = {
    "no_record": DaemonView(None, {"A": "sA"}),
    "clean": DaemonView(RECORD, {"A": "sA"}),
    "clean, initial": DaemonView(INITIAL, {"A": "sA"}),
    "clean, two engines": DaemonView(RECORD, {"A": "sA", "B": "sB"}),
    "clean, non-following seen": DaemonView(RECORD, {"A": "sA"}, non_following_seen=True),
    "pending, A's": DaemonView(RECORD, {"A": "sA"}, pending=MOVE),
    "pending, B's": DaemonView(RECORD, {"A": "sA", "B": "sB"}, pending=replace(MOVE, engine_id="B", session="sB")),
    "dirty": DaemonView(RECORD, {"A": "sA"}, dirty=DirtyInfo("B", (0,), RECORD.version)),
    "repairing": DaemonView(RECORD, {"A": "sA"}, dirty=DirtyInfo("B", (0,), RECORD.version), repairing=True),
    "pending, A's, no auto repair": DaemonView(RECORD, {"A": "sA"}, pending=MOVE, auto_repair=False),
    "full": DaemonView(RECORD, {f"E{i}": f"s{i}" for i in range(MAX_ATTACHMENTS)}),
    # warm standbys (issue 18): A parked alone, A parked beside the primary B, A parked on a dirty daemon
    "clean, A parked": DaemonView(RECORD, {"A": "sA"}, parked=frozenset({"A"})),
    "clean, A parked, B primary": DaemonView(RECORD, {"A": "sA", "B": "sB"}, parked=frozenset({"A"})),
    "dirty, A parked": DaemonView(RECORD, {"A": "sA"}, dirty=DirtyInfo("B", (0,), RECORD.version), parked={"A"}),
}
REQUESTS: dict[str, list[Any]] = {
    "attach": [Attach("A", "sA2"), Attach("C", "sC")],
    "fetch": [Fetch(None), Fetch(_claim()), Fetch(_claim(record=INITIAL)), Fetch(_claim("C", "sC"))],
    "begin": [
        messages.BeginRequest("A", "sA", RECORD.version, (0,)),
        messages.BeginRequest("A", "old", RECORD.version, (0,)),
        messages.BeginRequest("A", "sA", RECORD.version, (0, 0)),
        messages.BeginRequest("A", "sA", RECORD.version - 1, (1,)),
        messages.BeginRequest("A", "sA", 0, (0,)),
    ],
    "commit": [
        messages.CommitRequest("A", "sA", (0,), ((1, 1),)),
        messages.CommitRequest("A", "old", (0,), ((1, 1),)),
        messages.CommitRequest("A", "sA", (1,), ((1, 1),)),
        messages.CommitRequest("A", "sA", (0,), ((1, 5),)),
    ],
    "abort": [messages.AbortRequest("A", "sA"), messages.AbortRequest("A", "old"), messages.AbortRequest("B", "sB")],
    "detach": [Detach("A", "sA"), Detach("A", "old"), Detach("B", "sB")],
    "repair": [messages.RepairRequest()],
    "repair_done": [RepairDone((0,), "reloaded"), RepairDone((1,), "reloaded")],
    "repair_failed": [RepairFailed(Reason.REPAIR_FAILED, "a read error")],
    "park": [messages.ParkRequest("A", "sA"), messages.ParkRequest("A", "old")],
    "claim": [messages.ClaimRequest("A", "sA"), messages.ClaimRequest("A", "old")],
    "rejoin": [REJOIN, replace(REJOIN, session="old"), replace(REJOIN, digest=INITIAL.digest)],
}
ENTRY: dict[str, Callable[[DaemonMachine, Any], Any]] = {
    "attach": lambda m, r: m.attach_engine(messages.AttachRequest(r.engine_id), r.session),
    "fetch": lambda m, r: m.fetch_check(r.claim, r.gap),
    "begin": DaemonMachine.begin_move,
    "commit": DaemonMachine.commit_move,
    "abort": DaemonMachine.abort_move,
    "detach": lambda m, r: m.detach_engine(r.engine_id, r.session),
    "repair": lambda m, r: m.begin_repair(),
    "repair_done": lambda m, r: m.handle(r).reply,
    "repair_failed": lambda m, r: m.handle(r).reply,
    "park": DaemonMachine.park_engine,
    "claim": DaemonMachine.claim_primary,
    "rejoin": DaemonMachine.rejoin_layout,
}
CASES = [
    (view_name, event, request)
    for view_name, event in itertools.product(VIEWS, REQUEST_EVENTS)
    for request in REQUESTS[event]
]


def _event_arguments(request: Any) -> dict[str, Any]:
    """The request and its fields, as python-statemachine passes them to the guards that name them."""
    arguments = {"request": request}
    for f in dataclasses.fields(request):
        arguments[f.name] = getattr(request, f.name)
    if isinstance(request, RepairDone):
        arguments["data"] = dict(request.data)
    if isinstance(request, Fetch) and request.claim is not None:
        arguments.update(engine_id=request.engine_id, session=request.session, digest=request.digest)
    return arguments


@pytest.fixture(scope="module")
def machines() -> tuple[DaemonMachine, ReferenceDaemonMachine]:
    return DaemonMachine(RECORD), ReferenceDaemonMachine(RECORD)


@pytest.mark.parametrize(("view_name", "event", "request_"), CASES)
def test_the_fast_path_answers_as_python_statemachine_does(
    machines: tuple[DaemonMachine, ReferenceDaemonMachine], view_name: str, event: str, request_: Any
) -> None:
    fast, reference = machines
    view = VIEWS[view_name]
    fast.restore(view)
    answer = ENTRY[event](fast, request_)
    reference.restore(view)
    assert reference.send(event, **_event_arguments(request_)) == answer
    assert reference.view() == fast.view()
    # The pure ladder gives the same answer, and the transition taken lands in its target.
    assert LADDERS[event].reply(view, request_) == answer
    taken = DaemonMachine.declared().rule(view, event, EventArguments(event, request_), fast)
    assert fast.phase == taken.target


# -- each conjunct decides by itself --------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    """A case where ``conjunct`` is the first of its ladder to fail, and what the daemon answers."""

    event: str
    conjunct: str
    view: DaemonView
    request: Any
    answer: Reason | tuple[bool, bool]  # a reply's reason, or a detach's (dropped, dirty)


BEGIN = messages.BeginRequest("A", "sA", RECORD.version, (0,))
COMMIT = messages.CommitRequest("A", "sA", (0,), ((1, 1),))
CLEAN_VIEW, PENDING_VIEW = VIEWS["clean"], VIEWS["pending, A's"]
OTHER_SESSION = {"A": "sA2"}  # the engine re-attached: its live session is no longer the request's
B_MOVES = VIEWS["pending, B's"]
ACCEPTED: dict[str, tuple[DaemonView, Any, Reason | tuple[bool, bool], str]] = {
    "attach": (CLEAN_VIEW, Attach("C", "sC"), Reason.ATTACHED, CLEAN),
    "fetch": (CLEAN_VIEW, Fetch(_claim()), Reason.SERVED_FOLLOWING, CLEAN),
    "begin": (CLEAN_VIEW, BEGIN, Reason.BEGUN, PENDING),
    "commit": (PENDING_VIEW, COMMIT, Reason.COMMITTED, CLEAN),
    "abort": (PENDING_VIEW, messages.AbortRequest("A", "sA"), Reason.ABORTED, CLEAN),
    "detach": (PENDING_VIEW, Detach("A", "sA"), (True, True), REPAIRING),
    "repair": (VIEWS["dirty"], messages.RepairRequest(), Reason.REPAIR_BEGUN, REPAIRING),
    "repair_done": (VIEWS["repairing"], RepairDone((0,), "reloaded"), Reason.REPAIRED, CLEAN),
    "repair_failed": (
        VIEWS["repairing"],
        RepairFailed(Reason.REPAIR_FAILED, "a read error"),
        Reason.REPAIR_FAILED,
        DIRTY,
    ),
    "park": (VIEWS["clean, two engines"], messages.ParkRequest("A", "sA"), Reason.PARKED, CLEAN),
    "claim": (VIEWS["clean, A parked"], messages.ClaimRequest("A", "sA"), Reason.PROMOTED, CLEAN),
    "rejoin": (VIEWS["clean, initial"], REJOIN, Reason.REJOIN_BEGUN, REPAIRING),
}
BREAKS = [
    Break("attach", "engine_id_free", CLEAN_VIEW, Attach("A", "sA2"), Reason.ENGINE_ID_IN_USE),
    Break("attach", "has_room", VIEWS["full"], Attach("C", "sC"), Reason.TOO_MANY_ATTACHMENTS),
    Break("fetch", "has_record", VIEWS["no_record"], Fetch(_claim()), Reason.SERVED_NO_RECORD),
    Break("fetch", "is_dirty", VIEWS["dirty"], Fetch(_claim()), Reason.DIRTY),
    Break("fetch", "is_repairing", VIEWS["repairing"], Fetch(_claim()), Reason.REPAIRING),
    Break("fetch", "move_pending", PENDING_VIEW, Fetch(_claim()), Reason.MOVE_PENDING),
    Break("fetch", "plugin_complete", CLEAN_VIEW, Fetch(None, "startup_hook_missing"), Reason.PLUGIN_INCOMPLETE),
    Break("fetch", "claims_or_initial", CLEAN_VIEW, Fetch(None), Reason.OLDER_ENGINE_AFTER_MOVE),
    Break("fetch", "claims", VIEWS["clean, initial"], Fetch(None), Reason.SERVED_OLDER_ENGINE),
    Break("fetch", "digest_is_current", CLEAN_VIEW, Fetch(_claim(record=INITIAL)), Reason.DIGEST_MISMATCH),
    Break("fetch", "holds", CLEAN_VIEW, Fetch(_claim("C", "sC")), Reason.SERVED_NON_FOLLOWING),
    Break("begin", "holds", replace(CLEAN_VIEW, attachments=OTHER_SESSION), BEGIN, Reason.NOT_ATTACHED),
    Break("begin", "layers_valid", CLEAN_VIEW, replace(BEGIN, layers=(0, 7)), Reason.INVALID_LAYERS),
    Break("begin", "own_move_pending", PENDING_VIEW, BEGIN, Reason.OWN_MOVE_PENDING),
    Break("begin", "has_record", VIEWS["no_record"], BEGIN, Reason.NO_RECORD),
    Break("begin", "is_dirty", VIEWS["dirty"], BEGIN, Reason.DIRTY),
    Break("begin", "is_repairing", VIEWS["repairing"], BEGIN, Reason.REPAIRING),
    Break("begin", "saw_non_following", VIEWS["clean, non-following seen"], BEGIN, Reason.NON_FOLLOWING_SEEN),
    Break("begin", "base_is_current", CLEAN_VIEW, replace(BEGIN, base_version=2), Reason.STALE_BASE_VERSION),
    Break("begin", "foreign_pending", B_MOVES, BEGIN, Reason.MOVE_PENDING),
    Break("begin", "alone", VIEWS["clean, two engines"], BEGIN, Reason.OTHER_ENGINE_ATTACHED),
    Break("commit", "holds", replace(PENDING_VIEW, attachments=OTHER_SESSION), COMMIT, Reason.NOT_ATTACHED),
    Break("commit", "is_dirty", VIEWS["dirty"], COMMIT, Reason.DIRTY),
    Break("commit", "moved_by", B_MOVES, COMMIT, Reason.NO_PENDING_MOVE),
    Break("commit", "pending_layers_are", PENDING_VIEW, replace(COMMIT, layers=(1,)), Reason.LAYERS_MISMATCH),
    Break("commit", "rows_fit", PENDING_VIEW, replace(COMMIT, rows=((1, 5),)), Reason.BAD_ROWS),
    Break(
        "abort",
        "holds",
        replace(PENDING_VIEW, attachments=OTHER_SESSION),
        messages.AbortRequest("A", "sA"),
        Reason.NOT_ATTACHED,
    ),
    Break("abort", "moved_by", B_MOVES, messages.AbortRequest("A", "sA"), Reason.NOTHING_TO_ABORT),
    Break("detach", "holds", replace(PENDING_VIEW, attachments=OTHER_SESSION), Detach("A", "sA"), (False, False)),
    Break("detach", "moved_by", B_MOVES, Detach("A", "sA"), (True, False)),
    Break("repair", "has_record", VIEWS["no_record"], messages.RepairRequest(), Reason.NO_RECORD),
    Break("repair", "is_repairing", VIEWS["repairing"], messages.RepairRequest(), Reason.REPAIR_RUNNING),
    Break("repair", "is_dirty", CLEAN_VIEW, messages.RepairRequest(), Reason.NOT_DIRTY),
    Break("repair_done", "is_repairing", VIEWS["dirty"], RepairDone((0,), "reloaded"), Reason.NOT_DIRTY),
    Break("repair_done", "repair_is_of", VIEWS["repairing"], RepairDone((1,), "reloaded"), Reason.REPAIR_UNSAFE),
    Break("repair_failed", "is_repairing", CLEAN_VIEW, RepairFailed(Reason.REPAIR_FAILED, "x"), Reason.NOT_DIRTY),
    Break("park", "holds", CLEAN_VIEW, messages.ParkRequest("A", "old"), Reason.NOT_ATTACHED),
    Break("claim", "holds", VIEWS["clean, A parked"], messages.ClaimRequest("A", "old"), Reason.NOT_ATTACHED),
    Break("claim", "is_parked", CLEAN_VIEW, messages.ClaimRequest("A", "sA"), Reason.NOT_PARKED),
    Break(
        "claim",
        "none_unparked",
        VIEWS["clean, A parked, B primary"],
        messages.ClaimRequest("A", "sA"),
        Reason.PRIMARY_ATTACHED,
    ),
    Break(
        "claim",
        "has_record",
        DaemonView(None, {"A": "sA"}, parked=frozenset({"A"})),
        messages.ClaimRequest("A", "sA"),
        Reason.NO_RECORD,
    ),
    Break("claim", "is_dirty", VIEWS["dirty, A parked"], messages.ClaimRequest("A", "sA"), Reason.DIRTY),
    Break(
        "claim",
        "is_repairing",
        replace(VIEWS["dirty, A parked"], repairing=True),
        messages.ClaimRequest("A", "sA"),
        Reason.REPAIRING,
    ),
    Break("rejoin", "holds", VIEWS["clean, initial"], replace(REJOIN, session="old"), Reason.NOT_ATTACHED),
    Break("rejoin", "has_record", VIEWS["no_record"], REJOIN, Reason.NO_RECORD),
    Break("rejoin", "is_dirty", VIEWS["dirty"], REJOIN, Reason.DIRTY),
    Break("rejoin", "is_repairing", VIEWS["repairing"], REJOIN, Reason.REPAIRING),
    Break("rejoin", "move_pending", PENDING_VIEW, REJOIN, Reason.MOVE_PENDING),
    Break("rejoin", "behind", CLEAN_VIEW, REJOIN, Reason.NOT_BEHIND),
    Break(
        "rejoin",
        "only_attached",
        replace(VIEWS["clean, initial"], attachments={"A": "sA", "B": "sB"}),
        REJOIN,
        Reason.OTHER_ENGINE_ATTACHED,
    ),
    Break(
        "rejoin",
        "saw_non_following",
        replace(VIEWS["clean, initial"], non_following_seen=True),
        REJOIN,
        Reason.NON_FOLLOWING_SEEN,
    ),
    Break("rejoin", "rejoin_fits", VIEWS["clean, initial"], replace(REJOIN, digest=INITIAL.digest), Reason.BAD_ROWS),
]


def _answer_of(answer: Reply | DetachEffect) -> Reason | tuple[bool, bool]:
    return (answer.dropped, answer.dirty is not None) if isinstance(answer, DetachEffect) else answer.reason


@pytest.mark.parametrize("event", REQUEST_EVENTS)
def test_all_conjuncts_hold_and_the_request_is_accepted(event: str) -> None:
    view, request, answer, target = ACCEPTED[event]
    assert all(r.conjunct(view, request) for r in LADDERS[event].rungs)
    machine = DaemonMachine(RECORD)
    machine.restore(view)
    assert _answer_of(ENTRY[event](machine, request)) == answer
    assert machine.phase == target


def test_every_rung_is_broken_once() -> None:
    assert {(b.event, b.conjunct) for b in BREAKS} == {
        (event, r.conjunct.method) for event, ladder in LADDERS.items() for r in ladder.rungs
    }


@pytest.mark.parametrize("case", BREAKS, ids=[f"{b.event}-{b.conjunct}" for b in BREAKS])
def test_the_first_failing_conjunct_makes_the_answer_and_keeps_the_phase(case: Break) -> None:
    failing = LADDERS[case.event].first_failing(case.view, case.request)
    assert failing is not None and failing.conjunct.method == case.conjunct
    machine = DaemonMachine(RECORD)
    machine.restore(case.view)
    assert _answer_of(ENTRY[case.event](machine, case.request)) == case.answer
    assert machine.phase == case.view.phase
    assert machine.view().pending == case.view.pending and machine.view().record == case.view.record


# -- a declaration broken on purpose --------------------------------------------------------------


def test_a_guard_dropped_from_the_declaration_changes_what_the_fast_path_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path runs the declared transitions: with ``alone`` dropped from begin's declared
    guards, a daemon with two engines attached takes a move (the spec's BeginsAlone broken)."""
    machine = DaemonMachine(RECORD)
    machine.restore(VIEWS["clean, two engines"])
    assert machine.begin_move(BEGIN).reason is Reason.OTHER_ENGINE_ATTACHED
    without_guard(monkeypatch, "begin", CLEAN, "alone")
    machine.restore(VIEWS["clean, two engines"])
    assert machine.begin_move(BEGIN).reason is Reason.BEGUN
    assert machine.phase == PENDING


def test_a_half_installed_plugin_is_refused_at_every_version_and_the_text_names_the_case() -> None:
    from layout_sm.messages import FETCH_HOOK_MISSING, STARTUP_HOOK_MISSING, parse_plugin_gap

    fetch_reply = LADDERS["fetch"].reply
    for version in (0, 3):
        view = DaemonView(LayoutRecord.build([[0, 1], [1, 0]], 2, version=version), {"A": "sA"})
        startup = fetch_reply(view, Fetch(None, STARTUP_HOOK_MISSING))
        assert startup.reason is Reason.PLUGIN_INCOMPLETE and not startup.ok
        assert "startup hook never ran" in startup.message and "install the" not in startup.message.lower()
        fetch = fetch_reply(view, Fetch(None, FETCH_HOOK_MISSING))
        assert fetch.reason is Reason.PLUGIN_INCOMPLETE and "sends no expert layout" in fetch.message
        machine = DaemonMachine(view.record)
        machine.restore(view)
        machine.fetch_check(None, STARTUP_HOOK_MISSING)
        assert not machine.view().non_following_seen  # refused, so it never maps these weights
    # without a gap, the older engine's replies are unchanged
    assert fetch_reply(DaemonView(RECORD), Fetch(None)).reason is Reason.OLDER_ENGINE_AFTER_MOVE
    assert parse_plugin_gap("something_else") is None and parse_plugin_gap(STARTUP_HOOK_MISSING)
    # dirty outranks: the operator must restart the daemons first
    dirty = DaemonView(RECORD, dirty=DirtyInfo("A", (0,), 3))
    assert fetch_reply(dirty, Fetch(None, FETCH_HOOK_MISSING)).reason is Reason.DIRTY


# -- the repair (issue 19) -------------------------------------------------------------------------


def test_the_movers_detach_repairs_with_auto_repair_and_stays_dirty_without() -> None:
    """The detach's one branch: with auto repair (spec: Repairs) the mover's EOF starts the repair,
    without it the daemon is dirty (the branch's conjunct broken)."""
    assert {(event, b.conjunct.method) for event, ladder in LADDERS.items() for b in ladder.branches} == {
        ("detach", "repairs_automatically")
    }
    for view, phase in ((PENDING_VIEW, REPAIRING), (VIEWS["pending, A's, no auto repair"], DIRTY)):
        machine = DaemonMachine(RECORD)
        machine.restore(view)
        effect = machine.detach_engine("A", "sA")
        assert machine.phase == phase and effect.dirty == DirtyInfo("A", (0,), RECORD.version)
        assert ("REPAIRING" if phase == REPAIRING else "DIRTY") in effect.message
    assert DaemonMachine(RECORD).view().auto_repair and not DaemonMachine(RECORD, auto_repair=False).view().auto_repair


# What the reload reported, and the parked standbys its end tells (none here).
_REPAIRED = {"seconds": 1.5, "layers": [0], "notified": []}


def test_a_repairing_daemon_reports_the_repair_and_a_failed_one_keeps_why() -> None:
    machine = DaemonMachine(RECORD)
    machine.restore(VIEWS["repairing"])
    state = machine.query_state().data
    assert state["phase"] == REPAIRING and state["dirty"] is None
    assert state["repairing"] == {"engine_id": "B", "layers": [0], "base_version": RECORD.version}
    attach = machine.attach_engine(messages.AttachRequest("C"), "sC")
    assert attach.ok and attach.data["phase"] == REPAIRING and attach.data["dirty"] is None
    failed = machine.handle(RepairFailed(Reason.REPAIR_FAILED, "no such file: model-00001.safetensors")).reply
    assert machine.phase == DIRTY and "no such file" in failed.message
    assert "no such file" in machine.fetch_check(_claim()).message  # every refusal says why
    assert machine.query_state().data["repair_failed"] == "no such file: model-00001.safetensors"
    assert machine.begin_repair().reason is Reason.REPAIR_BEGUN and machine.view().repair_failed is None
    done = machine.handle(RepairDone((0,), "reloaded", {"seconds": 1.5})).reply
    assert machine.phase == CLEAN and machine.view().record == RECORD
    assert done.data == {**_REPAIRED, "version": RECORD.version, "digest": RECORD.digest}
