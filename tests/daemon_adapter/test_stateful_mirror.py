"""Hypothesis stateful test: random sequences of engine actions drive a real layout-aware
daemon process and, side by side, a ``layout_sm.DaemonMachine`` (the mirror). Every reply's
status and reason, and the daemon's whole reported state, must equal the mirror's: the
adapter translates and adds no rule of its own."""

from __future__ import annotations

import shutil
import socket
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tools.harness.daemon_proc import DaemonProcess, attach, request, start_daemon

from layout_sm.daemon import DaemonMachine
from layout_sm.messages import (
    AbortRequest,
    AttachRequest,
    BeginRequest,
    CommitRequest,
    FetchLayoutField,
    QueryRequest,
    abort_request,
    begin_request,
    commit_request,
    fetch_layout_field,
)
from layout_sm.record import LayoutRecord

from .conftest import INITIAL_MAP, NUM_LOGICAL
from .helpers import fetch_state, query, wait_for

ENGINES = ("A", "B", "C")
UNKNOWN_SESSION = "5" * 32
_daemon: DaemonProcess | None = None
_workdir = tempfile.mkdtemp(prefix="dA-sm-", dir="/tmp")


def shared_daemon() -> DaemonProcess:
    global _daemon
    if _daemon is None:
        _daemon = start_daemon(
            f"{_workdir}/sm.sock",
            physical_to_logical_map=INITIAL_MAP,
            num_logical=NUM_LOGICAL,
            log_path=f"{_workdir}/log",
        )
    return _daemon


def teardown_module() -> None:
    if _daemon is not None:
        _daemon.kill()
    shutil.rmtree(_workdir, ignore_errors=True)


def same(reply: dict, mirror_reply) -> None:
    if "entries" in reply:  # fetch_state served: sglang's own reply, it has no reason code
        assert reply["status"] == "ok" and mirror_reply.ok, (reply, str(mirror_reply))
        return
    assert (reply["status"], reply["reason"]) == (mirror_reply.status.value, mirror_reply.reason.value), (
        reply,
        str(mirror_reply),
    )


class DaemonAgainstMirror(RuleBasedStateMachine):
    @initialize()
    def fresh_daemon(self) -> None:
        self.daemon = shared_daemon()
        self.daemon.restart()
        self.path = self.daemon.socket_path
        # The daemon process has no model to repair from: auto repair is off (FakeLoadedLayoutAwareDaemon).
        self.mirror = DaemonMachine(LayoutRecord.initial(INITIAL_MAP, NUM_LOGICAL), auto_repair=False)
        self.conns: dict[str, socket.socket] = {}
        self.sessions: dict[str, str] = {}  # the last session each engine got (maybe stale)

    def teardown(self) -> None:
        for conn in self.conns.values():
            conn.close()

    def _session(self, engine: str, stale: bool) -> str:
        return UNKNOWN_SESSION if stale or engine not in self.sessions else self.sessions[engine]

    @rule(engine=st.sampled_from(ENGINES))
    def attach(self, engine: str) -> None:
        conn, reply = attach(self.path, engine)
        mirror_reply = self.mirror.handle(AttachRequest(engine), session=reply.get("session", UNKNOWN_SESSION)).reply
        same(reply, mirror_reply)
        if reply["status"] == "ok":
            self.conns[engine] = conn
            self.sessions[engine] = reply["session"]
            assert reply["record"] == self.mirror.view().record.to_wire(include_map=True)
        else:
            conn.close()

    @precondition(lambda self: bool(self.conns))
    @rule(data=st.data())
    def detach(self, data) -> None:
        engine = data.draw(st.sampled_from(sorted(self.conns)))
        self.conns.pop(engine).close()
        wait_for(lambda: engine not in query(self.path)["attached"], what=f"{engine}'s detach")
        self.mirror.detach_engine(engine, self.sessions[engine])

    @rule(
        engine=st.sampled_from(ENGINES),
        layers=st.lists(st.integers(min_value=-1, max_value=3), max_size=3),
        version_offset=st.sampled_from([0, 0, 0, 1]),
        stale=st.booleans(),
    )
    def begin(self, engine: str, layers: list[int], version_offset: int, stale: bool) -> None:
        base = self.mirror.view().record.version + version_offset
        session = self._session(engine, stale)
        reply = request(self.path, begin_request(engine, session, base, layers))
        same(reply, self.mirror.handle(BeginRequest(engine, session, base, tuple(layers))).reply)

    @rule(engine=st.sampled_from(ENGINES), expert=st.integers(min_value=0, max_value=NUM_LOGICAL), stale=st.booleans())
    def commit(self, engine: str, expert: int, stale: bool) -> None:
        pending = self.mirror.view().pending
        layers = list(pending.layers) if pending is not None else [0]
        rows = [[(expert + slot) % (NUM_LOGICAL + 1) for slot in range(6)] for _ in layers]  # sometimes out of range
        session = self._session(engine, stale)
        reply = request(self.path, commit_request(engine, session, layers, rows))
        same(reply, self.mirror.handle(CommitRequest(engine, session, tuple(layers), tuple(map(tuple, rows)))).reply)

    @rule(engine=st.sampled_from(ENGINES), stale=st.booleans())
    def abort(self, engine: str, stale: bool) -> None:
        session = self._session(engine, stale)
        same(
            request(self.path, abort_request(engine, session)), self.mirror.handle(AbortRequest(engine, session)).reply
        )

    @rule(engine=st.sampled_from((*ENGINES, None)), right_digest=st.booleans(), stale=st.booleans())
    def fetch(self, engine: str | None, right_digest: bool, stale: bool) -> None:
        record = self.mirror.view().record
        digest = record.digest if right_digest else "0" * 64
        if engine is None:  # an older engine: no expert_layout field
            same(fetch_state(self.path), self.mirror.fetch_check(None))
            return
        session = self._session(engine, stale)
        reply = fetch_state(self.path, fetch_layout_field(engine, session, record.version, digest))
        same(reply, self.mirror.fetch_check(FetchLayoutField(engine, session, record.version, digest)))

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "mirror"):
            return
        state = query(self.path, include_map=True)
        expected = self.mirror.handle(QueryRequest(include_map=True)).reply.to_wire()
        assert state == expected


DaemonAgainstMirror.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
test_daemon_against_mirror = DaemonAgainstMirror.TestCase
