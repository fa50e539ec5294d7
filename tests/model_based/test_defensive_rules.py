"""Rules no behaviour of the bounded models reaches (the spec's engines never send such requests),
checked on a real daemon over a real Unix socket: a move belongs to its session only."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon_adapter import client
from layout_sm import messages
from tests.model_based.daemon_hosts import InProcessHost

ROWS = [[0, 1], [0, 1]]


@pytest.fixture()
def daemon() -> Iterator[Any]:
    with tempfile.TemporaryDirectory(prefix="defensive-") as tmp:
        d = InProcessHost(Path(tmp)).start("d", ROWS, 2)
        yield d
        d.stop()


def _pending_move(d: Any) -> Any:
    return client.request(d.socket_path, messages.query_request())["pending"]


def test_another_engine_cannot_abort_or_commit_a_move(daemon: Any) -> None:
    a = client.Attachment(daemon.socket_path, messages.attach_request("A"))
    begun = client.request(daemon.socket_path, messages.begin_request("A", a.reply["session"], 0, [0]))
    assert begun["status"] == "ok", begun
    b = client.Attachment(daemon.socket_path, messages.attach_request("B"))
    try:
        reply = client.request(daemon.socket_path, messages.abort_request("B", b.reply["session"]))
        assert (reply["status"], reply["reason"]) == ("ok", "nothing_to_abort"), reply
        assert _pending_move(daemon)["engine_id"] == "A"
        reply = client.request(daemon.socket_path, messages.commit_request("B", b.reply["session"], [0], [[1, 0]]))
        assert reply["status"] == "refused", reply
        assert _pending_move(daemon)["engine_id"] == "A"
        # A's own commit still goes through
        reply = client.request(daemon.socket_path, messages.commit_request("A", a.reply["session"], [0], [[1, 0]]))
        assert (reply["status"], reply["version"]) == ("ok", 1), reply
    finally:
        a.close()
        b.close()


def test_a_commit_must_name_the_layers_of_its_move(daemon: Any) -> None:
    a = client.Attachment(daemon.socket_path, messages.attach_request("A"))
    try:
        session = a.reply["session"]
        assert client.request(daemon.socket_path, messages.begin_request("A", session, 0, [0]))["status"] == "ok"
        reply = client.request(daemon.socket_path, messages.commit_request("A", session, [1], [[1, 0]]))
        assert (reply["status"], reply["reason"]) == ("refused", "layers_mismatch"), reply
        assert _pending_move(daemon)["layers"] == [0]  # the move stays pending
        assert client.request(daemon.socket_path, messages.query_request())["version"] == 0
    finally:
        a.close()
