"""Sockets to one weight cache daemon: one request per connection, and the long-lived attachment.

sglang's serve loop answers one request per connection and closes it, so every request here
opens its own connection. The attach connection is the exception: the daemon keeps it open and
reads its EOF as the detach, so it lives as long as the engine process, and no longer:
``os.register_at_fork`` closes it in forked children (a child that outlived the engine would
otherwise keep a dead engine counted as attached).

Framing is sglang's own ``send_msg``/``recv_msg`` (looked up at call time, so the loader's
hooks on them, which only act inside a ``fetch_state``, see these calls pass through).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
import weakref
from typing import Any

from sglang.srt.weight_cache import protocol

from daemon_adapter import wire

# A daemon answers a layout request in well under a millisecond; this bounds a wedged one.
REQUEST_TIMEOUT_S = 30.0


class DaemonAbsent(ConnectionError):
    """No daemon socket at the path (sglang's loader falls back to disk in this case)."""


def _connect(path: str, timeout: float) -> socket.socket:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise DaemonAbsent(f"no weight cache daemon socket at {path}") from None
    # The same ownership rule as sglang's IpcModelLoader: never talk to a planted socket.
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        raise ConnectionError(f"{path} is not a socket owned by this user")
    try:
        # Retries while the daemon's accept queue (a backlog of 8) is full.
        return wire.connect(path, timeout)
    except FileNotFoundError:
        raise DaemonAbsent(f"no weight cache daemon socket at {path}") from None


def request(path: str, msg: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """Send one request on its own connection and return the daemon's reply."""
    sock = _connect(path, timeout)
    try:
        protocol.send_msg(sock, msg)
        return protocol.recv_msg(sock)
    finally:
        sock.close()


_OPEN: weakref.WeakSet[Attachment] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


class Attachment:
    """The attach connection to one daemon; ``reply`` is the daemon's answer to the attach."""

    def __init__(self, path: str, attach_msg: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.path = path
        self._sock: socket.socket | None = _connect(path, timeout)
        try:
            protocol.send_msg(self._sock, attach_msg)
            self.reply: Any = protocol.recv_msg(self._sock)
        except BaseException:
            self.close()
            raise
        # Nothing more is read or written: the connection only has to stay open.
        self._sock.settimeout(None)
        self.opened_at = time.monotonic()
        with _OPEN_LOCK:
            _OPEN.add(self)

    @property
    def open(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        """Detach: the daemon sees EOF once no process holds the connection."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _drop_in_child(self) -> None:
        # close(), not shutdown(): shutdown would end the parent's connection too.
        self.close()


def _close_all_in_child() -> None:
    for att in list(_OPEN):
        att._drop_in_child()


os.register_at_fork(after_in_child=_close_all_in_child)
