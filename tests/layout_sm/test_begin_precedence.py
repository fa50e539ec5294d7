"""docs/protocol.md §4's begin precedence, over every pair of conditions that can hold together.

Conditions are listed in precedence order: for any two that hold at once, the earlier one
decides the reply. Permanent refusals come before transient ``busy``, so an engine is never
told to retry what can never succeed. The replies are the daemon machine's, as the adapter
gets them (``DaemonMachine.begin_move``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from layout_sm.daemon import DaemonMachine, DaemonView, DirtyInfo, Move
from layout_sm.messages import BeginRequest
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutRecord

RECORD = LayoutRecord.build([[0, 1, 2, 3], [3, 2, 1, 0]], 4, version=2)
MACHINE = DaemonMachine(RECORD)


def begin_reply(view: DaemonView, request: BeginRequest) -> Reply:
    """The machine's reply to ``request`` in ``view``."""
    MACHINE.restore(view)
    return MACHINE.begin_move(request)


@dataclass(frozen=True)
class Case:
    view: DaemonView
    request: BeginRequest


def _base() -> Case:
    return Case(DaemonView(RECORD, {"A": "sA"}), BeginRequest("A", "sA", RECORD.version, (0,)))


@dataclass(frozen=True)
class Condition:
    name: str
    status: Status
    reason: Reason
    apply: Callable[[Case], Case]


def _view(case: Case, **changes: object) -> Case:
    return replace(case, view=replace(case.view, **changes))


def _request(case: Case, **changes: object) -> Case:
    return replace(case, request=replace(case.request, **changes))


def _attach_other(case: Case) -> Case:
    return _view(case, attachments={**case.view.attachments, "B": "sB"})


def _other_move(case: Case) -> Case:
    case = _attach_other(case)
    return _view(case, pending=Move("B", "sB", (1,), case.view.record.version if case.view.record else 0))


CONDITIONS = [
    # 1. the request itself (permanent)
    Condition("not_attached", Status.REFUSED, Reason.NOT_ATTACHED, lambda c: _request(c, session="spoofed")),
    Condition("invalid_layers", Status.REFUSED, Reason.INVALID_LAYERS, lambda c: _request(c, layers=(0, 0))),
    Condition(
        "own_move_pending",
        Status.REFUSED,
        Reason.OWN_MOVE_PENDING,
        lambda c: _view(c, pending=Move("A", "sA", (1,), RECORD.version)),
    ),
    # 2. the daemon's state (permanent until restart)
    Condition("no_record", Status.REFUSED, Reason.NO_RECORD, lambda c: _view(c, record=None)),
    Condition(
        "dirty",
        Status.REFUSED,
        Reason.DIRTY,
        lambda c: _view(c, dirty=DirtyInfo("C", (1,), RECORD.version - 1)),
    ),
    Condition(
        "non_following_seen",
        Status.REFUSED,
        Reason.NON_FOLLOWING_SEEN,
        lambda c: _view(c, non_following_seen=True),
    ),
    Condition(
        "stale_base_version",
        Status.REFUSED,
        Reason.STALE_BASE_VERSION,
        lambda c: _request(c, base_version=RECORD.version - 1),
    ),
    # 3. someone else is here (transient)
    Condition("other_move_pending", Status.BUSY, Reason.MOVE_PENDING, _other_move),
    Condition("other_engine_attached", Status.BUSY, Reason.OTHER_ENGINE_ATTACHED, _attach_other),
]

# Pairs the daemon can never be in at once (a move needs a record; dirty replaces the move;
# one move at a time; a stale base needs a version to be stale against).
IMPOSSIBLE = {
    frozenset(p)
    for p in [
        ("own_move_pending", "other_move_pending"),
        ("own_move_pending", "no_record"),
        ("other_move_pending", "no_record"),
        ("own_move_pending", "dirty"),
        ("other_move_pending", "dirty"),
        ("no_record", "dirty"),
        ("no_record", "stale_base_version"),
        ("no_record", "non_following_seen"),
    ]
}
PAIRS = [
    (first, second)
    for first, second in itertools.combinations(CONDITIONS, 2)
    if frozenset((first.name, second.name)) not in IMPOSSIBLE
]


def test_the_happy_path_is_accepted() -> None:
    case = _base()
    reply = begin_reply(case.view, case.request)
    assert reply.status is Status.OK and reply.reason is Reason.BEGUN


@pytest.mark.parametrize("condition", CONDITIONS, ids=lambda c: c.name)
def test_each_condition_alone_gives_its_reply(condition: Condition) -> None:
    case = condition.apply(_base())
    reply = begin_reply(case.view, case.request)
    assert (reply.status, reply.reason) == (condition.status, condition.reason), reply.message


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=lambda c: c.name)
def test_the_earlier_condition_decides(first: Condition, second: Condition) -> None:
    # Apply in both orders: the outcome must not depend on how the state was reached.
    for case in (second.apply(first.apply(_base())), first.apply(second.apply(_base()))):
        reply = begin_reply(case.view, case.request)
        assert (reply.status, reply.reason) == (first.status, first.reason), (
            f"{first.name} + {second.name}: got {reply}"
        )


def test_permanent_refusals_never_come_after_busy() -> None:
    order = [c.status for c in CONDITIONS]
    first_busy = order.index(Status.BUSY)
    assert all(status is Status.BUSY for status in order[first_busy:])
    assert len(PAIRS) >= 25


def test_messages_name_the_engine_and_layers() -> None:
    case = _other_move(_base())
    reply = begin_reply(case.view, case.request)
    assert "'B'" in reply.message and "[1]" in reply.message and "retry" in reply.message
    case = _view(_base(), dirty=DirtyInfo("C", (1,), 1))
    reply = begin_reply(case.view, case.request)
    assert "'C'" in reply.message and "[1]" in reply.message and "restart" in reply.message
