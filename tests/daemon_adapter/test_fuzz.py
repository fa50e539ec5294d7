"""Bad input, fuzzed: the daemon answers with a clear refusal or closes that one connection,
keeps serving the next client, and its record does not change.

Each case is one real connection to one real daemon process. The number of cases run is
printed (``-s``) and asserted.
"""

from __future__ import annotations

import pickle
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tools.harness.daemon_proc import connect, recv_frame, request, send_frame

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, query

LAYOUT_TYPES = [
    "expert_layout_attach",
    "expert_layout_query",
    "expert_layout_begin",
    "expert_layout_commit",
    "expert_layout_abort",
]
CLEAR_STATUSES = {"refused", "layout_refused", "error", "mismatch"}
PAYLOAD_CASES = 1500
FRAME_CASES = 600

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
layer_lists = st.one_of(
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=8),
    st.lists(st.integers(min_value=0, max_value=3), min_size=4097, max_size=4200),  # over the limit
    st.just(list(range(-5000, 0))),
    values,
)
row_lists = st.one_of(
    st.lists(st.lists(st.integers(min_value=-10, max_value=10), max_size=9), max_size=4),
    st.lists(st.integers(), max_size=4),
    st.just([[0] * 70000]),  # a row wider than any layout
    values,
)
sessions = st.one_of(st.text(max_size=40), st.just("0" * 32), values)
layout_requests = st.fixed_dictionaries(
    {"type": st.sampled_from(LAYOUT_TYPES)},
    optional={
        "engine_id": st.one_of(st.text(max_size=300), values),
        "session": sessions,
        "base_version": st.one_of(st.integers(min_value=-(2**64), max_value=2**64), values),
        "layers": layer_lists,
        "rows": row_lists,
        "include_map": values,
    },
)
fetch_requests = st.fixed_dictionaries(
    {"type": st.just("fetch_state")},
    optional={
        "config": values,
        "expert_layout": st.one_of(
            values,
            st.fixed_dictionaries(
                {},
                optional={"engine_id": values, "session": sessions, "version": values, "digest": st.text(max_size=70)},
            ),
        ),
    },
)
payloads = st.one_of(
    values,  # non-dict payloads, and dicts without a known type
    layout_requests,
    fetch_requests,
    st.dictionaries(st.just("type"), values, min_size=1),
)


class _NotAllowed:
    """A class sglang's SafeUnpickler refuses to load."""


frames = st.one_of(
    # truncated: the header promises more than is sent, then the client closes its side
    st.tuples(st.integers(min_value=1, max_value=2**20), st.binary(max_size=64)).map(
        lambda t: struct.pack("!I", t[0] + len(t[1])) + t[1]
    ),
    st.binary(max_size=3),  # a truncated header
    st.integers(min_value=256 * 1024 * 1024 + 1, max_value=2**32 - 1).map(lambda n: struct.pack("!I", n)),  # oversized
    st.binary(min_size=1, max_size=200).map(lambda b: struct.pack("!I", len(b)) + b),  # not a pickle
    st.just(pickle.dumps(_NotAllowed())).map(lambda b: struct.pack("!I", len(b)) + b),
)


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    import shutil
    import tempfile

    from tools.harness.daemon_proc import start_daemon

    from .conftest import NUM_LOGICAL

    path = tempfile.mkdtemp(prefix="dA-fuzz-", dir="/tmp")
    daemon = start_daemon(
        f"{path}/fuzz.sock", physical_to_logical_map=INITIAL_MAP, num_logical=NUM_LOGICAL, log_path=f"{path}/log"
    )
    # A live attachment that holds a real session, so that fuzzed requests meet a real owner.
    owner = Engine(daemon.socket_path, "owner")
    owner.attach()
    yield daemon
    owner.detach()
    daemon.kill()
    shutil.rmtree(path, ignore_errors=True)


counts = {"payload": 0, "frame": 0}


def _assert_still_serving_unchanged(socket_path: str) -> None:
    state = query(socket_path)
    assert (state["version"], state["digest"], state["phase"]) == (0, layout_digest(INITIAL_MAP), "clean")
    assert state["pending"] is None and state["dirty"] is None and state["non_following_seen"] is False
    assert "owner" in state["attached"]


def _send_payload(socket_path: str, payload: object) -> object | None:
    """The reply, or None when the daemon closed the connection without one."""
    try:
        return request(socket_path, payload, timeout=10)
    except (ConnectionError, OSError):
        return None


@settings(max_examples=PAYLOAD_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=payloads)
def test_fuzzed_payloads(fuzz_daemon, payload):
    counts["payload"] += 1
    if isinstance(payload, dict) and payload.get("type") == "fetch_state" and isinstance(payload.get("config"), dict):
        payload["config"]["tp_size"] = "no"  # never a matching config: a served older engine changes state
    if isinstance(payload, dict) and payload.get("type") == "expert_layout_attach":
        payload["engine_id"] = "owner"  # a fresh attach would only come and go; test the refusal
    reply = _send_payload(fuzz_daemon.socket_path, payload)
    if reply is not None:
        assert isinstance(reply, dict)
        if payload_is_query(payload) and reply.get("status") == "ok":
            assert reply["reason"] == "queried"
        else:
            assert reply.get("status") in CLEAR_STATUSES, reply
            assert isinstance(reply.get("message", reply.get("daemon_config")), (str, dict)), reply
    _assert_still_serving_unchanged(fuzz_daemon.socket_path)


def payload_is_query(payload: object) -> bool:
    return isinstance(payload, dict) and payload.get("type") == "expert_layout_query"


@settings(max_examples=FRAME_CASES, deadline=None, suppress_health_check=list(HealthCheck))
@given(frame=frames)
def test_fuzzed_frames(fuzz_daemon, frame):
    counts["frame"] += 1
    with connect(fuzz_daemon.socket_path) as sock:
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)  # truncated: the daemon sees EOF mid-frame
            reply = recv_frame(sock)
        except (ConnectionError, OSError):
            reply = None
    if reply is not None:
        assert isinstance(reply, dict) and reply.get("status") in CLEAR_STATUSES, reply
    _assert_still_serving_unchanged(fuzz_daemon.socket_path)


def test_fuzz_case_count():
    total = counts["payload"] + counts["frame"]
    print(f"\nfuzz cases run: {counts['payload']} payloads + {counts['frame']} frames = {total}")
    assert total >= 2000


def test_a_request_after_garbage_is_answered(fuzz_daemon):
    with connect(fuzz_daemon.socket_path) as sock:
        sock.sendall(b"\xff\xff\xff\xff")
    with connect(fuzz_daemon.socket_path) as sock:
        send_frame(sock, {"type": "ping"})
        assert recv_frame(sock) == {"status": "ok"}
