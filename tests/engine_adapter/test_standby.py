"""The standby's notice reader: the engine closing its attachment ends it quietly; its daemon going away,
or a message it cannot read, is logged before it ends."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest

from daemon_adapter import client
from engine_adapter import state
from engine_adapter.standby import StandbyLink
from layout_sm.messages import NOTICE
from layout_sm.reasons import Reason, ok


class _Attachment:
    """An attach connection that hands out ``messages`` (an exception instance is raised), then ends."""

    def __init__(self, *messages: object) -> None:
        self.messages = list(messages)
        self.open = True
        self.done = threading.Event()

    def notice(self, timeout: float | None) -> object:
        if not self.messages:
            self.open = False
            self.done.set()
            return None
        message = self.messages.pop(0)
        if isinstance(message, BaseException):
            self.done.set()
            raise message
        return message


def _read(*messages: object) -> StandbyLink:
    attachment = _Attachment(*messages)
    link = StandbyLink(attachment)  # type: ignore[arg-type]
    assert attachment.done.wait(5)
    return link


def test_the_engine_closing_its_attachment_ends_the_reader_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="engine_adapter"):
        link = _read({"type": NOTICE}, OSError(9, "Bad file descriptor"))
    assert link.noticed.wait(1) and link.wake_pending
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_daemon_that_goes_away_is_named_with_the_way_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A parked standby's daemon dies (here: it answers the attach, then closes the connection, as a killed
    process's kernel does): sglang's watchdog ends the standby; the standby says why and what to do."""
    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def daemon() -> None:
        conn, _ = server.accept()
        client.recv_frame(conn)
        client.send_frame(conn, ok(Reason.ATTACHED, "attached", session="s").to_wire())
        conn.close()  # the daemon's process is gone

    threading.Thread(target=daemon, daemon=True).start()
    st = state.get()
    st.rank, st.socket_path = 1, path
    try:
        with caplog.at_level(logging.ERROR, logger="engine_adapter"):
            link = StandbyLink(client.Attachment(path, {"type": "expert_layout_attach", "engine_id": "S"}))
            for _ in range(100):
                if caplog.records:
                    break
                threading.Event().wait(0.02)
    finally:
        state.reset()
        server.close()
    assert not link.noticed.is_set()
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    line = record.getMessage()
    assert f"rank 1: the weight cache daemon at {path} went away" in line, line
    assert "Start that daemon again" in line and "a new warm standby" in line, line


def test_an_unreadable_message_is_logged_not_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="engine_adapter"):
        link = _read(ValueError("frame of 99999999999 bytes exceeds the limit"))
        for _ in range(50):  # the reader logs right after the raise
            if caplog.records:
                break
            threading.Event().wait(0.02)
    assert not link.noticed.is_set()
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "notice reader stopped" in record.getMessage() and record.exc_info is not None
