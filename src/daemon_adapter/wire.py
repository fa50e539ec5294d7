"""sglang's daemon framing for clients that must not import sglang (4-5 s and ~500 MB a process).

The frame is sglang's own: a 4-byte big-endian length, then a pickle (its ``send_msg`` and
``recv_msg``). The daemon itself and the engine plugin use sglang's functions; this module is
for the ``expert-layout`` CLI and for test, demo and bench processes.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import socket
import struct
import time
from typing import Any

FRAME_HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # sglang's MAX_MSG_SIZE

# What a layout-aware daemon accepts as one request (sglang's own requests included). A request
# is a small plain-data dict: sglang's fetch_state is about 1 KB, a full DeepSeek-V3-scale commit
# (61 x 288 rows) 36 KB and 17,904 pickle opcodes. The bounds keep what one request costs the
# daemon under 64 MB: at most 2**17 objects (the costliest, an empty set, is 216 bytes plus its
# stack slot: 32 MB measured) or 1 MiB of text (it can widen 4x in memory, and is held a few
# times over: the frame, the check, the request, sglang's own unpickling of it).
MAX_REQUEST_FRAME_BYTES = 1024 * 1024
MAX_REQUEST_OPCODES = 2**17
# Opcodes that only build plain data (no import, no call, no out-of-band buffer). Everything
# else (GLOBAL, REDUCE, BUILD, NEWOBJ, EXT*, PERSID, NEXT_BUFFER...) can run code or allocate
# without bound: list(itertools.repeat(0, 10**8)) is a 51-byte pickle.
PLAIN_DATA_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_DICT",
        "DICT",
        "SETITEM",
        "SETITEMS",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "GET",
        "BINGET",
        "LONG_BINGET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
    }
)
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a daemon reply never needs a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"reply contains {module}.{name}; a daemon reply is plain data")


def request_pickle_problem(data: bytes) -> str | None:
    """Why a request's pickle is refused before it is unpickled, or None when it is plain data
    within the bounds above. Reads the opcodes only (``pickletools``), builds nothing."""
    if len(data) > MAX_REQUEST_FRAME_BYTES:
        return f"a request of {len(data)} bytes exceeds the limit of {MAX_REQUEST_FRAME_BYTES}"
    count = 0
    try:
        for opcode, arg, pos in pickletools.genops(data):
            count += 1
            if count > MAX_REQUEST_OPCODES:
                return f"a request of more than {MAX_REQUEST_OPCODES} pickle opcodes exceeds the limit"
            if opcode.name not in PLAIN_DATA_OPCODES:
                return f"pickle opcode {opcode.name} at byte {pos} is not plain data (requests are plain dicts)"
            # The unpickler sizes its memo by the largest index: LONG_BINPUT 2**27 alone allocates 1 GB.
            if opcode.name in _MEMO_PUTS and not 0 <= int(arg) < MAX_REQUEST_OPCODES:
                return f"pickle memo index {arg} is out of range"
    except Exception as error:  # truncated, an unknown opcode, an int of too many digits...
        return f"not a pickle: {type(error).__name__}: {error}"
    return None


def connect(socket_path: str, timeout: float = 10.0) -> socket.socket:
    """Connect, retrying while the daemon's accept queue is full.

    sglang's daemon listens with a backlog of 8 and serves one connection at a time; on Linux a
    connect to a Unix socket with a full backlog fails at once with EAGAIN (``BlockingIOError``)
    when the socket has a timeout, instead of waiting. Many engines starting at once meet this.
    """
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
        except BaseException:
            sock.close()
            raise


def send_frame(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(FRAME_HEADER.pack(len(data)) + data)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, plain: bool = False) -> Any:
    """One frame; ``plain`` refuses any class in it. ConnectionError when the peer closed instead."""
    (length,) = FRAME_HEADER.unpack(recv_exact(sock, FRAME_HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    data = recv_exact(sock, length)
    return PlainUnpickler(io.BytesIO(data)).load() if plain else pickle.loads(data)


def request(socket_path: str, message: Any, timeout: float = 10.0, plain: bool = False) -> Any:
    """One request on its own connection, as sglang's clients do; returns the reply."""
    with connect(socket_path, timeout) as sock:
        send_frame(sock, message)
        return recv_frame(sock, plain)


def attach(socket_path: str, engine_id: str, timeout: float = 10.0) -> tuple[socket.socket, dict[str, Any]]:
    """``expert_layout_attach``; returns the open connection (closing it detaches) and the reply."""
    from layout_sm.messages import attach_request

    sock = connect(socket_path, timeout)
    try:
        send_frame(sock, attach_request(engine_id))
        return sock, recv_frame(sock)
    except BaseException:
        sock.close()
        raise
