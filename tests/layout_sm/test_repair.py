"""``layout_sm.repair``: what a dirty daemon reloads, decided from the machine's own view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from layout_sm.daemon import DaemonMachine, DaemonView, DirtyInfo
from layout_sm.messages import (
    BeginRequest,
    CommitRequest,
    RepairRequest,
    parse_request,
    repair_request,
    request_wire,
)
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutRecord
from layout_sm.repair import RepairPlan, repair_plan

INITIAL = LayoutRecord.initial(((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)), 4)
MOVED = ((3, 2, 1, 0),)


def _dirty_machine(committed_first: bool) -> DaemonMachine:
    """A machine driven through its own events: optionally a committed move of layer 1, then a
    move of layers 2 and 1 whose mover leaves before committing."""
    machine = DaemonMachine(INITIAL, auto_repair=False)
    assert machine.attach_engine(parse_request({"type": "expert_layout_attach", "engine_id": "A"}), "sA").ok  # type: ignore[arg-type]
    version = 0
    if committed_first:
        assert machine.begin_move(BeginRequest("A", "sA", 0, (1,))).ok
        assert machine.commit_move(CommitRequest("A", "sA", (1,), MOVED)).ok
        version = 1
    assert machine.begin_move(BeginRequest("A", "sA", version, (2, 1))).ok
    effect = machine.detach_engine("A", "sA")
    assert effect.dirty is not None
    return machine


@pytest.mark.parametrize("committed_first", [False, True])
def test_a_dirty_daemon_reloads_the_moved_layers_with_the_base_versions_rows(committed_first: bool) -> None:
    machine = _dirty_machine(committed_first)
    view = machine.view()
    plan = repair_plan(view)
    assert isinstance(plan, RepairPlan)
    # The record never changed while dirty: it is the base version's, map and digest.
    base = view.record
    assert base is not None and plan.record == base
    assert plan.base_version == base.version == (1 if committed_first else 0)
    assert plan.layers == (1, 2)  # sorted, whatever order the move named them in
    assert plan.rows == (base.rows[1], base.rows[2])
    assert plan.rows[0] == (MOVED[0] if committed_first else (0, 1, 2, 3))
    assert plan.to_wire() == {"layers": [1, 2], "base_version": base.version, "digest": base.digest}


def test_a_clean_or_pending_daemon_has_nothing_to_repair() -> None:
    for view in (DaemonView(INITIAL), replace(_dirty_machine(False).view(), dirty=None)):
        reply = repair_plan(view)
        assert isinstance(reply, Reply) and (reply.status, reply.reason) == (Status.REFUSED, Reason.NOT_DIRTY)
        assert "nothing to repair" in reply.message


def test_a_daemon_without_a_record_has_nothing_to_repair() -> None:
    reply = repair_plan(DaemonView(None, dirty=DirtyInfo("A", (0,), 0)))
    assert isinstance(reply, Reply) and reply.reason is Reason.NO_RECORD


@pytest.mark.parametrize(
    ("dirty", "says"),
    [
        (DirtyInfo("A", (0,), 7), "version 7"),  # the base is not the record: its rows are unknown
        (DirtyInfo("A", (5,), 0), "[5]"),
        (DirtyInfo("A", (), 0), "[]"),
    ],
)
def test_a_dirty_info_that_does_not_fit_the_record_is_refused(dirty: DirtyInfo, says: str) -> None:
    reply = repair_plan(DaemonView(INITIAL, dirty=dirty))
    assert isinstance(reply, Reply) and reply.reason is Reason.REPAIR_UNSAFE
    assert says in reply.message and "stays dirty" in reply.message


def test_the_repair_request_round_trips() -> None:
    assert parse_request(repair_request()) == RepairRequest()
    assert request_wire(RepairRequest()) == repair_request()
