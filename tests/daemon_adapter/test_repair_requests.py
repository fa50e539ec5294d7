"""``expert_layout_repair`` over a real socket to a layout-aware daemon process without a model: what
the adapter answers when there is nothing to repair, or nothing to repair with (the reload itself is
tests/daemon_adapter/test_repair_real.py, on real daemons of a real model)."""

from __future__ import annotations

from tools.harness.daemon_proc import request

from layout_sm.messages import repair_request

from .helpers import Engine, query, status_reason, wait_for


def test_a_clean_daemon_has_nothing_to_repair(daemon):
    reply = request(daemon.socket_path, repair_request())
    assert status_reason(reply) == ("refused", "not_dirty")
    assert query(daemon.socket_path)["phase"] == "clean"


def test_a_failed_repair_leaves_the_daemon_dirty_with_the_reason(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    assert status_reason(a.begin([1])) == ("ok", "begun")
    a.detach()
    wait_for(lambda: query(daemon.socket_path)["phase"] == "dirty", what="dirty")
    reply = request(daemon.socket_path, repair_request())
    # This daemon serves tensors, not a model: there is nothing to reload them with.
    assert status_reason(reply) == ("refused", "repair_failed")
    assert "model is not loaded" in reply["message"] and "stays dirty" in reply["message"]
    state = query(daemon.socket_path)
    assert state["phase"] == "dirty" and state["dirty"]["layers"] == [1]
    # and the daemon still serves: a second repair gets the same answer, not a busy one
    assert status_reason(request(daemon.socket_path, repair_request())) == ("refused", "repair_failed")
