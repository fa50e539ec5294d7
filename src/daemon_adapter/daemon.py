"""``LayoutAwareDaemon``: sglang 0.5.23's ``WeightCacheDaemon`` with the expert-layout record.

The subclass adds the layout requests to the daemon's control socket and the layout
check to ``fetch_state``. It decides nothing itself: every reply comes from
``layout_sm.daemon.DaemonMachine``; this module only moves bytes and threads.

How it binds to sglang, without copying sglang code:

- sglang's serve loop accepts connections one at a time and calls ``_handle_connection``.
  A request already whole in the socket buffer (the usual case: clients send right after
  connecting) is answered there at once, an attach included. Any other connection goes to a
  thread of its own with a ``dup()`` (serve() closes its copy), so a client that connects and
  sends nothing holds no one else up. At most ``MAX_OPEN_CONNECTIONS`` are open at once; each
  must send its request within ``REQUEST_READ_TIMEOUT_S``.
- The request frame (sglang's framing) is checked before it is unpickled: at most
  ``wire.MAX_REQUEST_FRAME_BYTES``, plain-data pickle opcodes only, at most
  ``wire.MAX_REQUEST_OPCODES`` of them (``wire.request_pickle_problem``); then it is loaded
  by ``PlainRequestUnpickler``, a subclass of sglang's ``SafeUnpickler``. A layout request
  is answered here; any other dict goes to sglang's own ``_handle_connection`` (under one lock:
  sglang's handler still runs one request at a time), so ``ping``, ``query_config`` and
  ``fetch_state`` behave exactly as before, on frames already known to be bounded. sglang's
  handler reads its request through its module's ``recv_msg``, which the daemon hooks
  (``_recv_request``): it gets the request already read, and a frame is read and unpickled once,
  not twice (every other caller of that ``recv_msg`` reads as before).
- Every frame gets a reply, or a close with one rate-limited log line saying why; never a
  traceback (``layout_sm.messages`` says who answers what).
- ``fetch_state``: sglang's handler runs its config check and then calls
  ``transport_backend.send_fetch_state_response``. The daemon's backend is wrapped once, when
  sglang sets it, by a gate that asks the machine first (after the config check, before any handle
  is sent) about the claim the request came with, which its connection carries (``_ReadConnection``).
- ``expert_layout_attach``: once the machine has recorded the attachment and the engine has its
  reply, a watcher thread reads the connection until EOF, which is the detach, however the engine
  died (SIGKILL included): the connection's own thread, or one started right after the reply (an
  EOF that comes first is read when it starts; a watcher that cannot start detaches at once), so
  there is never a record without a watcher for longer than that start.
- ``serve``: sglang's, under umask 0o077, so its ``.ready`` file is owner-only like its socket.
- The record comes from the initial ``ExpertLocationMetadata`` that
  ``_initialize_eplb_expert_location_metadata`` computes with ``--enable-eplb``.
- The repair of a torn move (docs/protocol.md §4): the machine decides when a repair starts (the mover's EOF
  with auto repair, ``AUTO_REPAIR_ENV``; the operator's ``expert_layout_repair`` on a dirty daemon)
  and how it ends; ``layout_sm.repair`` what to reload; ``daemon_adapter.repair`` reloads it into
  ``self.model`` with sglang's loading, on a worker thread (auto repair) or in the operator's
  connection thread, whose reply then says what was done. The reload's end is the machine's
  ``repair_done`` (clean at the base version) or ``repair_failed`` (dirty, the reason kept).
- ``_init_distributed``: sglang's, or with ``START_ALONE_ENV`` sglang's on process groups that wait
  for no peer (``daemon_adapter.alone``), so a daemon started again beside its running set loads.
"""

from __future__ import annotations

import _thread
import contextlib
import io
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sglang.srt.utils.common import SafeUnpickler
from sglang.srt.weight_cache import daemon as sglang_daemon
from sglang.srt.weight_cache.protocol import send_msg

from daemon_adapter import wire
from daemon_adapter.alone import START_ALONE_ENV, groups_without_peers, start_alone_enabled
from daemon_adapter.client import FRAME_HEADER
from daemon_adapter.durable import CopyWriter, copy_path, read_at_start
from daemon_adapter.trace import DaemonTrace, trace_dir
from layout_sm.daemon import DaemonMachine, DaemonStep
from layout_sm.daemon_view import Detach, DetachEffect, Fetch, RepairDone, RepairFailed
from layout_sm.durable import CopyOwner, CopyRead, owner_digest
from layout_sm.messages import (
    ATTACH,
    FETCH_CLAIMS_FIELD,
    FETCH_FIELD,
    FETCH_HOOK_MISSING,
    PLUGIN_GAP_FIELD,
    REPAIR,
    AttachRequest,
    FetchLayoutField,
    QueryRequest,
    is_sglang_request,
    malformed_frame,
    notice_message,
    overloaded,
    parse_fetch_field,
    parse_plugin_gap,
    parse_request,
    sglang_failed,
)
from layout_sm.reasons import Reason, Reply
from layout_sm.record import LayoutRecord, rows_of
from layout_sm.repair import RepairPlan

logger = logging.getLogger(__name__)

# sglang's own request name; the adapter only routes on it.
FETCH_STATE = "fetch_state"
# Session tokens: 32 hex characters (128 bits) from the OS's CSPRNG.
SESSION_TOKEN_BYTES = 16
# Auto repair (spec: the constant Repairs) is on unless this is "0" (``python -m daemon_adapter
# --expert-layout-no-auto-repair`` sets it; an environment variable reaches the daemon children that
# sglang spawns, which get no options of ours).
AUTO_REPAIR_ENV = "SGLANG_EXPERT_LAYOUT_AUTO_REPAIR"


