"""``LayoutAwareDaemon``: sglang 0.5.23's ``WeightCacheDaemon`` with the expert-layout record.

The subclass adds the requests of DESIGN §4 to the daemon's control socket and the layout
check to ``fetch_state``. It decides nothing itself: every reply comes from
``layout_sm.daemon.DaemonMachine``; this module only moves bytes and threads.

How it binds to sglang, without copying sglang code:

- ``_handle_connection`` reads the request with sglang's own ``recv_msg`` through a
  recording wrapper of the connection. A layout request is answered here; any other
  request is replayed, byte for byte, into sglang's own ``_handle_connection``, so
  ``ping``, ``query_config`` and ``fetch_state`` behave exactly as before.
- ``fetch_state``: sglang's handler runs its config check and then calls
  ``transport_backend.send_fetch_state_response``. For that one call the backend is wrapped
  by a gate that asks the machine first (after the config check, before any handle is sent).
- ``expert_layout_attach``: sglang's serve loop closes every connection after
  ``_handle_connection`` returns, so the adapter keeps a ``dup()`` of it; a watcher thread
  reads it until EOF, which is the detach, however the engine died (SIGKILL included).
- The record comes from the initial ``ExpertLocationMetadata`` that
  ``_initialize_eplb_expert_location_metadata`` computes with ``--enable-eplb``.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from sglang.srt.weight_cache import daemon as sglang_daemon
from sglang.srt.weight_cache.protocol import recv_msg, send_msg

from layout_sm.daemon import DaemonMachine, DaemonView
from layout_sm.messages import (
    FETCH_FIELD,
    AttachRequest,
    FetchLayoutField,
    is_layout_request,
    parse_fetch_field,
    parse_request,
)
from layout_sm.reasons import Reply
from layout_sm.record import LayoutRecord, rows_of

logger = logging.getLogger(__name__)

# sglang's own request name; the adapter only routes on it.
FETCH_STATE = "fetch_state"
# Session tokens: 32 hex characters (128 bits) from the OS's CSPRNG.
SESSION_TOKEN_BYTES = 16
# How long one recv() on an attach connection waits before looping; only bounds how
# often the watcher wakes up, EOF is noticed at once.
WATCH_POLL_S = 30.0


class _RecordingConnection:
    """A connection whose ``recv`` keeps the bytes it returned.

    sglang's ``recv_msg`` reads the request through it; a request that is not a layout
    request is then replayed unchanged into sglang's own handler.
    """

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self.received = bytearray()

    def recv(self, bufsize: int, *flags: int) -> bytes:
        data = self._conn.recv(bufsize, *flags)
        self.received += data
        return data


class _ReplayConnection:
    """A connection that first returns ``already_read`` and then reads the real socket."""

    def __init__(self, conn: socket.socket, already_read: bytes) -> None:
        self._conn = conn
        self._unread = memoryview(already_read)

    def recv(self, bufsize: int, *flags: int) -> bytes:
        if self._unread:
            chunk, self._unread = bytes(self._unread[:bufsize]), self._unread[bufsize:]
            return chunk
        return self._conn.recv(bufsize, *flags)

    def __getattr__(self, name: str) -> Any:
        # sendall, sendmsg, fileno, settimeout...: the real socket.
        return getattr(self._conn, name)


class _LayoutGatedTransport:
    """sglang's transport backend with the layout check in front of its one sending call."""

    def __init__(self, backend: Any, check: Callable[[], Reply]) -> None:
        self._backend = backend
        self._check = check

    def send_fetch_state_response(self, conn: Any, **kwargs: Any) -> None:
        verdict = self._check()
        if verdict.ok:
            self._backend.send_fetch_state_response(conn, **kwargs)
        else:
            logger.warning("[LayoutAwareDaemon] %s", verdict)
            send_msg(conn, verdict.to_wire())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class LayoutAwareDaemon(sglang_daemon.WeightCacheDaemon):
    """sglang's weight cache daemon that keeps the expert-layout record (DESIGN §3, §4)."""

    # Class defaults so that a daemon made with ``object.__new__`` (tests) works too.
    _layout_machine: DaemonMachine | None = None
    _layout_lock: threading.Lock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Logged first, so that a spawned daemon says what it is even if loading then fails.
        logger.info("[LayoutAwareDaemon] building an expert-layout aware weight cache daemon")
        super().__init__(*args, **kwargs)

    # -- the record ---------------------------------------------------------------------

    def set_initial_layout(
        self, physical_to_logical_map: Sequence[Sequence[int]] | None = None, num_logical: int | None = None
    ) -> None:
        """Start the layout machine: a record of ``physical_to_logical_map`` (``[L][P]`` logical
        expert ids in ``0..num_logical-1``) at version 0, or no record when the map is None
        (a daemon started without ``--enable-eplb``). Raises ``LayoutError`` for a bad map."""
        record = None
        if physical_to_logical_map is not None:
            record = LayoutRecord.initial(rows_of(physical_to_logical_map), num_logical)  # type: ignore[arg-type]
        self._layout_lock = threading.Lock()
        self._layout_machine = DaemonMachine(record)
        if record is None:
            logger.info("[LayoutAwareDaemon gpu=%s] no expert-layout record (no --enable-eplb)", self.gpu_id)
        else:
            logger.info(
                "[LayoutAwareDaemon gpu=%s] expert-layout record: shape %s, %d logical experts, version 0, digest %s",
                self.gpu_id,
                list(record.shape),
                record.num_logical,
                record.digest,
            )

    def _initialize_eplb_expert_location_metadata(self, model_config: Any) -> None:
        super()._initialize_eplb_expert_location_metadata(model_config)
        # sglang sets the global metadata only with --enable-eplb (and only for MoE models);
        # what it computed is the layout the daemon's weights are loaded in.
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        metadata = get_global_expert_location_metadata()
        if metadata is None:
            self.set_initial_layout(None)
        else:
            self.set_initial_layout(metadata.physical_to_logical_map_cpu.tolist(), metadata.num_logical_experts)

    def layout_view(self) -> DaemonView:
        """A snapshot of the layout state (for tests and logs)."""
        machine, lock = self._machine()
        with lock:
            return machine.view()

    def _machine(self) -> tuple[DaemonMachine, threading.Lock]:
        if self._layout_machine is None or self._layout_lock is None:
            # load() always initialises it; a daemon that skipped it keeps no record.
            self.set_initial_layout(None)
        assert self._layout_machine is not None and self._layout_lock is not None
        return self._layout_machine, self._layout_lock

    # -- the control socket -------------------------------------------------------------

    def _handle_connection(self, conn: socket.socket) -> None:
        recorder = _RecordingConnection(conn)
        request = recv_msg(recorder)  # sglang's framing; errors close this one connection
        if not is_layout_request(request):
            self._handle_sglang_request(conn, request, bytes(recorder.received))
            return
        parsed = parse_request(request)
        if isinstance(parsed, Reply):
            send_msg(conn, parsed.to_wire())
            return
        if isinstance(parsed, AttachRequest):
            self._attach(conn, parsed)
            return
        machine, lock = self._machine()
        with lock:
            reply = machine.handle(parsed)
        send_msg(conn, reply.to_wire())

    def _handle_sglang_request(self, conn: socket.socket, request: object, frame: bytes) -> None:
        """sglang's own handler on the replayed request; ``fetch_state`` gets the layout gate."""
        replay = _ReplayConnection(conn, frame)
        if not (isinstance(request, dict) and request.get("type") == FETCH_STATE):
            super()._handle_connection(replay)  # type: ignore[arg-type]
            return
        claim = parse_fetch_field(request.get(FETCH_FIELD))
        backend = self.transport_backend
        self.transport_backend = _LayoutGatedTransport(backend, lambda: self._fetch_check(claim))
        try:
            super()._handle_connection(replay)  # type: ignore[arg-type]
        finally:
            self.transport_backend = backend

    def _fetch_check(self, claim: FetchLayoutField | Reply | None) -> Reply:
        if isinstance(claim, Reply):  # the field was malformed: parse_fetch_field's refusal
            return claim
        machine, lock = self._machine()
        with lock:
            return machine.fetch_check(claim)

    # -- attachments --------------------------------------------------------------------

    def _attach(self, conn: socket.socket, request: AttachRequest) -> None:
        # serve() closes conn when this returns; the dup keeps the engine's connection open.
        watched = conn.dup()
        session = secrets.token_hex(SESSION_TOKEN_BYTES)
        machine, lock = self._machine()
        with lock:
            reply = machine.handle(request, session=session)
        if reply.ok:
            # Watch before replying: an engine that dies before reading the reply still detaches.
            threading.Thread(
                target=self._watch_attachment,
                args=(watched, request.engine_id, session),
                name=f"expert-layout-attach-{request.engine_id}",
                daemon=True,
            ).start()
        else:
            watched.close()
        send_msg(conn, reply.to_wire())

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
            watched.close()
            machine, lock = self._machine()
            with lock:
                effect = machine.detach_engine(engine_id, session)
            level = logging.WARNING if effect.dirty is not None else logging.INFO
            logger.log(level, "[LayoutAwareDaemon gpu=%s] %s", self.gpu_id, effect.message)
