"""A clumsy or hostile local client against a real layout-aware daemon process (issue 13).

Each test names the rule it checks; each failed on the code before the change (see the issue's
note for the figures measured before and after).
"""

from __future__ import annotations

import itertools
import os
import pickle
import pickletools
import resource
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from tools.harness.daemon_proc import DaemonProcess, attach, connect, recv_frame, request

from daemon_adapter import daemon as daemon_module
from daemon_adapter.daemon import REQUEST_READ_TIMEOUT_S
from daemon_adapter.wire import MAX_REQUEST_OPCODES
from layout_sm.daemon import MAX_ATTACHMENTS

from .helpers import Engine, fetch_state, query, status_reason, wait_for


def _log(daemon: DaemonProcess) -> str:
    assert daemon.spec.log_path is not None
    with open(daemon.spec.log_path, errors="replace") as f:
        return f.read()


def _send_raw(socket_path: str, frame: bytes) -> object | None:
    """Send ``frame`` as it is; the reply, or None when the daemon closed without one."""
    with connect(socket_path) as sock:
        try:
            sock.sendall(frame)
            return recv_frame(sock, plain=True)
        except (ConnectionError, OSError):
            return None


def _framed(data: bytes) -> bytes:
    return struct.pack("!I", len(data)) + data


# -- 1: every frame gets a reply, or a close with one line -----------------------------------------


@pytest.mark.parametrize("payload", [[], [1, 2], 3, None, "expert_layout_query", b"x", 1.5])
def test_a_request_that_is_not_a_dict_is_refused_as_malformed(daemon: DaemonProcess, payload: object) -> None:
    reply = request(daemon.socket_path, payload, timeout=10)
    assert status_reason(reply) == ("refused", "malformed"), reply
    assert "expected a dict" in reply["message"]
    assert "Traceback" not in _log(daemon)


@pytest.mark.parametrize("payload", [{}, {"type": None}, {"type": "no_such_request"}, {"type": 7}])
def test_a_dict_without_a_known_type_gets_sglangs_own_error(daemon: DaemonProcess, payload: dict) -> None:
    reply = request(daemon.socket_path, payload, timeout=10)
    assert reply == {"status": "error", "message": f"Unknown request type: {payload.get('type')}"}


def test_an_sglang_request_its_handler_cannot_read_gets_an_error_reply_and_one_line(daemon: DaemonProcess) -> None:
    reply = request(daemon.socket_path, {"type": "fetch_state"}, timeout=10)  # no config: sglang raises
    assert reply["status"] == "error" and "KeyError" in reply["message"], reply
    log = _log(daemon)
    assert "Traceback" not in log
    assert sum("'fetch_state' request failed in sglang's handler" in line for line in log.splitlines()) == 1
    assert fetch_state(daemon.socket_path)["status"] == "ok"  # sglang's own request, unchanged


def test_bad_frames_are_answered_or_closed_with_one_line_each_and_no_traceback(daemon: DaemonProcess) -> None:
    cases = {
        b"\xff\xff": None,  # a truncated header: closed
        struct.pack("!I", 100) + b"abc": None,  # ends mid-frame: closed
        _framed(b"not a pickle"): "malformed",
        struct.pack("!I", 2**31): "malformed",  # larger than any request: refused unread
    }
    for frame, reason in cases.items():
        with connect(daemon.socket_path) as sock:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
            try:
                reply = recv_frame(sock, plain=True)
            except (ConnectionError, OSError):
                reply = None
        assert (reply if reply is None else reply["reason"]) == reason, (frame, reply)
    log = wait_for(lambda: _log(daemon) if _log(daemon).count(" WARNING ") >= len(cases) else None)
    assert log.count(" WARNING ") == len(cases) and "Traceback" not in log


# -- 2: an idle client holds no one up --------------------------------------------------------------


def test_a_ping_behind_ten_idle_clients_is_answered_within_3_s(daemon: DaemonProcess) -> None:
    idle = [connect(daemon.socket_path) for _ in range(10)]  # they connect and send nothing
    try:
        start = time.monotonic()
        assert request(daemon.socket_path, {"type": "ping"}, timeout=3.0) == {"status": "ok"}
        assert time.monotonic() - start < 3.0
        # and an engine's attach and fetch too
        engine = Engine(daemon.socket_path, "A")
        assert engine.attach()["status"] == "ok"
        assert fetch_state(daemon.socket_path)["status"] == "ok"
        engine.detach()
    finally:
        for sock in idle:
            sock.close()