def auto_repair_enabled() -> bool:
    """Whether daemons started now repair a torn move by themselves (``AUTO_REPAIR_ENV``)."""
    return os.environ.get(AUTO_REPAIR_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def peer_pid(conn: socket.socket) -> int | None:
    """The process at the other end of a Unix socket (Linux ``SO_PEERCRED``); None where unknown."""
    try:
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, AttributeError, struct.error):
        return None
    return pid if pid > 0 else None


# How long one recv() on an attach connection waits before looping; only bounds how
# often the watcher wakes up, EOF is noticed at once.
WATCH_POLL_S = 30.0
# A connection must deliver its whole request within this time of being accepted, or it is
# closed. Reading happens in the connection's own thread, so a slow or idle client holds up no
# one else meanwhile; the bound only frees its thread. Clients send right after connecting
# (sglang's loader, the engine plugin, the CLI); 5 s covers a loaded 2-core machine and a
# second-long GC pause of a big engine process, and stays far below sglang's 30 s client timeout.
REQUEST_READ_TIMEOUT_S = 5.0
# Sending one reply. Only a reply larger than the socket buffer (a fetch_state of thousands of
# tensors) can block; a client that requests one and stops reading holds the serve loop (or
# sglang's handler lock) for at most this long.
REPLY_SEND_TIMEOUT_S = 5.0
# Connections read or answered at once (each a thread and a descriptor; attachments are counted
# apart, by layout_sm.daemon.MAX_ATTACHMENTS). When all are taken, sglang's serve loop waits up to
# REQUEST_READ_TIMEOUT_S for one, then refuses the connection with busy(overloaded).
MAX_OPEN_CONNECTIONS = 32
# How long sglang's serve loop waits for a thread it starts to run. threading.Thread.start waits
# without a bound, and a thread whose own start fails (out of memory: seen under a capped address
# space, "Exception ignored in thread started by ... MemoryError") never runs: the loop would wait
# for good and the daemon answer no one again.
THREAD_START_TIMEOUT_S = 2.0
# Bad frames: a line each, at most BAD_FRAME_LOG_BURST lines per BAD_FRAME_LOG_WINDOW_S.
BAD_FRAME_LOG_BURST = 20
BAD_FRAME_LOG_WINDOW_S = 10.0
MAX_LOG_LINE_CHARS = 400


