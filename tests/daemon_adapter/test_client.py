"""``daemon_adapter.client``, the one client of the daemons' socket (engine plugin, status CLI, test
processes): sglang's frame both ways, plain replies only, the engine's ownership rule, and the one
"older daemon" check against sglang's own daemon."""

from __future__ import annotations

import collections
import os
import pickle
import socket

import pytest

from daemon_adapter import client
from layout_sm.engine import RankFinding
from layout_sm.messages import attach_request, is_older_daemon_reply, query_request


def test_frames_are_sglangs_both_ways() -> None:
    from sglang.srt.weight_cache.protocol import recv_msg, send_msg

    message = {"type": "expert_layout_query", "include_map": True, "rows": [[0, 1], [1, 0]]}
    left, right = socket.socketpair()
    with left, right:
        client.send_frame(left, message)
        assert recv_msg(right) == message
        send_msg(right, message)
        assert client.recv_frame(left) == message


def test_a_reply_with_a_class_is_refused_unless_asked_for() -> None:
    left, right = socket.socketpair()
    with left, right:
        client.send_frame(right, collections.OrderedDict(status="ok"))
        with pytest.raises(pickle.UnpicklingError, match=r"collections\.OrderedDict"):
            client.recv_frame(left)
        client.send_frame(right, collections.OrderedDict(status="ok"))
        assert client.recv_frame(left, plain=False) == {"status": "ok"}


def test_the_engine_talks_only_to_its_own_users_socket(short_tmp: str) -> None:
    with pytest.raises(client.DaemonAbsent, match="no weight cache daemon socket"):
        client.request(f"{short_tmp}/missing.sock", query_request())
    planted = f"{short_tmp}/planted.sock"
    with open(planted, "w"):
        pass
    with pytest.raises(ConnectionError, match="not a socket owned by this user"):
        client.request(planted, query_request())
    # the status CLI's rule: any owner (it unpickles no class); a file is still no daemon
    with pytest.raises(OSError) as caught:
        client.request(planted, query_request(), owner_only=False)
    assert "not a socket owned" not in str(caught.value)
    os.unlink(planted)


def test_older_daemon_is_sglangs_answer_to_a_layout_request(make_daemon) -> None:
    older = make_daemon("older", plain_sglang=True)
    aware = make_daemon("aware")
    for request in (query_request(), attach_request("engine-A")):
        assert is_older_daemon_reply(client.request(older.socket_path, request))
        assert not is_older_daemon_reply(client.request(aware.socket_path, query_request()))
    sock, reply = client.attach(older.socket_path, "engine-A")
    sock.close()
    finding = RankFinding.from_attach_reply(0, reply)
    assert finding.kind == "no_record" and "older daemon" in finding.detail
    # another error is not an older daemon
    assert not is_older_daemon_reply({"status": "error", "message": "'fetch_state' request failed"})
    assert not is_older_daemon_reply("Unknown request type")
