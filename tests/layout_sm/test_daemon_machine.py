"""The daemon machine's shape and guards: what each event may do from each phase, and each guard
deciding by its one conjunct of the spec (spec/LayoutProtocol.tla: Begin, Commit, Abort, Detach)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from statemachine.exceptions import TransitionNotAllowed

import layout_sm.daemon as daemon_module
from layout_sm.daemon import (
    CLEAN,
    DIRTY,
    NO_RECORD,
    PENDING,
    DaemonMachine,
    DaemonView,
    DirtyInfo,
    MachineDisagrees,
    Move,
)
from layout_sm.messages import AbortRequest, BeginRequest, CommitRequest
from layout_sm.reasons import Reason
from layout_sm.record import LayoutRecord

RECORD = LayoutRecord.build([[0, 1], [1, 0]], 2, version=3)
MOVE = Move("A", "sA", (0,), RECORD.version)
PENDING_VIEW = DaemonView(RECORD, {"A": "sA"}, pending=MOVE)


def test_each_event_changes_the_phase_only_where_the_spec_does() -> None:
    """Every transition that changes the phase, and every phase each request is answered in."""
    changes, answered = set(), set()
    for state in DaemonMachine.states:
        for transition in state.transitions:
            if transition.target is state:
                answered.add((transition.event, state.id))
            else:
                changes.add((transition.event, state.id, transition.target.id))
    assert changes == {
        ("loaded_with_record", "loading", CLEAN),
        ("loaded_without_record", "loading", NO_RECORD),
        ("begin", CLEAN, PENDING),  # Begin: ok
        ("commit", PENDING, CLEAN),  # Commit: CommitOk
        ("abort", PENDING, CLEAN),  # Abort
        ("detach", PENDING, DIRTY),  # Detach of the mover
    }
    # The refusals and the phase-keeping detach are declared in the four phases of a loaded daemon.
    loaded = (NO_RECORD, CLEAN, PENDING, DIRTY)
    assert answered == {(event, phase) for event in ("begin", "commit", "abort", "detach") for phase in loaded}


def test_a_daemon_loads_once() -> None:
    machine = DaemonMachine(RECORD)
    with pytest.raises(TransitionNotAllowed):
        machine.send("loaded_with_record", record=RECORD)
    with pytest.raises(TransitionNotAllowed):
        machine.send("loaded_without_record", record=None)
    assert DaemonMachine(None).phase == NO_RECORD


def test_no_request_is_taken_before_the_weights_are_loaded() -> None:
    machine = DaemonMachine(RECORD)
    machine.model.view = None  # back to loading, as a daemon is before its weights are loaded
    assert machine.phase == "loading"
    for event, kwargs in (
        ("begin", {"request": BeginRequest("A", "sA", 3, (0,)), "engine_id": "A", "session": "sA"}),
        ("commit", {"request": CommitRequest("A", "sA", (0,), ((1, 0),)), "engine_id": "A", "session": "sA"}),
        ("abort", {"request": AbortRequest("A", "sA"), "engine_id": "A", "session": "sA"}),
        ("detach", {"engine_id": "A", "session": "sA"}),
    ):
        with pytest.raises(TransitionNotAllowed):
            machine.send(event, **kwargs)


def test_a_reply_that_accepts_where_the_machine_has_no_transition_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dirty daemon has no begin transition out of dirty: a reply function claiming ok is a defect."""
    dirty = DaemonView(RECORD, {"A": "sA"}, dirty=DirtyInfo("B", (0,), RECORD.version))
    machine = DaemonMachine(RECORD)
    machine.restore(dirty)
    monkeypatch.setattr(daemon_module, "begin_reply", lambda view, req: daemon_module.ok(Reason.BEGUN, "forged"))
    with pytest.raises(MachineDisagrees):
        machine.begin_move(BeginRequest("A", "sA", RECORD.version, (0,)))
    assert machine.view() == dirty


def test_an_action_that_misses_its_target_phase_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase is the view's: a transition whose action leaves another phase cannot complete."""
    monkeypatch.setattr(DaemonMachine, "take_move", lambda self, request: None)  # forgets the move
    machine = DaemonMachine(RECORD)  # python-statemachine binds the actions when a machine is made
    machine.restore(DaemonView(RECORD, {"A": "sA"}))
    with pytest.raises(MachineDisagrees):
        machine.begin_move(BeginRequest("A", "sA", RECORD.version, (0,)))


# -- each guard decides by its conjunct ------------------------------------------------------


@dataclass(frozen=True)
class Conjunct:
    guard: str  # the DaemonMachine guard
    breaks: Callable[[DaemonView, dict[str, Any]], tuple[DaemonView, dict[str, Any]]]


