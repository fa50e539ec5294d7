"""The standby's notice reader: a closed connection ends it quietly, anything else is logged before it ends."""

from __future__ import annotations

import logging
import threading

import pytest

from engine_adapter.standby import StandbyLink
from layout_sm.messages import NOTICE


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


@pytest.mark.parametrize("closed", [ConnectionError("EOF"), OSError(9, "Bad file descriptor")])
def test_a_closed_connection_ends_the_reader_quietly(closed: OSError, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="engine_adapter"):
        link = _read({"type": NOTICE}, closed)
    assert link.noticed.wait(1) and link.wake_pending
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


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