class RateLimitedLog:
    """One log line per event, at most ``burst`` lines per ``window_s``: the last line a window
    allows says so, and the first line after a suppressed spell says how many were not logged.
    Lines are cut to ``MAX_LOG_LINE_CHARS``."""

    def __init__(self, log: logging.Logger, level: int, burst: int, window_s: float) -> None:
        self._logger, self._level, self._burst, self._window_s = log, level, burst, window_s
        self._lock = threading.Lock()
        self._window_start = float("-inf")
        self._in_window = 0
        self._suppressed = 0

    def log(self, line: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._window_start >= self._window_s:
                self._window_start, self._in_window = now, 0
            self._in_window += 1
            if self._in_window > self._burst:
                self._suppressed += 1
                return
            last_in_window = self._in_window == self._burst
            window_left = self._window_start + self._window_s - now
            suppressed, self._suppressed = self._suppressed, 0
        if len(line) > MAX_LOG_LINE_CHARS:
            line = line[: MAX_LOG_LINE_CHARS - 3] + "..."
        if suppressed:
            line += f" ({suppressed} lines like this were not logged before this one)"
        if last_in_window:
            line += f" (more lines like this in the next {window_left:.1f} s are counted, not logged)"
        self._logger.log(self._level, "%s", line)


_BAD_FRAME_LOG = RateLimitedLog(logger, logging.WARNING, BAD_FRAME_LOG_BURST, BAD_FRAME_LOG_WINDOW_S)


class PlainRequestUnpickler(SafeUnpickler):
    """sglang's ``SafeUnpickler`` that loads no class at all: a request is plain data.

    ``wire.request_pickle_problem`` has already refused any opcode that imports; this is the
    second line of that rule, in the unpickler itself."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} in a request: requests are plain data")


class _DeadlineReader:
    """``recv`` on a connection, within one deadline for all the calls together."""

    def __init__(self, conn: socket.socket, seconds: float) -> None:
        self._conn = conn
        self._deadline = time.monotonic() + seconds

    def recv(self, bufsize: int) -> bytes:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's deadline passed")
        self._conn.settimeout(remaining)
        return self._conn.recv(bufsize)


# How long sglang's serve loop waits for a request's first bytes before handing the connection to a
# thread of its own. A client sends right after it connects, but on a busy host its connect wakes the
# daemon first and the client is preempted before it sends, so that a request finds nothing buffered
# and pays a thread start (on a real server's rebalance, a good part of its requests did).
# Waiting this long takes them inline; an idle client holds the loop up this long at most.
FIRST_BYTES_WAIT_S = 0.002
# One read takes a usual request whole (a fetch_state or a one-layer commit is under 1 KiB); a larger
# one (a full-map commit is about 35 KiB) takes a second read of the rest.
_FIRST_READ_BYTES = 4096


def _take_buffered(conn: socket.socket, wait_s: float = 0.0) -> bytes | None:
    """What the connection has buffered, its first bytes waited for at most ``wait_s``: a whole frame
    (and anything sent after it, which no request needs), a part of one, or b"" (EOF); None when
    nothing came within ``wait_s``. The rest of a frame begun is taken without waiting."""
    conn.settimeout(0.0)  # with a timeout, Python polls before every read: only when nothing came yet
    try:
        taken = conn.recv(_FIRST_READ_BYTES)
    except BlockingIOError:
        if wait_s <= 0:
            return None
        conn.settimeout(wait_s)
        try:
            taken = conn.recv(_FIRST_READ_BYTES)
        except TimeoutError:
            return None
        conn.settimeout(0.0)
    missing = _missing(taken)
    if len(taken) >= FRAME_HEADER.size and 0 < missing <= wire.MAX_REQUEST_FRAME_BYTES:
        with contextlib.suppress(BlockingIOError):
            taken += conn.recv(missing)
    return taken


def _missing(taken: bytes) -> int:
    """How many more bytes the frame begun by ``taken`` needs: the rest of its header, else of its body."""
    if len(taken) < FRAME_HEADER.size:
        return FRAME_HEADER.size - len(taken)
    (length,) = FRAME_HEADER.unpack_from(taken)
    return FRAME_HEADER.size + length - len(taken)


def _start_thread(target: Callable[..., object], args: tuple[Any, ...]) -> bool:
    """Run ``target(*args)`` in a new thread; False, and ``target`` never runs, when the thread cannot
    start or does not run within ``THREAD_START_TIMEOUT_S`` (see there)."""
    lock, running = threading.Lock(), threading.Event()
    started: list[bool] = []  # True by the thread, or False by the caller who stopped waiting: whichever is first

    def bootstrap() -> None:
        with lock:
            if started:
                return
            started.append(True)
        running.set()
        target(*args)

    try:
        _thread.start_new_thread(bootstrap, ())
    except RuntimeError:  # the thread limit, or no memory for its stack
        return False
    if running.wait(THREAD_START_TIMEOUT_S):
        return True
    with lock:
        if not started:
            started.append(False)
        return started[0]


class _Slot:
    """One place among ``MAX_OPEN_CONNECTIONS``, held by one connection's thread; released once."""

    def __init__(self, slots: threading.BoundedSemaphore) -> None:
        self._slots: threading.BoundedSemaphore | None = slots

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.release()


def _is_attach(request: object) -> bool:
    return isinstance(request, dict) and request.get("type") == ATTACH


def _is_repair(request: object) -> bool:
    return isinstance(request, dict) and request.get("type") == REPAIR


@dataclass(frozen=True)
class _RequestFrame:
    """One request read from a connection: the request and its raw frame, or why not (with the
    reply to send, when the client may still read one)."""

    request: object = None
    raw: bytes = b""
    problem: str | None = None
    reply: Reply | None = None

    @classmethod
    def read(cls, conn: socket.socket, taken: bytes = b"") -> _RequestFrame:
        """The request of ``conn``, waiting for the rest of it (``REQUEST_READ_TIMEOUT_S``); ``taken``: its
        first bytes, already read off ``conn``. What is read is judged as ``of_taken`` judges it."""
        timed = _DeadlineReader(conn, REQUEST_READ_TIMEOUT_S)
        try:
            while not taken or (frame := cls.of_taken(taken)) is None:
                chunk = timed.recv(min(_missing(taken), 1 << 16))
                if not chunk:
                    return cls.ended(ConnectionError(f"connection closed after {len(taken)} bytes of its request"))
                taken += chunk
        except TimeoutError:
            return cls(problem=f"closed a connection that sent no complete request within {REQUEST_READ_TIMEOUT_S:g} s")
        except OSError as error:
            return cls(problem=f"closed a connection that could not be read ({error})")
        return frame

    @classmethod
    def of_taken(cls, taken: bytes) -> _RequestFrame | None:
        """The request in what a connection had buffered (``_take_buffered``): its request, or why not;
        None when only a part of it came yet."""
        if not taken:
            return cls.ended(ConnectionError(f"connection closed after 0 of {FRAME_HEADER.size} bytes"))
        if len(taken) < FRAME_HEADER.size:
            return None
        (length,) = FRAME_HEADER.unpack_from(taken)
        if length > wire.MAX_REQUEST_FRAME_BYTES:
            return cls.too_large(length)
        size = FRAME_HEADER.size + length
        if len(taken) < size:
            return None
        return cls.of(taken if len(taken) == size else taken[:size])

    @classmethod
    def too_large(cls, length: int) -> _RequestFrame:
        problem = f"a request of {length} bytes exceeds the limit of {wire.MAX_REQUEST_FRAME_BYTES}"
        return cls(problem=f"refused a request unread: {problem}", reply=malformed_frame(problem))

    @classmethod
    def ended(cls, error: ConnectionError) -> _RequestFrame:
        return cls(problem=f"closed a connection that ended before its request did ({error})")

    @classmethod
    def of(cls, frame: bytes) -> _RequestFrame:
        """The request of a whole frame (header and body), checked before it is unpickled."""
        body = frame[FRAME_HEADER.size :]
        problem = wire.request_pickle_problem(body)
        if problem is None:
            try:
                return cls(request=PlainRequestUnpickler(io.BytesIO(body)).load(), raw=frame)
            except Exception as error:  # any unpickling failure is the client's
                problem = f"not a pickle: {type(error).__name__}: {error}"
        return cls(problem=f"refused a request: {problem}", reply=malformed_frame(problem))


class _ReadConnection:
    """A connection whose request the adapter has read and checked: sglang's handler gets ``request``
    from the hooked ``recv_msg`` (``_recv_request``) instead of reading and unpickling the frame a
    second time; ``sent`` says whether a reply was started through it."""

    def __init__(
        self, conn: socket.socket, request: dict[str, Any], frame: bytes, fetch: tuple[Any, str | None] | None = None
    ) -> None:
        self.socket = conn
        self.request = request
        self._unread = frame  # replayed only to a recv_msg that is not the hooked one
        self.sent = False
        # A fetch_state's claim (``parse_fetch_field``) and plugin gap, for the gate's check.
        self.fetch = fetch

    def sendall(self, *args: Any) -> None:
        self.sent = True
        self.socket.sendall(*args)

    def sendmsg(self, *args: Any) -> int:
        self.sent = True
        return self.socket.sendmsg(*args)

    def recv(self, bufsize: int, *flags: int) -> bytes:
        if self._unread:
            chunk, self._unread = bytes(self._unread[:bufsize]), self._unread[bufsize:]
            return chunk
        return self.socket.recv(bufsize, *flags)

    def __getattr__(self, name: str) -> Any:
        # fileno, settimeout...: the real socket.
        return getattr(self.socket, name)


_sglang_recv_msg = sglang_daemon.recv_msg


def _recv_request(conn: Any) -> Any:
    """sglang's daemon module's ``recv_msg``, hooked (``_hook_sglang_read``): the request the adapter
    already read off a ``_ReadConnection``, under bounds stricter than sglang's (a frame of at most
    ``wire.MAX_REQUEST_FRAME_BYTES``, loaded by a subclass of sglang's ``SafeUnpickler``); sglang's own
    read for any other connection."""
    if type(conn) is _ReadConnection:
        return conn.request
    return _sglang_recv_msg(conn)


def _hook_sglang_read() -> None:
    """Point sglang's daemon module's ``recv_msg`` at ``_recv_request`` (idempotent). sglang's handler
    reads each request through that module global; a request is then read and unpickled once
    (a ``fetch_state`` reads its frame once instead of twice), and every other caller reads as before."""
    if sglang_daemon.recv_msg is not _recv_request:
        sglang_daemon.recv_msg = _recv_request


class _LayoutGatedTransport:
    """sglang's transport backend with the layout check in front of its one sending call: made once,
    when sglang sets the daemon's backend (``LayoutAwareDaemon.transport_backend``)."""

    def __init__(self, backend: Any, check: Callable[[Any, str | None], Reply]) -> None:
        self._backend = backend
        self._check = check
        self.name = backend.name  # sglang's handler logs it on every fetch_state

    def send_fetch_state_response(self, conn: Any, **kwargs: Any) -> None:
        fetch = conn.fetch if type(conn) is _ReadConnection else None
        if fetch is None:  # fail closed: only the daemon's own read knows the request's claim
            raise RuntimeError(
                "fetch_state reached sglang's handler without the layout-aware daemon's read of its request "
                "(LayoutAwareDaemon._handle_connection); not served"
            )
        verdict = self._check(*fetch)
        if verdict.ok:
            self._backend.send_fetch_state_response(conn, **kwargs)
        else:
            logger.warning("[LayoutAwareDaemon] %s", verdict)
            # sglang's loader prints only the reply's daemon_config on a refusal (ipc_loader.py:560-565,
            # "Daemon config mismatch!"): the reason goes there too, so an older engine's launcher sees it.
            send_msg(conn, {**verdict.to_wire(), "daemon_config": {"expert_layout_refused": verdict.message}})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class _TracedSends:
    """sglang's transport backend whose sends of handles are written to the trace first (under the
    gate, so a send the gate did not check is in the trace too)."""

    def __init__(self, backend: Any, served: Callable[[], None]) -> None:
        self._backend = backend
        self._served = served
        self.name = backend.name

    def send_fetch_state_response(self, conn: Any, **kwargs: Any) -> None:
        self._served()
        self._backend.send_fetch_state_response(conn, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class LayoutAwareDaemon(sglang_daemon.WeightCacheDaemon):
    """sglang's weight cache daemon that keeps the expert-layout record (README, "The protocol core")."""

    _layout_gate: _LayoutGatedTransport | None = None  # sglang's backend behind the gate (transport_backend)
    # The durable copy's writer runs on its own thread; a replay of the spec's behaviours on in-process
    # daemons writes at the behaviour's Persist steps instead (tests.model_based.daemon_hosts).
    copy_writes_by_itself = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Logged first, so that a spawned daemon says what it is even if loading then fails.
        logger.info("[LayoutAwareDaemon] building an expert-layout aware weight cache daemon")
        # No record until load() reads sglang's initial layout (set_initial_layout); a daemon
        # whose load() finds none (no --enable-eplb) keeps none.
        self._layout_lock = threading.Lock()
        self._layout_machine = DaemonMachine(loaded=False)
        self._slots = threading.BoundedSemaphore(MAX_OPEN_CONNECTIONS)
        self._sglang_lock = threading.Lock()  # sglang's handler, one request at a time as in its loop
        # The process of each live attachment whose attach said it sends claims (FETCH_CLAIMS_FIELD): a
        # fetch without a claim from one of them comes from an engine whose plugin attached but whose
        # fetch hooks sglang did not apply (FETCH_HOOK_MISSING).
        self._attached_pids: dict[str, int] = {}  # session -> pid
        # Each live attachment's connection, by engine id: a parked standby's notice is written there.
        self._attach_conns: dict[str, socket.socket] = {}
        self._notice_lock = threading.Lock()
        self._auto_repair = auto_repair_enabled()
        self._model_config: Any = None  # sglang's ModelConfig of load(), for a repair
        # The running reload's progress (daemon_adapter.repair.RepairProgress), for the status.
        self._repair_progress: Any = None
        self._trace: DaemonTrace | None = None  # the protocol trace (daemon_adapter.trace), when asked
        self._copy_writer: CopyWriter | None = None  # the durable copy's writer (daemon_adapter.durable)
        self._copy_read: CopyRead | None = None  # what the daemon made of its copy at its start
        _hook_sglang_read()
        super().__init__(*args, **kwargs)

    def serve(self) -> None:
        # sglang writes the .ready file (its pid and config) under the process umask, 0644 by
        # default; owner-only here, like the socket it binds under umask 0o177.
        old_umask = os.umask(0o077)
        try:
            super().serve()
        finally:
            os.umask(old_umask)

    # -- the record ---------------------------------------------------------------------

    def set_initial_layout(
        self,
        physical_to_logical_map: Sequence[Sequence[int]] | None = None,
        num_logical: int | None = None,
        durable: bool = False,
    ) -> None:
        """Start the layout machine: a record of ``physical_to_logical_map`` (``[L][P]`` logical
        expert ids in ``0..num_logical-1``) at version 0, or no record when the map is None
        (a daemon started without ``--enable-eplb``). Raises ``LayoutError`` for a bad map.
        ``durable``: start from the durable copy instead where it is whole (``read_copy``); only for a
        daemon whose memory holds no weights this adapter loads (its host loads them at the record)."""
        initial = None
        if physical_to_logical_map is not None:
            initial = LayoutRecord.initial(rows_of(physical_to_logical_map), num_logical)  # type: ignore[arg-type]
        read = self.read_copy(initial) if durable else None
        self.start_layout(initial, read)

    def copy_owner(self, initial: LayoutRecord) -> CopyOwner:
        """What this daemon's copy belongs to: its checkpoint, and its cache configuration (the fields of
        sglang's ``CacheConfig`` that are known before the load: the rank and the parallelism) with the
        initial layout it was started at (``--init-expert-location``: an operator who names another one
        starts a new record, and the copy of the old one is set aside)."""
        fields: dict[str, Any] = {
            name: getattr(self, name, None)
            for name in ("tp_size", "tp_rank", "pp_size", "pp_rank", "ep_size", "moe_dp_size", "quantization", "dtype")
        }
        fields["initial_layout"] = initial.digest
        with contextlib.suppress(Exception):  # sglang's groups, where they are up (not in a bare harness)
            from sglang.srt.runtime_context import get_parallel

            fields["moe_ep_rank"] = get_parallel().moe_ep_rank
        checkpoint = f"{getattr(self, 'model_path', '')}@{getattr(self, 'revision', None) or ''}"
        return CopyOwner(checkpoint, owner_digest(fields))

    def copy_file(self) -> Path | None:
        """This daemon's durable copy (``daemon_adapter.durable.copy_path``); None: the copy is off."""
        return copy_path(str(getattr(self, "socket_path", "")))

    def read_copy(self, initial: LayoutRecord | None) -> CopyRead | None:
        """What this daemon makes of its durable copy (None: the copy is off, or the daemon keeps no record)."""
        path = self.copy_file()
        if path is None or initial is None:
            return None
        return read_at_start(path, self.copy_owner(initial), initial)

    def start_layout(self, initial: LayoutRecord | None, read: CopyRead | None) -> None:
        """Start the layout machine at the copy's record where ``read`` found one whole (the weights are
        loaded at its map), else at ``initial``; then start the copy's writer."""
        record = read.record if read is not None and read.record is not None else initial
        traces = trace_dir()
        with self._layout_lock:
            machine = self._layout_machine
            machine.load_weights(record, auto_repair=self._auto_repair)
            if traces is not None:
                name = f"tp{getattr(self, 'tp_rank', 0)}-{Path(getattr(self, 'socket_path', 'daemon')).stem}"
                self._trace = DaemonTrace(traces, name)
                socket = str(getattr(self, "socket_path", ""))
                rows = None if record is None else record.rows
                num_logical = None if record is None else record.num_logical
                version = 0 if record is None else record.version
                copy = None if read is None else read.kind
                self._trace.start(rows, num_logical, self._auto_repair, socket, version=version, copy=copy)
                machine.observer = self._trace.step
        self._copy_read = read
        if record is None:
            logger.info("[LayoutAwareDaemon gpu=%s] no expert-layout record (no --enable-eplb)", self.gpu_id)
            return
        logger.info(
            "[LayoutAwareDaemon gpu=%s] expert-layout record: shape %s, %d logical experts, version %d, digest %s",
            self.gpu_id,
            list(record.shape),
            record.num_logical,
            record.version,
            record.digest,
        )
        if read is None:
            return
        if read.record is not None:
            logger.info(
                "[LayoutAwareDaemon gpu=%s] started from its durable copy at version %d", self.gpu_id, record.version
            )
        elif read.set_aside:
            logger.warning(
                "[LayoutAwareDaemon gpu=%s] durable copy not used (%s): %s; started at the initial layout, version 0",
                self.gpu_id,
                read.kind,
                read.why,
            )
        path = self.copy_file()
        assert path is not None, "a copy was read, so the copy is on"
        assert initial is not None, "a copy is read only for a daemon that keeps a record"
        self._copy_writer = CopyWriter(
            path,
            self.copy_owner(initial),
            self._layout_machine.view,
            self._layout_lock,
            read.record,
            self._copy_persisted,
        )
        if self.copy_writes_by_itself:
            self._copy_writer.start()

    def _copy_persisted(self, record: LayoutRecord) -> None:
        """The writer put ``record``'s copy in place (under the layout lock): the trace's ``persist``."""
        if self._trace is not None:
            self._trace.persisted(self._layout_machine.view())

    def durable_status(self) -> dict[str, Any]:
        """The durable copy as ``expert-layout status`` shows it (a daemon that keeps one): its file, the
        version it holds, what the daemon made of it at its start, and the last write's failure."""
        writer, read = self._copy_writer, self._copy_read
        assert writer is not None, "only a daemon that keeps a durable copy reports it"
        on_disk = writer.on_disk
        return {
            "enabled": True,
            "path": str(writer.path),
            "version": None if on_disk is None else on_disk.version,
            "digest": None if on_disk is None else on_disk.digest,
            "at_start": None if read is None else {"kind": read.kind, "why": read.why},
            "write_failure": writer.failure,
        }

    def _init_distributed(self, server_args: Any, model_config: Any) -> None:
        if not start_alone_enabled():
            super()._init_distributed(server_args, model_config)
            return
        from sglang.srt.platforms import current_platform

        logger.info(
            "[LayoutAwareDaemon gpu=%s tp_rank=%s] starting without its set's peers (%s): process groups "
            "of its rank and size that wait for no peer; it loads from disk at version 0",
            self.gpu_id,
            self.tp_rank,
            START_ALONE_ENV,
        )
        with groups_without_peers(current_platform.get_torch_distributed_backend_str()):
            super()._init_distributed(server_args, model_config)

    def _initialize_eplb_expert_location_metadata(self, model_config: Any) -> None:
        self._model_config = model_config
        super()._initialize_eplb_expert_location_metadata(model_config)
        # sglang sets the global metadata only with --enable-eplb (and only for MoE models);
        # what it computed is the layout the daemon's weights are loaded in.
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        metadata = get_global_expert_location_metadata()
        if metadata is None:
            self.set_initial_layout(None)
            return
        initial = LayoutRecord.initial(
            rows_of(metadata.physical_to_logical_map_cpu.tolist()), metadata.num_logical_experts
        )
        read = self.read_copy(initial)
        if read is not None and read.record is not None:
            # sglang loads the weights after this, at the global metadata's layout: at the copy's map.
            from sglang.srt.eplb.expert_location import ExpertLocationMetadata, set_global_expert_location_metadata
            from sglang.srt.runtime_context import get_parallel

            set_global_expert_location_metadata(
                ExpertLocationMetadata.init_by_mapping(
                    model_config, physical_to_logical_map=list(read.record.rows), moe_ep_rank=get_parallel().moe_ep_rank
                ),
                allow_overwrite=True,  # sglang's initial layout, just set by super(), gives way to the copy's
            )
        self.start_layout(initial, read)

    def _machine(self) -> tuple[DaemonMachine, threading.Lock]:
        return self._layout_machine, self._layout_lock

    # -- the control socket -------------------------------------------------------------

    def _handle_connection(self, conn: socket.socket) -> None:
        """Called by sglang's serial serve loop for each accepted connection.

        A client sends its request right after connecting, so it is usually in the socket buffer by
        the time the loop accepts it, or within ``FIRST_BYTES_WAIT_S``: it is answered here, at once
        (an attach too; its watcher thread starts after the reply). Otherwise, and for a repair
        (seconds), the connection goes to a thread of its own, so that a client slow to send holds no
        one else up for longer than that wait."""
        try:
            taken = _take_buffered(conn, FIRST_BYTES_WAIT_S)
        except OSError as error:
            self._log_bad_frame(f"closed a connection that could not be read ({error})")
            return
        frame = None if taken is None else _RequestFrame.of_taken(taken)
        # Nothing, or a part, came yet: the rest is read in the connection's thread. A repair takes
        # seconds: its thread reads it again from the bytes taken (a repair is rare; one path).
        if frame is None or (frame.problem is None and _is_repair(frame.request)):
            self._serve_in_thread(conn, taken or b"")
            return
        try:
            self._answer(conn, frame, None)  # an attach too: answered here, then watched by a thread
        except Exception as error:  # one line instead of sglang's traceback
            self._log_bad_frame(f"request failed: {type(error).__name__}: {error}")

    def _serve_in_thread(self, conn: socket.socket, taken: bytes) -> None:
        """``conn`` served in a thread of its own, its request read there (``taken``: its first bytes,
        already read off it; the whole request, for a repair)."""
        slots = self._slots
        # Waits at most the time an open connection may take to send its request.
        if not slots.acquire(timeout=REQUEST_READ_TIMEOUT_S):
            self._log_bad_frame(f"refused a connection: {MAX_OPEN_CONNECTIONS} connections already open")
            with contextlib.suppress(OSError):
                send_msg(conn, overloaded(MAX_OPEN_CONNECTIONS).to_wire())
            return
        slot = _Slot(slots)
        try:
            own = conn.dup()  # serve() closes conn when _handle_connection returns
        except OSError as error:  # the descriptor limit: nothing was recorded
            slot.release()
            self._log_bad_frame(f"closed a connection unanswered: cannot serve it ({error})")
            return
        if not _start_thread(self._serve_connection, (own, slot, taken)):  # nothing was recorded
            slot.release()
            own.close()
            self._log_bad_frame("closed a connection unanswered: cannot serve it (no thread started)")

    def _serve_connection(self, conn: socket.socket, slot: _Slot, taken: bytes) -> None:
        """One connection in its own thread: read its request, answer it, and for an attach that was
        recorded, watch the connection until EOF (the detach)."""
        try:
            self._answer(conn, _RequestFrame.read(conn, taken), slot)
        except Exception as error:  # one line instead of a traceback
            self._log_bad_frame(f"request failed: {type(error).__name__}: {error}")
        finally:
            slot.release()
            conn.close()

    def _answer(self, conn: socket.socket, frame: _RequestFrame, slot: _Slot | None) -> None:
        """Answer one request: a reply, or a close with one (rate-limited) log line. ``slot`` is
        given in a connection's own thread (None: in sglang's serve loop)."""
        conn.settimeout(REPLY_SEND_TIMEOUT_S)
        if frame.problem is not None:
            self._log_bad_frame(frame.problem)
            if frame.reply is not None:
                self._send(conn, frame.reply.to_wire())
            return
        if is_sglang_request(frame.request):
            with self._sglang_lock:
                self._handle_sglang_request(conn, frame.request, frame.raw)  # type: ignore[arg-type]
            return
        parsed = parse_request(frame.request)
        if isinstance(parsed, Reply):
            self._log_bad_frame(str(parsed))
            self._send(conn, parsed.to_wire())
            return
        machine, lock = self._machine()
        if not isinstance(parsed, AttachRequest):
            with lock:
                step = machine.handle(parsed)
            if step.answer_after_reload:  # the operator's repair: the reload's end is the answer
                step = self._reload(step)
            wired = step.reply.to_wire()
            progress = self._repair_progress
            if isinstance(parsed, QueryRequest) and progress is not None:
                wired["repair_progress"] = progress.to_wire()  # how far the reload is: status shows it
            if isinstance(parsed, QueryRequest) and self._copy_writer is not None:
                wired["durable"] = self.durable_status()  # the copy beside the memory's record: status shows it
            self._send(conn, wired)
            self._carry_out(step)
            return
        # An attach answered in sglang's serve loop (its frame came whole with the connection): that
        # loop closes ``conn`` when the handler returns, so the attachment keeps a dup, made before
        # anything is recorded (a descriptor limit records nothing).
        watched = conn if slot is not None else conn.dup()
        session = secrets.token_hex(SESSION_TOKEN_BYTES)
        with lock:
            reply = machine.handle(parsed, session=session).reply
        if not reply.ok:
            self._send(watched, reply.to_wire())
            if slot is None:
                watched.close()
            return
        # Recorded: it counts against MAX_ATTACHMENTS (the machine), not against the connections
        # waiting for a reply. A failed send (the engine died) ends in EOF, which the watcher reads.
        if slot is not None:
            slot.release()
        # From the record to its watcher, whatever fails (a thread that cannot start, memory) detaches
        # at once: never a record without a watcher. An EOF before the watcher reads is still there when it does.
        try:
            pid = peer_pid(watched) if frame.request.get(FETCH_CLAIMS_FIELD) is True else None  # type: ignore[union-attr]
            if pid is not None:
                self._attached_pids[session] = pid
            self._attach_conns[parsed.engine_id] = watched
            self._send(watched, reply.to_wire())
            # The engine has its reply; its watcher starts now.
            if slot is None and not _start_thread(self._watch_attachment, (watched, parsed.engine_id, session)):
                raise RuntimeError("no thread started")
        except Exception as error:
            self._log_bad_frame(
                f"detached engine {parsed.engine_id!r} at once: cannot watch its connection "
                f"({type(error).__name__}: {error})"
            )
            self._end_attachment(watched, parsed.engine_id, session)
            return
        if slot is not None:  # this thread is the attachment's watcher from here on
            self._watch_attachment(watched, parsed.engine_id, session)

    def _send(self, conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            send_msg(conn, reply)
        except OSError as error:  # gone, or not reading within REPLY_SEND_TIMEOUT_S
            self._log_bad_frame(f"reply not delivered: {type(error).__name__}: {error}")

    def _handle_sglang_request(self, conn: socket.socket, request: dict[str, Any], frame: bytes) -> None:
        """sglang's own handler on the request, already read (``frame``, its bytes, are off ``conn``):
        sglang gets it from the hooked ``recv_msg`` (``_recv_request``). ``fetch_state`` gets the layout gate.

        sglang's handler raises on a request it cannot read (a ``fetch_state`` without a config,
        say); the client then gets sglang's error shape, or a close if a reply had started."""
        fetch = None
        if request.get("type") == FETCH_STATE:
            claim = parse_fetch_field(request.get(FETCH_FIELD))
            fetch = (claim, self._plugin_gap(conn, request, claim))
        read = _ReadConnection(conn, request, frame, fetch)
        try:
            super()._handle_connection(read)  # type: ignore[arg-type]
        except Exception as error:
            reply = sglang_failed(request.get("type"), error)
            self._log_bad_frame(reply["message"])
            if not read.sent:
                self._send(conn, reply)

    def _plugin_gap(self, conn: socket.socket, request: dict[str, Any], claim: object) -> str | None:
        """What of the engine's layout plugin is missing: its own word, or a claimless attached process."""
        gap = parse_plugin_gap(request.get(PLUGIN_GAP_FIELD))
        if gap is None and claim is None and self._attached_pids:
            pid = peer_pid(conn)
            if pid is not None and pid in self._attached_pids.values():
                gap = FETCH_HOOK_MISSING
        return gap

    @property  # type: ignore[override]
    def transport_backend(self) -> Any:
        """sglang's transport backend, behind the layout gate (None until sglang sets one)."""
        return self._layout_gate

    @transport_backend.setter
    def transport_backend(self, backend: Any) -> None:
        # sglang sets it in __init__ (None) and in load(); the gate is made once, here.
        if backend is not None and trace_dir() is not None:  # under the gate: every send is traced
            backend = _TracedSends(backend, self._fetch_served)
        self._layout_gate = None if backend is None else _LayoutGatedTransport(backend, self._fetch_check)

    def _fetch_check(self, claim: FetchLayoutField | Reply | None, gap: str | None = None) -> Reply:
        if isinstance(claim, Reply):  # the field was malformed: parse_fetch_field's refusal
            return claim
        machine, lock = self._machine()
        with lock:
            return machine.handle(Fetch(claim, gap)).reply

    def _fetch_served(self) -> None:
        if self._trace is not None:
            self._trace.fetch_served()

    def _log_bad_frame(self, why: str) -> None:
        _BAD_FRAME_LOG.log(f"[LayoutAwareDaemon gpu={getattr(self, 'gpu_id', None)}] {why}")

    # -- attachments --------------------------------------------------------------------

    def _watch_attachment(self, watched: socket.socket, engine_id: str, session: str) -> None:
        """Read the attach connection until EOF (or a reset); then the engine is detached."""
        watched.settimeout(WATCH_POLL_S)
        try:
            while True:
                try:
                    if not watched.recv(4096):  # the engine sends nothing; anything is drained
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass  # reset by peer: gone just the same
        finally:
            self._end_attachment(watched, engine_id, session)

    def _end_attachment(self, watched: socket.socket, engine_id: str, session: str) -> None:
        """The attachment's connection is gone (its EOF): the engine is detached."""
        with self._notice_lock:
            if self._attach_conns.get(engine_id) is watched:
                del self._attach_conns[engine_id]
        watched.close()
        self._attached_pids.pop(session, None)
        machine, lock = self._machine()
        with lock:
            step = machine.handle(Detach(engine_id, session))
        effect = step.answer
        assert isinstance(effect, DetachEffect), "a detach answers with what it did"
        logger.log(effect.severity, "[LayoutAwareDaemon gpu=%s] %s", self.gpu_id, effect.message)
        self._carry_out(step)

    def _carry_out(self, step: DaemonStep) -> None:
        """What a step says to do once its answer is out: the notices, then its reload on a thread of
        its own (in this one when none starts: a repairing daemon with no reload running would stay so
        for good)."""
        self._notify(step.notify)
        if self._copy_writer is not None:
            self._copy_writer.wake()  # the step may have recorded a commit: the copy follows, off this path
        if step.reload is not None and not step.answer_after_reload and not _start_thread(self._reload, (step,)):
            self._reload(step)

    def _notify(self, engines: Any) -> None:
        """Write the notice on each parked standby's attach connection: no unparked engine is attached
        any more (the machine's ``notified``). A standby that is gone gets nothing (its EOF follows)."""
        for engine_id in engines:
            with self._notice_lock:
                conn = self._attach_conns.get(engine_id)
                if conn is None:
                    continue
                if self._trace is not None:
                    self._trace.notice_sent(engine_id)
                try:
                    send_msg(conn, notice_message())
                except OSError as error:
                    self._log_bad_frame(f"notice to {engine_id!r} not delivered: {type(error).__name__}: {error}")
            # The wall clock, to line the takeover's parts up across processes (engine_adapter.standby logs its own).
            logger.info(
                "[LayoutAwareDaemon gpu=%s] told the parked standby %r: no primary (at unix %.3f)",
                self.gpu_id,
                engine_id,
                time.time(),
            )

    # -- repair --------------------------------------------------------------------------

    def _reload(self, step: DaemonStep) -> DaemonStep:
        """Run the reload of ``step`` (sglang's loading of its plan's layers at its rows), then end it
        through the machine (``RepairDone``: clean at the plan's version; ``RepairFailed``: dirty, with
        why); that end's step is carried out here unless its answer is the asker's (``answer_after_reload``)."""
        plan = step.reload
        assert plan is not None, "a step without a reload has nothing to run"
        logger.warning(
            "[LayoutAwareDaemon gpu=%s] %s layers %s at version %d",
            self.gpu_id,
            "rejoining: reloading" if plan.rejoin else "repairing",
            list(plan.layers),
            plan.base_version,
        )
        try:
            ended: RepairDone | RepairFailed = self._reload_layers(plan)
        except Exception as error:  # the daemon must not stay repairing: it ends dirty, with why
            ended = RepairFailed(Reason.REPAIR_FAILED, f"{type(error).__name__}: {error}")
        machine, lock = self._machine()
        with lock:
            end = machine.handle(ended)
        level = logging.INFO if end.reply.ok else logging.WARNING
        logger.log(level, "[LayoutAwareDaemon gpu=%s] %s", self.gpu_id, end.reply)
        if step.answer_after_reload:
            return replace(end, answer_after_reload=True)
        self._carry_out(end)  # the repair's end tells the parked standbys
        return end

    def _reload_layers(self, plan: RepairPlan) -> RepairDone | RepairFailed:
        """sglang's loading of the plan's layers into ``self.model``: how it ended, as the machine takes
        it. Nothing here decides the phase."""
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.runtime_context import get_parallel

        from daemon_adapter.repair import ReloadFailed, ReloadRefused, RepairProgress, reload_routed_experts

        if self.model is None or self._model_config is None:
            return plan.failed(Reason.REPAIR_FAILED, "the daemon's model is not loaded")
        # The LoadConfig the daemon's load() builds (sglang daemon.py), for the loader's file discovery.
        load_config = LoadConfig(
            load_format=self.load_format, model_loader_extra_config=self.model_loader_extra_config, tp_rank=self.tp_rank
        )
        self._repair_progress = progress = RepairProgress()
        try:
            report = reload_routed_experts(
                self.model,
                self._model_config,
                load_config,
                plan.layers,
                plan.record.rows,
                get_parallel().moe_ep_rank,
                progress,
            )
        except ReloadRefused as error:
            return plan.failed(Reason.REPAIR_UNSUPPORTED, f"repair refused: {error}; nothing was written")
        except ReloadFailed as error:
            return plan.failed(Reason.REPAIR_FAILED, str(error))
        finally:
            self._repair_progress = None
        return plan.ended(report.to_wire())