def _request(kwargs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    request = replace(kwargs["request"], **changes)
    return {**kwargs, "request": request, "engine_id": request.engine_id, "session": request.session}


def _begin() -> tuple[DaemonView, dict[str, Any]]:
    request = BeginRequest("A", "sA", RECORD.version, (0,))
    return DaemonView(RECORD, {"A": "sA"}), {"request": request, "engine_id": "A", "session": "sA"}


def _commit() -> tuple[DaemonView, dict[str, Any]]:
    request = CommitRequest("A", "sA", (0,), ((1, 1),))
    return PENDING_VIEW, {"request": request, "engine_id": "A", "session": "sA"}


def _abort() -> tuple[DaemonView, dict[str, Any]]:
    return PENDING_VIEW, {"request": AbortRequest("A", "sA"), "engine_id": "A", "session": "sA"}


def _detach() -> tuple[DaemonView, dict[str, Any]]:
    return PENDING_VIEW, {"engine_id": "A", "session": "sA"}


def _other_session(view: DaemonView, kwargs: dict[str, Any]) -> tuple[DaemonView, dict[str, Any]]:
    """The engine re-attached: its live session is no longer the request's (or the move's)."""
    return replace(view, attachments={**view.attachments, "A": "sA2"}), kwargs


def _moved_by_other(view: DaemonView, kwargs: dict[str, Any]) -> tuple[DaemonView, dict[str, Any]]:
    assert view.pending is not None
    moved_by_b = replace(view.pending, engine_id="B")
    return replace(view, attachments={**view.attachments, "B": "sB"}, pending=moved_by_b), kwargs


EVENTS: dict[str, tuple[Callable[[], tuple[DaemonView, dict[str, Any]]], str, list[Conjunct]]] = {
    "begin": (
        _begin,
        PENDING,
        [
            Conjunct("attached", _other_session),
            Conjunct("layers_valid", lambda v, k: (v, _request(k, layers=(0, 7)))),
            Conjunct("non_following_seen", lambda v, k: (replace(v, non_following_seen=True), k)),
            Conjunct("base_version_current", lambda v, k: (v, _request(k, base_version=RECORD.version - 1))),
            Conjunct("alone", lambda v, k: (replace(v, attachments={**v.attachments, "B": "sB"}), k)),
        ],
    ),
    "commit": (
        _commit,
        CLEAN,
        [
            Conjunct("attached", _other_session),
            Conjunct("mover", _moved_by_other),
            Conjunct("same_layers", lambda v, k: (v, _request(k, layers=(1,)))),
            Conjunct("rows_fit", lambda v, k: (v, _request(k, rows=((1, 5),)))),
        ],
    ),
    "abort": (_abort, CLEAN, [Conjunct("attached", _other_session), Conjunct("mover", _moved_by_other)]),
    "detach": (_detach, DIRTY, [Conjunct("attached", _other_session), Conjunct("mover", _moved_by_other)]),
}
CASES = [(event, c) for event, (_, _, conjuncts) in EVENTS.items() for c in conjuncts]


def _guard_values(machine: DaemonMachine, guards: list[str], kwargs: dict[str, Any]) -> dict[str, bool]:
    """Each guard asked as python-statemachine asks it: with the arguments it names."""
    out = {}
    for name in guards:
        method = getattr(machine, name)
        wanted = method.__code__.co_varnames[1 : method.__code__.co_argcount]
        out[name] = bool(method(**{k: kwargs[k] for k in wanted}))
    return out


def _send(machine: DaemonMachine, event: str, kwargs: dict[str, Any]) -> None:
    machine.send(event, **kwargs)


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_all_conjuncts_hold_and_the_phase_changes(event: str) -> None:
    base, target, conjuncts = EVENTS[event]
    view, kwargs = base()
    machine = DaemonMachine(RECORD)
    machine.restore(view)
    names = [c.guard for c in conjuncts]
    expected = {name: name != "non_following_seen" for name in names}  # the one guard that is negated
    assert _guard_values(machine, names, kwargs) == expected
    _send(machine, event, kwargs)
    assert machine.phase == target


@pytest.mark.parametrize(("event", "conjunct"), CASES, ids=[f"{e}-{c.guard}" for e, c in CASES])
def test_one_conjunct_false_keeps_the_phase(event: str, conjunct: Conjunct) -> None:
    """Break one conjunct: its guard alone turns, and the request is answered without a phase change."""
    base, _, conjuncts = EVENTS[event]
    view, kwargs = conjunct.breaks(*base())
    machine = DaemonMachine(RECORD)
    machine.restore(view)
    names = [c.guard for c in conjuncts]
    holds = {name: name != "non_following_seen" for name in names}
    holds[conjunct.guard] = not holds[conjunct.guard]
    assert _guard_values(machine, names, kwargs) == holds
    phase = machine.phase
    _send(machine, event, kwargs)
    assert machine.phase == phase
    if event == "detach":
        assert machine.view().pending == view.pending  # a stale or non-mover EOF keeps the move
    else:
        assert machine.view().pending == view.pending and machine.view().record == view.record


def test_a_half_installed_plugin_is_refused_at_every_version_and_the_text_names_the_case() -> None:
    from layout_sm.daemon import fetch_reply
    from layout_sm.messages import FETCH_HOOK_MISSING, STARTUP_HOOK_MISSING, parse_plugin_gap

    for version in (0, 3):
        view = DaemonView(LayoutRecord.build([[0, 1], [1, 0]], 2, version=version), {"A": "sA"})
        startup = fetch_reply(view, None, STARTUP_HOOK_MISSING)
        assert startup.reason is Reason.PLUGIN_INCOMPLETE and not startup.ok
        assert "startup hook never ran" in startup.message and "install the" not in startup.message.lower()
        fetch = fetch_reply(view, None, FETCH_HOOK_MISSING)
        assert fetch.reason is Reason.PLUGIN_INCOMPLETE and "sends no expert layout" in fetch.message
        machine = DaemonMachine(view.record)
        machine.restore(view)
        machine.fetch_check(None, STARTUP_HOOK_MISSING)
        assert not machine.view().non_following_seen  # refused, so it never maps these weights
    # without a gap, the older engine's replies are unchanged
    assert fetch_reply(DaemonView(RECORD), None).reason is Reason.OLDER_ENGINE_AFTER_MOVE
    assert parse_plugin_gap("something_else") is None and parse_plugin_gap(STARTUP_HOOK_MISSING)
    # dirty outranks: the operator must restart the daemons first
    dirty = DaemonView(RECORD, dirty=DirtyInfo("A", (0,), 3))
    assert fetch_reply(dirty, None, FETCH_HOOK_MISSING).reason is Reason.DIRTY
