"""The client side of a weight cache daemon's socket, for every client of this project: the engine
plugin (``engine_adapter``), ``expert-layout status``, and test, demo and bench processes.

The frame is sglang's own (``send_msg``/``recv_msg`` in ``sglang.srt.weight_cache.protocol``): a
4-byte big-endian length, then a pickle. It is written out here instead of calling sglang's
functions, because they do not fit a client of this protocol:

- importing sglang's protocol module imports torch and most of sglang (18 s and about 500 MB a
  process on the 2-core test machine), too slow for a status command and for cheap test clients;
- its ``recv_msg`` unpickles with sglang's ``SafeUnpickler``, which still loads some classes, while
  a daemon's reply is plain data: ``recv_frame`` refuses every class unless told otherwise.

Where sglang's functions do fit, they are used: the daemon answers with sglang's ``send_msg``, and
sglang's loader keeps its own ``send_msg``/``recv_msg`` for ``fetch_state`` (hooked by
``engine_adapter.loader``). The daemon's checks of an incoming request frame (sizes, opcodes) are
the daemon's, in ``daemon_adapter.wire``. A test sends frames both ways between these functions
and sglang's.

sglang's serve loop answers one request per connection and closes it, so ``request`` opens a
connection per request. The attach connection is the exception: the daemon keeps it open and
reads its EOF as the detach. ``Attachment`` keeps it as long as the engine process lives, and no
longer: ``os.register_at_fork`` closes it in forked children (a child that outlived the engine
would otherwise keep a dead engine counted as attached).
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import stat
import struct
import threading
import time
import weakref
from typing import Any

from layout_sm.messages import attach_request

FRAME_HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # sglang's MAX_MSG_SIZE: the largest reply a client reads
# A daemon answers a layout request in well under a millisecond; this bounds a wedged one.
REQUEST_TIMEOUT_S = 30.0


class DaemonAbsent(ConnectionError):
    """No daemon socket at the path (sglang's loader falls back to disk in this case)."""


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a daemon reply never needs a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"reply contains {module}.{name}; a daemon reply is plain data")


def connect(socket_path: str, timeout: float = REQUEST_TIMEOUT_S, owner_only: bool = True) -> socket.socket:
    """Connect to a daemon's socket, retrying while its accept queue is full.

    ``owner_only`` (the engine's rule, the same as sglang's ``IpcModelLoader``): refuse a path that
    is not a socket owned by this user, so that a planted socket never feeds the engine. Raises
    ``DaemonAbsent`` when there is no socket at the path.

    sglang's daemon listens with a backlog of 8; on Linux a connect to a Unix socket with a full
    backlog fails at once with EAGAIN (``BlockingIOError``) when the socket has a timeout, instead
    of waiting. Many engines starting at once meet this.
    """
    if owner_only:
        try:
            st = os.lstat(socket_path)
        except FileNotFoundError:
            raise DaemonAbsent(f"no weight cache daemon socket at {socket_path}") from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise ConnectionError(f"{socket_path} is not a socket owned by this user")
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
        except FileNotFoundError:
            sock.close()
            raise DaemonAbsent(f"no weight cache daemon socket at {socket_path}") from None
        except BaseException:
            sock.close()
            raise


def send_frame(sock: socket.socket, obj: Any) -> None:
    """One frame, as sglang's ``send_msg`` writes it."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(FRAME_HEADER.pack(len(data)) + data)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes; ConnectionError when the peer closed first."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, plain: bool = True) -> Any:
    """One frame. ``plain`` refuses any class in it (``pickle.UnpicklingError``); only a caller that
    reads sglang's ``fetch_state`` reply, which may carry transport objects, turns it off.
    ConnectionError when the peer closed instead."""
    (length,) = FRAME_HEADER.unpack(recv_exact(sock, FRAME_HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    data = recv_exact(sock, length)
    return PlainUnpickler(io.BytesIO(data)).load() if plain else pickle.loads(data)


def request(
    socket_path: str, message: Any, timeout: float = REQUEST_TIMEOUT_S, plain: bool = True, owner_only: bool = True
) -> Any:
    """One request on its own connection, as sglang's clients do; returns the reply."""
    return send_request(socket_path, message, timeout, plain, owner_only).read()


class SentRequest:
    """A request sent on its own connection, its reply not read yet: the sender may work while the
    daemon answers. ``read`` waits for the reply and closes the connection (once, even on an error)."""

    def __init__(self, sock: socket.socket, plain: bool) -> None:
        self._sock: socket.socket | None = sock
        self._plain = plain

    def read(self) -> Any:
        sock, self._sock = self._sock, None
        if sock is None:
            raise ConnectionError("this request's reply was already read")
        with sock:
            return recv_frame(sock, self._plain)


def send_request(
    socket_path: str, message: Any, timeout: float = REQUEST_TIMEOUT_S, plain: bool = True, owner_only: bool = True
) -> SentRequest:
    """``request``'s first half: connect and send now; ``read()`` the reply later."""
    sock = connect(socket_path, timeout, owner_only)
    try:
        send_frame(sock, message)
    except BaseException:
        sock.close()
        raise
    return SentRequest(sock, plain)


def attach(socket_path: str, engine_id: str, timeout: float = REQUEST_TIMEOUT_S) -> tuple[socket.socket, Any]:
    """``expert_layout_attach`` for ``engine_id`` on a connection of its own; returns that
    connection, still open (closing it detaches), and the reply. ``Attachment`` is the engine's form."""
    return _open_attachment(socket_path, attach_request(engine_id), timeout)


def _open_attachment(socket_path: str, attach_msg: dict[str, Any], timeout: float) -> tuple[socket.socket, Any]:
    sock = connect(socket_path, timeout)
    try:
        send_frame(sock, attach_msg)
        return sock, recv_frame(sock)
    except BaseException:
        sock.close()
        raise


_OPEN: weakref.WeakSet[Attachment] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


class Attachment:
    """An engine's attach connection to one daemon, closed in forked children; ``reply`` is the
    daemon's answer to the attach."""

    def __init__(self, path: str, attach_msg: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.path = path
        self._sock: socket.socket | None
        self._sock, self.reply = _open_attachment(path, attach_msg, timeout)
        # Nothing more is read or written: the connection only has to stay open.
        self._sock.settimeout(None)
        self.opened_at = time.monotonic()
        with _OPEN_LOCK:
            _OPEN.add(self)

    @property
    def open(self) -> bool:
        return self._sock is not None

    def notice(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message the daemon wrote on this connection (a parked standby's notice,
        ``layout_sm.messages.NOTICE``) within ``timeout`` seconds (None: until one comes), or None.
        ConnectionError when the daemon closed the connection."""
        sock = self._sock
        if sock is None:
            return None
        sock.settimeout(timeout)
        try:
            return recv_frame(sock)
        except (TimeoutError, BlockingIOError):
            return None
        finally:
            sock.settimeout(None)

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
