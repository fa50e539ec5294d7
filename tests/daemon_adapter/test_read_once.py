"""A request is read off its connection once: sglang's handler gets it as the daemon read it.

The daemon reads and checks every frame before anything is unpickled (the hardening); sglang's
``_handle_connection`` then reads its request through its module's ``recv_msg``, which the daemon
hooks (``daemon_adapter.daemon._recv_request``), so the frame is not read and unpickled a second
time. A request that comes in parts is read whole in its connection's own thread.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sglang.srt.weight_cache import daemon as sglang_daemon
from tools.harness.daemon_proc import DaemonProcess, connect, default_cache_config, recv_frame, send_frame
from tools.harness.loaded_daemon import FakeLoadedLayoutAwareDaemon

from daemon_adapter import daemon as daemon_module
from layout_sm.messages import AttachRequest, fetch_layout_field, query_request
from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP, NUM_LOGICAL

SESSION = "s" * 32


@pytest.fixture
def in_process() -> Iterator[FakeLoadedLayoutAwareDaemon]:
    """A layout-aware daemon in this process, attached by engine "A" (served over socketpairs)."""
    daemon = FakeLoadedLayoutAwareDaemon(
        socket_path="", config=default_cache_config(), tensors={"model.layers.0.w": torch.zeros(4)}
    )
    daemon.set_initial_layout(INITIAL_MAP, NUM_LOGICAL)
    machine, _ = daemon._machine()
    assert machine.handle(AttachRequest("A"), session=SESSION).reply.ok
    yield daemon


def _served(daemon: FakeLoadedLayoutAwareDaemon, request: dict[str, Any]) -> Any:
    """``request`` through the daemon's handler, as sglang's serve loop calls it; the reply."""
    client, server = socket.socketpair()
    with client, server:
        send_frame(client, request)
        daemon._handle_connection(server)
        return recv_frame(client, plain=False)


def _requests() -> list[dict[str, Any]]:
    claim = fetch_layout_field("A", SESSION, 0, layout_digest(INITIAL_MAP))
    return [
        {"type": "ping"},
        {"type": "query_config"},
        {"type": "fetch_state", "config": default_cache_config(), "expert_layout": claim},
        query_request(),
    ]


def _check_replies(replies: list[Any]) -> None:
    ping, config, fetch, query = replies
    assert ping == {"status": "ok"}
    assert config["status"] == "ok" and config["config"] == default_cache_config()
    assert fetch["status"] == "ok" and list(fetch["entries"]) == ["model.layers.0.w"], fetch
    assert query["status"] == "ok" and query["attached"] == ["A"]


def test_sglangs_handler_reads_no_frame_itself(
    in_process: FakeLoadedLayoutAwareDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[object] = []
    original = daemon_module._sglang_recv_msg

    def counted(conn: object) -> Any:
        reads.append(conn)
        return original(conn)

    monkeypatch.setattr(daemon_module, "_sglang_recv_msg", counted)
    _check_replies([_served(in_process, request) for request in _requests()])
    assert sglang_daemon.recv_msg is daemon_module._recv_request
    assert reads == [], "sglang's handler read a frame the daemon had read already"


def test_a_recv_msg_hooked_by_someone_else_still_gets_the_request(
    in_process: FakeLoadedLayoutAwareDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another hook in its place (sglang's own recv_msg, say): the frame the daemon read is replayed to it."""
    monkeypatch.setattr(sglang_daemon, "recv_msg", daemon_module._sglang_recv_msg)
    _check_replies([_served(in_process, request) for request in _requests()])


def test_a_request_sent_in_parts_is_read_whole(daemon: DaemonProcess) -> None:
    """A client that sends its frame in parts, the header first: the daemon reads the rest in the
    connection's thread and answers as for a whole frame (a layout request and sglang's alike)."""
    for request in _requests():
        if request["type"] == "fetch_state":
            del request["expert_layout"]  # this daemon's engine "A" is not attached: a plain fetch
        body = pickle.dumps(request)
        frame = struct.pack("!I", len(body)) + body
        with connect(daemon.socket_path) as sock:
            sock.sendall(frame[:2])
            time.sleep(0.2)
            sock.sendall(frame[2:7])
            time.sleep(0.2)
            sock.sendall(frame[7:])
            reply = recv_frame(sock, plain=False)
        assert reply["status"] == "ok", (request["type"], reply)


def test_a_fetch_that_bypasses_the_daemons_read_is_not_served(in_process: FakeLoadedLayoutAwareDaemon) -> None:
    """The layout gate is installed once, on sglang's backend; the claim it checks comes with the
    daemon's read of the request. sglang's handler called on a bare connection (no such read) fails
    closed: nothing is sent, not even to a fetch that claims the daemon's own layout."""
    client, server = socket.socketpair()
    with client, server:
        send_frame(client, _requests()[2])
        with pytest.raises(RuntimeError, match="without the layout-aware daemon's read"):
            sglang_daemon.WeightCacheDaemon._handle_connection(in_process, server)
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(1)
    # The same request through the daemon's own handler is served.
    assert _served(in_process, _requests()[2])["status"] == "ok"


def test_a_request_sent_just_after_connecting_is_answered_in_the_serve_loop(
    in_process: FakeLoadedLayoutAwareDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy host a client's connect wakes the daemon before the client sends (measured on a real
    2-rank server: 10 of 36 requests): the serve loop waits ``FIRST_BYTES_WAIT_S`` for the
    request's first bytes and answers it at once, instead of starting a thread for it."""
    threads: list[object] = []
    monkeypatch.setattr(in_process, "_serve_in_thread", lambda conn, taken: threads.append(taken))
    # A wait long enough for a loaded test machine to send within it every time.
    monkeypatch.setattr(daemon_module, "FIRST_BYTES_WAIT_S", 2.0)
    late_s = 0.05
    for request in _requests():
        client, server = socket.socketpair()
        with client, server:
            sender = threading.Timer(late_s, send_frame, (client, request))
            sender.start()
            daemon_module.LayoutAwareDaemon._handle_connection(in_process, server)
            sender.join()
            assert threads == [], f"{request['type']!r}, sent within the wait, was handed to a thread"
            reply = recv_frame(client, plain=False)
        assert reply["status"] == "ok", (request["type"], reply)
