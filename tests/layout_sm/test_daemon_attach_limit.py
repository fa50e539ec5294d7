"""The daemon keeps at most MAX_ATTACHMENTS live attachments: the next attach is busy, and says
what to do; a detach frees a place."""

from __future__ import annotations

from layout_sm.daemon import MAX_ATTACHMENTS, DaemonMachine
from layout_sm.messages import AttachRequest
from layout_sm.reasons import Reason, Status
from layout_sm.record import LayoutRecord


def test_attach_beyond_the_limit_is_busy_and_a_detach_frees_a_place() -> None:
    machine = DaemonMachine(LayoutRecord.initial(((0, 1),), 2))
    for i in range(MAX_ATTACHMENTS):
        assert machine.handle(AttachRequest(f"E{i}"), session=f"s{i}").reply.ok
    reply = machine.handle(AttachRequest("extra"), session="sx").reply
    assert (reply.status, reply.reason) == (Status.BUSY, Reason.TOO_MANY_ATTACHMENTS)
    assert "expert-layout status" in reply.message and str(MAX_ATTACHMENTS) in reply.message
    assert "extra" not in machine.view().attachments
    # an engine id in use is refused first: permanent before transient
    assert machine.handle(AttachRequest("E0"), session="s").reply.reason is Reason.ENGINE_ID_IN_USE
    machine.detach_engine("E0", "s0")
    assert machine.handle(AttachRequest("extra"), session="sx").reply.ok
