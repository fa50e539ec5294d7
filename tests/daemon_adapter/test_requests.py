"""Every request and reply of docs/protocol.md §4, over a real Unix socket to a real layout-aware
sglang daemon process (the adapter translates; layout_sm decides)."""

from __future__ import annotations

import re

from tools.harness.daemon_proc import default_cache_config, request

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP, NUM_LOGICAL
from .helpers import Engine, fetch_state, query, status_reason, wait_for

DIGEST0 = layout_digest(INITIAL_MAP)
NEW_ROW = [1, 0, 3, 2, 1, 0]


def test_attach_returns_an_unguessable_session_and_the_record(daemon):
    a, b = Engine(daemon.socket_path, "A"), Engine(daemon.socket_path, "B")
    reply_a, reply_b = a.attach(), b.attach()
    assert status_reason(reply_a) == status_reason(reply_b) == ("ok", "attached")
    assert re.fullmatch(r"[0-9a-f]{32}", a.session) and re.fullmatch(r"[0-9a-f]{32}", b.session)
    assert a.session != b.session
    assert reply_a["record"] == {
        "version": 0,
        "digest": DIGEST0,
        "num_logical": NUM_LOGICAL,
        "shape": [3, 6],
        "map": INITIAL_MAP,
    }
    assert reply_a["pending"] is None and reply_a["dirty"] is None
    # the same engine id while its attachment lives
    assert status_reason(Engine(daemon.socket_path, "A").attach()) == ("refused", "engine_id_in_use")


