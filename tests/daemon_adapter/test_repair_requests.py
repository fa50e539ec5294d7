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


def test_auto_repair_starts_at_the_movers_eof_and_its_end_is_the_machines(tmp_path):
    """With auto repair the daemon turns repairing on the mover's EOF, refuses begin and fetch_state
    meanwhile, takes an attach (the engine waits), and its reload's end makes it clean at the base
    version (a failed one: dirty with the reason; the operator's repair then repairs). The reload
    is a ``FakeReload`` (this daemon has no model); everything else is the adapter's."""
    from tests.model_based.daemon_hosts import InProcessHost

    rows = [[0, 1], [1, 0]]
    handle = InProcessHost(tmp_path, repairs=True).start("d", rows, 2)
    path = handle.socket_path
    try:
        a = Engine(path, "A")
        a.attach()
        assert status_reason(a.begin([1])) == ("ok", "begun")
        a.detach()
        wait_for(lambda: query(path)["phase"] == "repairing", what="repairing")
        state = query(path)
        assert state["repairing"] == {"engine_id": "A", "layers": [1], "base_version": 0} and state["dirty"] is None
        b = Engine(path, "B")
        attached = b.attach()
        assert attached["phase"] == "repairing" and attached["repairing"]["layers"] == [1]
        assert status_reason(b.begin([0])) == ("refused", "repairing")
        assert status_reason(request(path, repair_request())) == ("busy", "repair_running")
        handle.end_repair(False)
        wait_for(lambda: query(path)["phase"] == "dirty", what="dirty after the failed reload")
        assert "read error" in query(path)["repair_failed"]
        handle.end_repair(True)  # the operator's repair, below, ends well
        reply = request(path, repair_request())
        assert status_reason(reply) == ("ok", "repaired") and reply["version"] == 0 and reply["layers"] == [1]
        state = query(path)
        assert state["phase"] == "clean" and state["version"] == 0 and state["repair_failed"] is None
        assert status_reason(b.begin([0])) == ("ok", "begun")
    finally:
        handle.stop()