def test_an_idle_client_is_closed_after_the_read_deadline_with_one_line(daemon: DaemonProcess) -> None:
    with connect(daemon.socket_path, timeout=REQUEST_READ_TIMEOUT_S + 10) as sock:
        start = time.monotonic()
        assert sock.recv(1) == b""  # closed by the daemon, no reply
        assert REQUEST_READ_TIMEOUT_S - 0.5 < time.monotonic() - start < REQUEST_READ_TIMEOUT_S + 5
    line = wait_for(lambda: [ln for ln in _log(daemon).splitlines() if "sent no complete request" in ln])
    assert len(line) == 1


# -- 3: no request makes the daemon allocate without bound -----------------------------------------


class _ListOfRepeat:
    """Pickles as ``list(itertools.repeat(0, n))``: a few dozen bytes that build 8n bytes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> tuple:
        return (list, (itertools.repeat(0, self.n),))


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


MEMORY_BOUND_MB = 64
HOSTILE_FRAMES = {
    # 51 bytes on the wire with its header: the frame (sglang's SafeUnpickler lets it through)
    "list(repeat(0, 10**8))": pickletools.optimize(pickle.dumps(_ListOfRepeat(10**8), protocol=3)),
    "ping with a list(repeat(0, 10**8)) field": pickle.dumps({"type": "ping", "x": _ListOfRepeat(10**8)}),
    "commit with list(repeat(0, 10**8)) rows": pickle.dumps(
        {"type": "expert_layout_commit", "rows": _ListOfRepeat(10**8)}
    ),
    "a memo index of 2**27 (LONG_BINPUT)": b"\x80\x05Nr\x00\x00\x00\x08.",
    "one opcode too many (empty sets)": b"\x80\x05(" + b"\x8f" * MAX_REQUEST_OPCODES + b"t.",
}


def test_no_frame_makes_the_daemon_allocate_more_than_the_bound(daemon: DaemonProcess) -> None:
    assert daemon.pid is not None
    before = _peak_rss_mb(daemon.pid)
    replies = {what: _send_raw(daemon.socket_path, _framed(data)) for what, data in HOSTILE_FRAMES.items()}
    # The worst frames within the bounds: the most objects (an empty set costs 216 bytes), and
    # text that widens in memory (ASCII with one character outside the BMP is 4 bytes a character).
    most_objects = b"\x80\x05(" + b"\x8f" * (MAX_REQUEST_OPCODES - 4) + b"t."
    widest_text = pickle.dumps({"type": "ping", "x": "a" * (1024 * 1024 - 100) + "\U0001f600"})
    replies["most objects"] = _send_raw(daemon.socket_path, _framed(most_objects))
    replies["widest text"] = _send_raw(daemon.socket_path, _framed(widest_text))
    grown = _peak_rss_mb(daemon.pid) - before
    assert grown < MEMORY_BOUND_MB, f"the daemon's peak memory grew by {grown:.0f} MB"
    for what, reply in replies.items():
        expected = {"status": "ok"} if what == "widest text" else ("refused", "malformed")
        got = reply if what == "widest text" or reply is None else status_reason(reply)
        assert got == expected, (what, reply)
    assert query(daemon.socket_path)["status"] == "ok"


def test_a_deepseek_scale_commit_still_passes(make_daemon: Callable[..., DaemonProcess]) -> None:
    from tools.bench.protocol import LOGICAL, deepseek_map

    rows = deepseek_map()
    daemon = make_daemon("deepseek", physical_to_logical_map=rows, num_logical=LOGICAL)
    engine = Engine(daemon.socket_path, "A")
    engine.attach()
    layers = list(range(len(rows)))
    assert status_reason(engine.begin(layers)) == ("ok", "begun")
    moved = [row[1:] + row[:1] for row in rows]
    reply = engine.commit(layers, moved)
    assert status_reason(reply) == ("ok", "committed") and reply["version"] == 1, reply
    engine.detach()


# -- 4: bad frames log a line each, rate-limited ---------------------------------------------------


def test_a_thousand_bad_frames_log_a_few_kilobytes(daemon: DaemonProcess) -> None:
    before = len(_log(daemon).encode())
    for _ in range(1000):
        _send_raw(daemon.socket_path, _framed(b"\xffnot a pickle"))
    assert request(daemon.socket_path, {"type": "ping"}) == {"status": "ok"}
    log = _log(daemon)
    grown = len(log.encode()) - before
    assert grown < 16 * 1024, f"1000 bad frames wrote {grown} bytes of log"
    assert "Traceback" not in log and "are counted, not logged" in log


# -- 5: attachments are bounded --------------------------------------------------------------------


def test_attachments_are_bounded_with_a_refusal_that_says_what_to_do(daemon: DaemonProcess) -> None:
    engines = [Engine(daemon.socket_path, f"E{i}") for i in range(MAX_ATTACHMENTS)]
    try:
        for engine in engines:
            assert engine.attach()["status"] == "ok"
        extra = Engine(daemon.socket_path, "one-too-many")
        reply = extra.attach()
        assert status_reason(reply) == ("busy", "too_many_attachments"), reply
        assert str(MAX_ATTACHMENTS) in reply["message"] and "expert-layout status" in reply["message"]
        extra.detach()
        engines[0].detach()
        wait_for(lambda: "E0" not in query(daemon.socket_path)["attached"])
        assert Engine(daemon.socket_path, "next").attach()["status"] == "ok"
    finally:
        for engine in engines:
            engine.detach()


# -- 6: an attachment and its watcher exist together -----------------------------------------------


def test_an_attach_that_cannot_get_its_thread_leaves_no_attachment(daemon: DaemonProcess) -> None:
    """The daemon's address space is capped just above its size, so a thread (an 8 MB stack)
    cannot start; then the cap is lifted. No engine may stay attached without a watcher: an attach
    answered in the serve loop whose watcher cannot start is detached at once (its engine got "ok",
    then EOF), one answered in a connection thread that cannot start is closed unanswered."""
    assert daemon.pid is not None
    soft, hard = resource.prlimit(daemon.pid, resource.RLIMIT_AS)
    with open(f"/proc/{daemon.pid}/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize")) * 1024
    outcomes = []
    held = []
    resource.prlimit(daemon.pid, resource.RLIMIT_AS, (size + 2**20, hard))
    try:
        # All held open at once: glibc reuses the stacks of threads that have ended (up to 40 MB
        # of them), so attachments made one after another could all run on cached stacks.
        for i in range(16):
            try:
                conn, reply = attach(daemon.socket_path, f"E{i}", timeout=10)
                outcomes.append(reply.get("status"))
                held.append(conn)
            except (ConnectionError, OSError):
                outcomes.append("closed")
    finally:
        resource.prlimit(daemon.pid, resource.RLIMIT_AS, (soft, hard))
        for conn in held:
            conn.close()  # the engines go away: their attachments, if recorded, must end
    log = _log(daemon)
    stopped = "closed" in outcomes or "cannot watch its connection" in log or "Traceback" in log
    assert stopped, f"the cap did not stop a thread: {outcomes}"
    wait_for(lambda: query(daemon.socket_path)["attached"] == [], timeout=5, what="no engine left attached")
    assert Engine(daemon.socket_path, "after").attach()["status"] == "ok"


def test_a_thread_that_does_not_run_is_given_up_and_never_runs_its_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """threading.Thread.start waits for its thread without a bound; a thread whose own start fails (out
    of memory) never runs, and sglang's serve loop would wait for good. The daemon's threads start
    through ``_start_thread``: it gives such a thread up after a bound, and a thread that runs after
    all then does nothing (the caller has already detached or closed what it was for)."""
    late: list[Callable[[], None]] = []
    monkeypatch.setattr(daemon_module, "THREAD_START_TIMEOUT_S", 0.05)
    ran: list[int] = []
    assert daemon_module._start_thread(ran.append, (1,)) is True  # a thread that runs
    wait_for(lambda: ran == [1], timeout=5, what="the thread's target ran")
    monkeypatch.setattr(daemon_module._thread, "start_new_thread", lambda bootstrap, args: late.append(bootstrap))
    assert daemon_module._start_thread(ran.append, (2,)) is False  # started, never running
    late[0]()  # it runs after all, once given up
    assert ran == [1]


# -- 7: launchers refuse abbreviated options -------------------------------------------------------


@pytest.mark.parametrize("abbreviated", ["--tp", "--gpu", "--ep-num-redundant"])
def test_the_launcher_refuses_an_abbreviated_option(short_tmp: str, abbreviated: str) -> None:
    """``--tp`` would be the daemon's ``--tp-rank``, ``--gpu`` its ``--gpu-id``, and
    ``--ep-num-redundant`` sglang's ``--ep-num-redundant-experts``."""
    env = dict(os.environ, SGLANG_PLUGINS="none")
    argv = ["--model-path", f"{short_tmp}/no-model", abbreviated, "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "daemon_adapter", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"option {abbreviated} is abbreviated" in proc.stderr, proc.stderr[-2000:]


# -- 8: the .ready file is owner-only --------------------------------------------------------------


def test_the_ready_file_is_owner_only(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(os.stat(daemon.spec.ready_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.socket_path).st_mode) == 0o600


def test_the_rate_limited_log_says_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from daemon_adapter.daemon import RateLimitedLog

    log = RateLimitedLog(logging.getLogger("test-rate-limited"), logging.WARNING, burst=5, window_s=0.5)
    with caplog.at_level(logging.WARNING, logger="test-rate-limited"):
        for i in range(30):
            log.log(f"bad frame {i}")
        time.sleep(0.6)
        log.log("x" * 1000)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 6
    assert "counted, not logged" in lines[4]
    assert lines[5].endswith("(25 lines like this were not logged before this one)") and len(lines[5]) < 500