def test_query_reports_state_and_map_on_request(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    state = query(daemon.socket_path)
    assert status_reason(state) == ("ok", "queried")
    assert (state["version"], state["digest"], state["phase"]) == (0, DIGEST0, "clean")
    assert state["attached"] == ["A"] and state["non_following_seen"] is False
    assert state["map"] is None
    assert query(daemon.socket_path, include_map=True)["map"] == INITIAL_MAP


def test_detach_is_the_eof_of_the_attach_connection(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    a.detach()
    wait_for(lambda: query(daemon.socket_path)["attached"] == [], what="detach")
    assert query(daemon.socket_path)["phase"] == "clean"


def test_begin_commit_moves_the_record_to_the_next_version(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    assert status_reason(a.begin([1])) == ("ok", "begun")
    assert query(daemon.socket_path)["pending"] == {"engine_id": "A", "layers": [1], "base_version": 0}
    reply = a.commit([1], [NEW_ROW])
    expected = [INITIAL_MAP[0], NEW_ROW, INITIAL_MAP[2]]
    assert status_reason(reply) == ("ok", "committed")
    assert (reply["version"], reply["digest"]) == (1, layout_digest(expected))
    state = query(daemon.socket_path, include_map=True)
    assert (state["version"], state["map"], state["pending"]) == (1, expected, None)
    # the next move starts from the new version only
    assert status_reason(a.begin([0], base_version=0)) == ("refused", "stale_base_version")
    assert status_reason(a.begin([0], base_version=1)) == ("ok", "begun")


def test_begin_precedence_permanent_before_transient(daemon, make_daemon):
    a, b = Engine(daemon.socket_path, "A"), Engine(daemon.socket_path, "B")
    a.attach()
    # 1. the request itself, in order
    assert status_reason(a.begin([0], session="f" * 32)) == ("refused", "not_attached")
    assert status_reason(a.begin([], session="f" * 32)) == ("refused", "not_attached")
    assert status_reason(request(daemon.socket_path, {"type": "expert_layout_begin", "engine_id": "A"})) == (
        "refused",
        "malformed",
    )
    for bad_layers in ([], [0, 0], [3], [-1]):
        assert status_reason(a.begin(bad_layers)) == ("refused", "invalid_layers"), bad_layers
    # 2. state: stale base version beats "another engine is attached" (busy)
    b.attach()
    assert status_reason(a.begin([0], base_version=7)) == ("refused", "stale_base_version")
    # 3. transient
    assert status_reason(a.begin([0])) == ("busy", "other_engine_attached")
    b.detach()
    wait_for(lambda: query(daemon.socket_path)["attached"] == ["A"], what="B's detach")
    assert status_reason(a.begin([0])) == ("ok", "begun")
    # own move pending comes before the state checks; another engine's move is busy
    assert status_reason(a.begin([1], base_version=9)) == ("refused", "own_move_pending")
    c = Engine(daemon.socket_path, "C")
    c.attach()
    assert status_reason(c.begin([1])) == ("busy", "move_pending")
    assert status_reason(c.begin([1], base_version=3)) == ("refused", "stale_base_version")
    # no record (daemon without --enable-eplb): refused, permanent
    bare = make_daemon("bare", physical_to_logical_map=None)
    d = Engine(bare.socket_path, "D")
    assert d.attach()["record"] is None
    assert status_reason(d.begin([0])) == ("refused", "no_record")


def test_begin_refused_after_non_following_fetch(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    # an older engine (no expert_layout field) is served at version 0 ...
    assert fetch_state(daemon.socket_path)["status"] == "ok"
    assert query(daemon.socket_path)["non_following_seen"] is True
    # ... and from then on nobody may move experts under it
    assert status_reason(a.begin([0])) == ("refused", "non_following_seen")


def test_session_spoofing_and_stale_sessions_are_refused(daemon):
    a, b = Engine(daemon.socket_path, "A"), Engine(daemon.socket_path, "B")
    a.attach()
    assert status_reason(a.begin([2])) == ("ok", "begun")
    b.attach()
    # B cannot commit or abort A's move, with its own session or a guessed one
    for session in (b.session, "0" * 32):
        spoof = Engine(daemon.socket_path, "A")
        assert status_reason(spoof.commit([2], [NEW_ROW], session=session)) == ("refused", "not_attached")
        assert status_reason(spoof.abort(session=session)) == ("refused", "not_attached")
    assert status_reason(b.commit([2], [NEW_ROW])) == ("refused", "no_pending_move")
    assert query(daemon.socket_path)["pending"] == {"engine_id": "A", "layers": [2], "base_version": 0}
    assert status_reason(a.abort()) == ("ok", "aborted")
    # a stale session after re-attach
    old_session = a.session
    a.detach()
    wait_for(lambda: "A" not in query(daemon.socket_path)["attached"], what="A's detach")
    a.attach()
    assert a.session != old_session
    b.detach()
    wait_for(lambda: query(daemon.socket_path)["attached"] == ["A"], what="B's detach")
    assert status_reason(a.begin([0], session=old_session)) == ("refused", "not_attached")
    assert status_reason(a.begin([0])) == ("ok", "begun")


def test_abort_is_idempotent(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    assert status_reason(a.abort()) == ("ok", "nothing_to_abort")
    assert status_reason(a.begin([0, 2])) == ("ok", "begun")
    assert status_reason(a.abort()) == ("ok", "aborted")
    assert status_reason(a.abort()) == ("ok", "nothing_to_abort")
    state = query(daemon.socket_path)
    assert (state["version"], state["digest"], state["pending"], state["phase"]) == (0, DIGEST0, None, "clean")


def test_commit_with_bad_rows_is_refused_and_the_move_stays_pending(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    assert status_reason(a.begin([0, 1])) == ("ok", "begun")
    bad_commits = {
        "one row for two layers": ([0, 1], [NEW_ROW]),
        "short row": ([0, 1], [NEW_ROW, NEW_ROW[:5]]),
        "expert out of range": ([0, 1], [NEW_ROW, [0, 1, 2, 3, 4, 0]]),
        "negative expert": ([0, 1], [NEW_ROW, [0, 1, 2, 3, -1, 0]]),
        "other layers": ([0, 2], [NEW_ROW, NEW_ROW]),
    }
    for what, (layers, rows) in bad_commits.items():
        reply = a.commit(layers, rows)
        assert reply["status"] == "refused", what
        assert reply["reason"] in ("bad_rows", "layers_mismatch"), what
        assert query(daemon.socket_path)["pending"] == {"engine_id": "A", "layers": [0, 1], "base_version": 0}
    assert (
        request(
            daemon.socket_path,
            {
                "type": "expert_layout_commit",
                "engine_id": "A",
                "session": a.session,
                "layers": [0, 1],
                "rows": "not rows",
            },
        )["reason"]
        == "malformed"
    )
    state = query(daemon.socket_path)
    assert (state["version"], state["digest"], state["phase"]) == (0, DIGEST0, "pending")
    # and the same move still commits
    assert status_reason(a.commit([0, 1], [NEW_ROW, NEW_ROW])) == ("ok", "committed")


def test_fetch_state_layout_check(daemon):
    a = Engine(daemon.socket_path, "A")
    a.attach()
    served = a.fetch(0, DIGEST0)
    assert served["status"] == "ok" and "entries" in served and served["config"] == default_cache_config()
    assert query(daemon.socket_path)["non_following_seen"] is False
    # a digest that is not the daemon's
    refused = a.fetch(0, "0" * 64)
    assert status_reason(refused) == ("layout_refused", "digest_mismatch")
    assert "entries" not in refused
    # sglang's config check comes first: a mismatching engine gets sglang's own reply
    other_config = default_cache_config(tp_size=2)
    assert a.fetch(0, DIGEST0, config=other_config) == {"status": "mismatch", "daemon_config": default_cache_config()}
    # a malformed field is refused, naming the field
    malformed = fetch_state(daemon.socket_path, {"engine_id": "A"})
    assert status_reason(malformed) == ("layout_refused", "malformed")
    # mid-move: nobody is served
    assert status_reason(a.begin([1])) == ("ok", "begun")
    assert status_reason(a.fetch(0, DIGEST0)) == ("layout_refused", "move_pending")
    assert status_reason(fetch_state(daemon.socket_path)) == ("layout_refused", "move_pending")
    rows = [[2, 3, 0, 1, 2, 3]]
    assert status_reason(a.commit([1], rows)) == ("ok", "committed")
    new_digest = layout_digest([INITIAL_MAP[0], rows[0], INITIAL_MAP[2]])
    # after a move: the new digest is served, the old one and older engines are refused
    assert a.fetch(1, new_digest)["status"] == "ok"
    assert status_reason(a.fetch(0, DIGEST0)) == ("layout_refused", "digest_mismatch")
    assert status_reason(fetch_state(daemon.socket_path)) == ("layout_refused", "older_engine_after_move")
    # the right digest without a live attachment is served, and marks the daemon non-following
    stranger = Engine(daemon.socket_path, "S")
    stranger.session = "0" * 32  # never attached
    assert stranger.fetch(1, new_digest)["status"] == "ok"
    assert query(daemon.socket_path)["non_following_seen"] is True


def test_daemon_without_record_serves_as_sglang_does(make_daemon):
    bare = make_daemon("bare", physical_to_logical_map=None)
    assert fetch_state(bare.socket_path)["status"] == "ok"
    state = query(bare.socket_path)
    assert (state["phase"], state["has_record"], state["version"], state["digest"]) == ("no_record", False, None, None)


def test_existing_requests_answer_exactly_as_sglang_does(make_daemon):
    import torch

    tensors = {"w": torch.arange(6, dtype=torch.float32)}
    layout_aware = make_daemon("aware", tensors=tensors)
    plain = make_daemon("plain", tensors=tensors, plain_sglang=True)
    for msg in (
        {"type": "ping"},
        {"type": "query_config"},
        {"type": "no_such_request"},
        {"type": "fetch_state", "config": default_cache_config(tp_rank=1)},
    ):
        assert request(layout_aware.socket_path, msg) == request(plain.socket_path, msg), msg
    aware_reply = fetch_state(layout_aware.socket_path)
    plain_reply = fetch_state(plain.socket_path)
    assert aware_reply.keys() == plain_reply.keys()
    assert aware_reply["entries"].keys() == plain_reply["entries"].keys() == {"w"}
    for key in ("status", "config", "transport_backend", "preloaded_weights_bytes"):
        assert aware_reply[key] == plain_reply[key]
    assert aware_reply["pid"] == layout_aware.pid
